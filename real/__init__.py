"""The real DiLoCo executor: runs a plan (plan.csv) on torch.distributed and traces it.

Never imports `simulator`: its inputs are files (plan.csv, a resolved scenario TOML) whose
schemas live in `formats/` (torch-free, shared with the simulator); importing `real` does not
import torch. Modules: config (scenario sections), options (how to execute), launch (processes
and rendezvous), process (one process's life), worker (a node: its parts, its round, the run),
rounds (the Round interface, the parts a round is handed, the one inner-step loop),
round_classic (DiLoCo), round_ddp (sync-ddp), round_streaming (Streaming DiLoCo's round and
communication thread), streaming (Streaming DiLoCo's settings, fragments, syncs.csv), groups
(process groups and a node's collectives), sync (cross-node average by payload and collective),
sharding (inside a node), diloco (arithmetic), data, checkpoint (a node's state, saving
in the background, resuming), ckpt_set (checkpoint sets on disk: digests, manifest), outdir (the
--out lock, stale files, disk space), supervise (the launcher watching its workers), trace (rows,
gathering, trace.csv), wan (the shaped WAN). Run it as
`python -m real --plan plan.csv --scenario scenario.toml --out DIR`.
"""
