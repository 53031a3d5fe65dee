"""`sync-ddp`: synchronous data parallel over the WAN, the setting of papers 001 and 002.

Rule: H = 1, a gradient all-reduce after every step, and the global batch of the baseline
(G = Σ_i gpus_i × b samples per step) split across nodes in proportion to their speed. The
integer form of "in proportion to speed": per-GPU batches b_i (those that fit, up to 16× b)
with Σ_i gpus_i·b_i ≥ G and the least step time max_i t_i(b_i), every node doing at least
b_i = 1; the surplus above G is then taken back from the slowest nodes first, one per-GPU
sample at a time, so Σ_i gpus_i·b_i ends in [G, G + max gpus_i − 1].

The plan syncs every step: `rounds` = R × H rounds of one step each (the same samples as the
baseline's R rounds of H steps), each ending in the all-reduce of the gradients (the
scenario's collective and payload dtype; no outer optimizer step, the inner step already
applied the gradients). The barrier every step is what DDP does; with jitter on, each step's
slowest node sets the pace, which the engines reproduce because every step is a round.
"""
from __future__ import annotations

import numpy as np

from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables


def _batches_within(tables: NodeTables, time_s: np.ndarray) -> np.ndarray:
    """Per node, the largest fitting per-GPU batch with t_i(b) ≤ T, at least 1: (S, n)."""
    within = (tables.step_s <= time_s[:, None, None]) & np.isfinite(tables.step_s)
    width = within.shape[-1]
    largest = np.where(within.any(axis=2), width - within[:, :, ::-1].argmax(axis=2), 0)
    return np.maximum(largest, 1)


def sync_ddp_batches(tables: NodeTables) -> np.ndarray:
    """b_i (S, n) of the rule in the module docstring."""
    rows, n, width = tables.step_s.shape
    need = tables.gpus.sum(axis=1) * tables.batch_size
    candidates = np.sort(tables.step_s.reshape(rows, n * width), axis=1)  # every possible step time
    lo, hi = np.zeros(rows, dtype=np.int64), np.full(rows, n * width - 1, dtype=np.int64)
    while (lo < hi).any():  # the least candidate T at which the nodes' batches add up to G
        mid = (lo + hi) // 2
        time_s = np.take_along_axis(candidates, mid[:, None], axis=1)[:, 0]
        enough = (tables.gpus * _batches_within(tables, time_s)).sum(axis=1) >= need
        lo, hi = np.where(enough | (lo >= hi), lo, mid + 1), np.where(enough & (lo < hi), mid, hi)
    time_s = np.take_along_axis(candidates, lo[:, None], axis=1)[:, 0]
    batch = _batches_within(tables, time_s)
    surplus = (tables.gpus * batch).sum(axis=1) - need
    step_now = np.take_along_axis(tables.step_s, (batch - 1)[:, :, None], axis=2)[:, :, 0]
    order = np.argsort(-step_now, axis=1, kind="stable")  # slowest node first
    row = np.arange(rows)
    for k in range(n):
        i = order[:, k]
        g = tables.gpus[row, i]
        give = np.clip(np.minimum(batch[row, i] - 1, surplus // g), 0, None)
        batch[row, i] -= give
        surplus -= give * g
    return batch


def _note(d: dict, tables: NodeTables) -> str:
    rounds = int(np.ravel(d["rounds"])[0])
    return f"one step per round, {rounds} rounds; gradients all-reduced every step"


@register("sync-ddp",
          "no local steps: a gradient all-reduce every step, the global batch split by speed",
          note=_note, sync="gradients")
def strategy_sync_ddp(tables: NodeTables, net: NetTables) -> dict:
    """H = 1 and a gradient all-reduce every step; the baseline's global batch split by speed."""
    batch = sync_ddp_batches(tables)
    return {"batch": batch, "steps": np.ones_like(batch), "comm_s": net.allreduce_s(),
            "rounds": tables.rounds * tables.local_steps, "sync": "gradients", "fragments": 1, "delay": 0}
