"""Batched inputs of geodt's own strategies: numpy arrays with one row per scenario.

geodt's strategies (C-slowest, hybrid, network-aware, sync-ddp) decide from arrays, not from
Scenario objects, so that `geodt sweep` can decide thousands of scenarios at once with the
very same code that `make_plan` runs for one (a row is never influenced by the other rows:
every operation is elementwise or reduces within a row). `from_scenario` builds the arrays
of one scenario (S = 1) from its NodeTimings; the sweep builds them from catalog tables.

Batch candidates: b = 1 .. MAX_BATCH_FACTOR × the baseline batch, and only those that fit
in memory (`NodeTiming.fits`). The cap keeps the per-node batch within a factor 16 of the
recipe's (its learning rate was tuned for b; much beyond that it would need re-tuning), and
on an affine t(b) = t0 + c·b the throughput left above 16·b is small when t0 is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibrate.catalog import get_gpu
from simulator.network import link_gbps
from simulator.scenario import PAYLOAD_BYTES

MAX_BATCH_FACTOR = 16


@dataclass(frozen=True)
class NodeTables:
    """Per scenario s and node i: t_i(b) for b = 1..B (inf where b does not fit), GPU count."""

    step_s: np.ndarray  # (S, n, B) float64
    gpus: np.ndarray  # (S, n) int64
    batch_size: int  # the baseline b
    local_steps: int  # the baseline H

    @property
    def batches(self) -> np.ndarray:
        return np.arange(1, self.step_s.shape[-1] + 1, dtype=np.int64)

    def baseline_samples(self) -> np.ndarray:
        """Samples per round of the baseline plan: Σ_i gpus_i × b × H, one value per scenario."""
        return self.gpus.sum(axis=1) * (self.batch_size * self.local_steps)

    def rows(self, index: np.ndarray) -> "NodeTables":
        return NodeTables(self.step_s[index], self.gpus[index], self.batch_size, self.local_steps)


@dataclass(frozen=True)
class NetTables:
    """What the outer sync costs depend on, per scenario; the rest is shared by all rows."""

    links_gbps: np.ndarray  # (S, n): each node's WAN link
    slowest_mem_gbs: np.ndarray  # (S,): the slowest GPU memory (outer step)
    params: float
    latency_ms: float
    payload_dtype: str  # the scenario's
    collective: str  # the scenario's

    def payload_bytes(self, dtype: str) -> float:
        return self.params * PAYLOAD_BYTES[dtype]


def batch_cap(batch_size: int) -> int:
    return MAX_BATCH_FACTOR * batch_size


def from_scenario(scenario, timings) -> tuple[NodeTables, NetTables]:
    """The arrays of one scenario (S = 1), from its timings: t_i(b) exactly as NodeTiming gives it."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    cap = batch_cap(b)
    step = np.full((1, len(timings), cap), np.inf)
    for i, timing in enumerate(timings):
        for batch in range(1, min(timing.max_batch(), cap) + 1):
            step[0, i, batch - 1] = timing.step_s(batch)
    gpus = np.array([[t.node.gpu_count for t in timings]], dtype=np.int64)
    slowest = min(get_gpu(k).memory_bandwidth_gbs for n in scenario.nodes for k in n.gpus)
    net = NetTables(links_gbps=np.array([link_gbps(scenario)], dtype=float),
                    slowest_mem_gbs=np.array([slowest], dtype=float),
                    params=scenario.model.param_count, latency_ms=scenario.network.latency_ms,
                    payload_dtype=scenario.network.payload_dtype, collective=scenario.network.collective)
    return NodeTables(step, gpus, b, h), net
