"""The real DiLoCo executor: runs a plan (plan.csv) on torch.distributed and traces it.

Never imports `simulator`: its inputs are files (plan.csv, a resolved scenario TOML) whose
schemas live in `formats/` (torch-free, shared with the simulator); importing `real` does not
import torch. Run it as `python -m real --plan plan.csv --scenario scenario.toml --out DIR`.

Rooms, bottom up; an arrow runs down only (tests/test_imports.py REAL_ROOMS):

- core/: what every round is made of: config (the scenario sections it reads), options (how to
  execute; run_collective, sleep_until), data, diloco (the arithmetic), streaming (Streaming
  DiLoCo's settings, fragments, syncs.csv), sync (cross-node average by payload and collective),
  sharding (inside a node), groups (process groups and a node's collectives).
- rounds/: the kinds of round: rounds (the Round interface, the parts a round is handed, the one
  inner-step loop), round_classic (DiLoCo), round_ddp (sync-ddp), round_streaming,
  round_async and round_quorum (no barrier; round_server, what they share), adaptive
  (rebalance / deadline), trace (rows, gathering, trace.csv), state (a node's state in one object,
  what checkpoints and membership work on). Imports core/.
- checkpoint/: checkpoint (a node's checkpointer: its state saved in the background, resumed; an
  async or quorum cut), ckpt_set (checkpoint sets on disk: digests, manifest). Imports core/ and rounds/.
- membership/: who is in the run: members (the policy the round loop consults: fixed, or
  `--on-node-loss continue`), membership (the epochs, joins and admissions in the store), inject
  (faults at exact points). Imports core/, rounds/ and checkpoint/.
- wan/: the shaped WAN (network namespaces, shaped links, liveness); imports nothing of real/,
  and only process/ imports it.
- process/: the processes, at the top: worker (a node: its parts, its round, the run), process
  (one process's life), launch (processes and rendezvous), supervise (the launcher watching its
  workers), respawn (the launcher under continue), outdir (the --out lock, stale files, disk
  space), cli (`python -m real`, __main__.py). Imports every room below.
"""
