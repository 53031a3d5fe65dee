"""The tiny scenario the real-executor fault tests run (tiny model, seq 16, fp32, warm-up 1 step)."""
from __future__ import annotations


def tiny_scenario(name: str, rounds: int, network: str = "", diloco: str = "") -> str:
    """A scenario TOML of `rounds` rounds; `network` and `diloco`: extra lines of those tables."""
    return (f'name = "{name}"\nseed = 0\n[model]\npreset = "tiny"\nseq_len = 16\ndtype = "fp32"\n'
            f"[training]\nrounds = {rounds}\n" + (f"[network]\n{network}" if network else "")
            + f"[diloco]\nwarmup_steps = 1\n{diloco}")
