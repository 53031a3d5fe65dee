"""Strategies from t_i(b) itself (profiles where measured, else the catalog estimate).

They balance what the nodes really take per step, not their datasheets. Both keep the
slowest node (largest t_i(b) at the baseline batch) at the baseline b and H, so the round
is never longer than the baseline's, and round so that no other node becomes slower.
"""
from __future__ import annotations

import numpy as np

from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables

EPS = 1e-12


def _at_baseline(tables: NodeTables) -> np.ndarray:
    return tables.step_at(np.full(tables.gpus.shape, tables.batch_size, dtype=np.int64))


@register("measured-steps",
          "each node the most whole steps that end before the slowest node, from measured step times")
def measured_steps(tables: NodeTables, net: NetTables) -> dict:
    """H_i = floor(H × t_slow(b) / t_i(b)): the most whole steps that end no later than the slowest node."""
    b, h = tables.batch_size, tables.local_steps
    at_b = _at_baseline(tables)
    target = h * at_b.max(axis=1, keepdims=True)
    steps = np.maximum(1, np.floor(target / at_b + EPS).astype(np.int64))
    return {"batch": np.full(at_b.shape, b, dtype=np.int64), "steps": steps}


def largest_batch_within(tables: NodeTables, target_s: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per node, the largest b in [lo, hi] with t(b) <= target_s (t increasing in b); lo if none.

    A bisection on all nodes at once: about log2(hi) lookups of t_i(b)."""
    lo, hi = lo.copy(), hi.copy()
    ok = tables.step_at(lo) <= target_s * (1 + EPS)
    hi = np.where(ok, hi, lo)
    while (hi > lo).any():
        mid = (lo + hi + 1) // 2
        within = tables.step_at(np.where(hi > lo, mid, lo)) <= target_s * (1 + EPS)
        lo, hi = np.where((hi > lo) & within, mid, lo), np.where((hi > lo) & ~within, mid - 1, hi)
    return lo


@register("measured-batch",
          "each node the largest batch that fits and steps no slower than the slowest node")
def measured_batch(tables: NodeTables, net: NetTables) -> dict:
    """b_i = the largest batch that fits in memory with t_i(b_i) <= t_slow(b); H unchanged."""
    b, h = tables.batch_size, tables.local_steps
    target = _at_baseline(tables).max(axis=1, keepdims=True)
    lo = np.full(tables.gpus.shape, b, dtype=np.int64)
    batch = largest_batch_within(tables, np.broadcast_to(target, lo.shape), lo, np.maximum(b, tables.max_batch))
    return {"batch": batch, "steps": np.full(lo.shape, h, dtype=np.int64)}
