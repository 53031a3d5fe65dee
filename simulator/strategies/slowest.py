"""`C-slowest`: the paper's C with each node's speed taken from its SLOWEST GPU.

Rule: H_i = round(H × S_i / min S), S_i = the smallest spec TFLOPS among node i's GPUs
(`facts.catalog.spec_tflops`, the paper's convention, as C uses), rounding halves up.
Why: the GPUs of a node run data-parallel and every inner step waits for the slowest of
them, so a node with 3× RTX 2080 Ti and 1× TITAN RTX runs at the 2080 Ti's pace, not at the
mean of the four (the paper's node 2 was its slowest node although its mean was not).
"""
from __future__ import annotations

import numpy as np

from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables


def c_slowest_steps(speed: np.ndarray, local_steps: int) -> np.ndarray:
    """H_i = floor(H × speed_i / min speed + 1/2) for speed (S, n); the same arithmetic as C."""
    scale = speed / speed.min(axis=-1, keepdims=True)
    return np.floor(local_steps * scale + 0.5).astype(np.int64)


@register("C-slowest",
          "C with each node priced by its slowest GPU's datasheet TFLOPS")
def strategy_c_slowest(tables: NodeTables, net: NetTables) -> dict:
    """H_i = round(H × S_i / min S), S_i the slowest GPU's spec TFLOPS; b unchanged."""
    batch = np.full(tables.gpus.shape, tables.batch_size, dtype=np.int64)
    return {"batch": batch, "steps": c_slowest_steps(tables.spec_slowest_tflops, tables.local_steps)}
