"""The real DiLoCo executor: runs a plan (plan.csv) on torch.distributed and traces it.

Never imports `simulator`: its inputs are files (plan.csv, a resolved scenario TOML) whose
schemas live in `formats/` (torch-free, shared with the simulator); importing `real` does not
import torch. Modules: config (scenario sections), launch (processes and rendezvous), process
(one process's life), worker (a node's rounds, one inner-step loop for every kind), groups
(process groups and a node's collectives), sync (cross-node average by payload and collective),
streaming (Streaming DiLoCo's fragments), diloco (arithmetic), data, checkpoint (a node's state,
saving in the background, resuming), ckpt_set (checkpoint sets on disk: digests, manifest),
outdir (the --out lock, stale files, disk space), supervise (the launcher watching its workers),
trace (rows, gathering, trace.csv). Run it as
`python -m real --plan plan.csv --scenario scenario.toml --out DIR`.
"""
