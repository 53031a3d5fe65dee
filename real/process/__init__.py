"""real.process: the processes of a run, at the top of real/.

worker (a node: its parts, its kind of round, the run), process (one process's life and exit
status), launch (starting the processes: spawned locally or under torchrun), supervise and respawn
(the local launcher watching its workers, restarting one under continue), outdir (the --out
directory before any process starts) and cli (`python -m real`). Imports every other room.
"""
