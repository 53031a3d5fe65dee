"""The analytic path for synchronous rounds: the same arithmetic as the SimPy engine, vectorised.

Round r starts at s_r; node i finishes at s_r + c[r, i]; the barrier opens at the latest
finish; every node then syncs for comm_s; s_{r+1} = barrier_r + comm_s. Additions happen in
the same order as SimPy's clock, so both paths agree to rounding. A checkpoint after each
sync (ckpt_s, the same on every node: each writes the same state) delays the next round.
"""
from __future__ import annotations

import numpy as np


def run_analytic(compute: np.ndarray, comm_s: float, ckpt_s: float = 0.0) -> dict[str, np.ndarray]:
    """Arrays (rounds × nodes) of compute_s, idle_s, comm_s, round_start_s, round_end_s."""
    rounds, n = compute.shape
    start = np.empty(rounds)
    now = 0.0
    slowest = compute.max(axis=1)
    for r in range(rounds):  # a scalar recurrence: rounds is small next to nodes
        start[r] = now
        now = (now + slowest[r]) + comm_s
        if ckpt_s:
            now = now + ckpt_s
    finish = start[:, None] + compute
    barrier = start + slowest
    idle = barrier[:, None] - finish
    end = np.broadcast_to((barrier + comm_s)[:, None], compute.shape)
    return {"compute_s": compute, "idle_s": idle, "comm_s": np.full(compute.shape, comm_s),
            "round_start_s": np.broadcast_to(start[:, None], compute.shape), "round_end_s": end}
