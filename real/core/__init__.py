"""real.core: what every round of a run is made of, below the rounds themselves.

config (the scenario sections the executor reads), options (how a plan is executed, and the
helpers every process shares: run_collective, sleep_until), data (the training data), diloco
(DiLoCo's arithmetic), streaming (Streaming DiLoCo's fragments, delay and merge), sync (the
cross-node average), sharding (FSDP2 inside a node) and groups (the process groups). Core imports
nothing else of real/.
"""
