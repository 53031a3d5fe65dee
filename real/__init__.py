"""The real DiLoCo executor: runs a plan (plan.csv) on torch.distributed and traces it.

Never imports `simulator`: its inputs are files (plan.csv, a resolved scenario TOML).
Run it as `python -m real --plan plan.csv --scenario scenario.toml --out DIR`.
"""
