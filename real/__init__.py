"""The real DiLoCo executor: runs a plan (plan.csv) on torch.distributed and traces it.

Never imports `simulator`: its inputs are files (plan.csv, a resolved scenario TOML). The
plan schema, real/plan.py, is torch-free and shared with the simulator; so is this package
file (importing `real` or `real.plan` does not import torch). Modules: plan (schema),
config (scenario sections), launch (processes and rendezvous), worker (a node's processes and
loop), sync (cross-node average by payload and collective), diloco (arithmetic), data,
checkpoint, trace. Run it as `python -m real --plan plan.csv --scenario scenario.toml --out DIR`.
"""
