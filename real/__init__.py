"""The real DiLoCo executor: runs a plan (plan.csv) on torch.distributed and traces it.

Never imports `simulator`: its inputs are files (plan.csv, a resolved scenario TOML) whose
schemas live in `formats/` (torch-free, shared with the simulator); importing `real` does not
import torch. Modules: config (scenario sections), launch (processes and rendezvous), worker
(a node's processes and loop), sync (cross-node average by payload and collective), diloco
(arithmetic), data, checkpoint, trace. Run it as `python -m real --plan plan.csv --scenario scenario.toml --out DIR`.
"""
