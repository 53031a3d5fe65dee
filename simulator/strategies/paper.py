"""The paper's strategies (docs/PAPERS.md 000, Table 2): baseline, A, B and C.

A and C scale by F_i, the node's MEAN spec TFLOPS in the paper's convention
(`facts.catalog.spec_tflops`: the figures the paper used for its GPUs), normalised by the
smallest node mean. B doubles the batch while it fits in memory. Both batch rules stay within
memory (`NodeTables.max_batch`): A's scaled batch is cut to the largest that fits, and B
doubles at most up to MAX_BATCH_FACTOR × b (the bound of every batch search in geodt; it also
ends the doubling where nothing bounds memory, e.g. a CPU profile without memory figures).
"""
from __future__ import annotations

import numpy as np

from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables, batch_cap, node_spec_tflops


def mean_spec_tflops(scenario, node) -> float:
    """F_i: mean spec TFLOPS of the node's GPUs, each GPU counted once (the paper's 'average performance')."""
    return node_spec_tflops(scenario, node)[0]


def normalized_speed(scenario, speed) -> list[float]:
    """speed(scenario, node) for every node, divided by the smallest."""
    values = [speed(scenario, node) for node in scenario.nodes]
    return [v / min(values) for v in values]


def _scaled(tables: NodeTables, value: int) -> np.ndarray:
    """round_half_up(value × F_i / min F) per node (S, n)."""
    f = tables.spec_mean_tflops
    return np.floor(value * (f / f.min(axis=1, keepdims=True)) + 0.5).astype(np.int64)


def _ones(tables: NodeTables) -> np.ndarray:
    return np.ones(tables.gpus.shape, dtype=np.int64)


@register("baseline",
          "DiLoCo as configured: every node H local steps at batch b, then a barrier and the sync")
def baseline(tables: NodeTables, net: NetTables) -> dict:
    """Every node: b = batch_size, H = local_steps."""
    ones = _ones(tables)
    return {"batch": ones * tables.batch_size, "steps": ones * tables.local_steps}


@register("A",
          "the paper's A: each node's batch scaled by its peak FLOPS over the slowest node's")
def strategy_a(tables: NodeTables, net: NetTables) -> dict:
    """b_i = round(b × F_i / min F), at most the largest batch that fits the node."""
    batch = np.minimum(_scaled(tables, tables.batch_size), np.maximum(tables.max_batch, 1))
    return {"batch": batch, "steps": _ones(tables) * tables.local_steps}


@register("B",
          "the paper's B: each node's batch the largest of b, 2b, 4b ... 16b its GPUs hold")
def strategy_b(tables: NodeTables, net: NetTables) -> dict:
    """b_i = the largest of b, 2b, 4b, … (up to 16b) that fits on every GPU of the node (b if none larger fits)."""
    b = tables.batch_size
    limit = np.minimum(tables.max_batch, batch_cap(b))
    batch = _ones(tables) * b
    while (grow := batch * 2 <= limit).any():  # at most log2(16) doublings
        batch = np.where(grow, batch * 2, batch)
    return {"batch": batch, "steps": _ones(tables) * tables.local_steps}


@register("C",
          "the paper's C: each node's local steps scaled by its peak FLOPS over the slowest node's")
def strategy_c(tables: NodeTables, net: NetTables) -> dict:
    """H_i = round(H × F_i / min F)."""
    return {"batch": _ones(tables) * tables.batch_size, "steps": _scaled(tables, tables.local_steps)}
