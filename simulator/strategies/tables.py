"""Batched inputs of the strategies: numpy arrays with one row per scenario.

Every strategy decides from arrays, not from Scenario objects, so that `geodt sweep` decides
thousands of scenarios at once with the very same code that `make_plan` runs for one (a row
is never influenced by the other rows: every operation is elementwise or reduces within a
row). `from_scenario` builds the arrays of one scenario (S = 1) from its NodeTimings; the
sweep builds them from catalog tables (`simulator.sweep.sweep.KindTables`), with the same floats.

Batch candidates: b = 1 .. MAX_BATCH_FACTOR × the baseline batch, and only those that fit
in memory (`NodeTiming.fits`). The cap keeps the per-node batch within a factor 16 of the
recipe's (its learning rate was tuned for b; much beyond that it would need re-tuning), and
on an affine t(b) = t0 + c·b the throughput left above 16·b is small when t0 is. Strategies
that scale the batch by a rule (A, B, measured-batch) may go beyond the cap, never beyond
`max_batch` (what fits), and ask `step_at` for the step time there.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from facts.catalog import get_gpu, spec_tflops
from formats.wire import PAYLOAD_BYTES
from simulator.models.network import (
    CodecCost,
    WireCost,
    codec_cost,
    link_gbps,
    outer_step_s,
    wire_bytes_s_raw,
    wire_cost,
)

MAX_BATCH_FACTOR = 16

# lookup(row index (S,), batch (S, n)) -> t_i(b) (S, n): the step time at any batch, fitting or not.
Lookup = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class NodeTables:
    """Per scenario s and node i: t_i(b) for b = 1..B (inf where b does not fit), GPU count."""

    step_s: np.ndarray  # (S, n, B) float64
    gpus: np.ndarray  # (S, n) int64
    batch_size: int  # the baseline b
    local_steps: int  # the baseline H
    rounds: int  # the scenario's outer rounds R
    max_batch: np.ndarray  # (S, n) int64: the largest batch that fits (bounded search)
    spec_mean_tflops: np.ndarray  # (S, n): F_i of strategies A and C (the paper's convention)
    spec_slowest_tflops: np.ndarray  # (S, n): the slowest GPU's figure (C-slowest)
    lookup: Lookup = field(compare=False, repr=False)
    row_index: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def batches(self) -> np.ndarray:
        return np.arange(1, self.step_s.shape[-1] + 1, dtype=np.int64)

    def baseline_samples(self) -> np.ndarray:
        """Samples per round of the baseline plan: Σ_i gpus_i × b × H, one value per scenario."""
        return self.gpus.sum(axis=1) * (self.batch_size * self.local_steps)

    def step_at(self, batch: np.ndarray) -> np.ndarray:
        """t_i(b_i) for a batch per node (S, n), inside or beyond the table, fitting or not."""
        rows = np.arange(len(self.gpus)) if self.row_index is None else self.row_index
        return self.lookup(rows, np.asarray(batch, dtype=np.int64))

    def rows(self, index: np.ndarray) -> NodeTables:
        parent = np.arange(len(self.gpus)) if self.row_index is None else self.row_index
        return NodeTables(self.step_s[index], self.gpus[index], self.batch_size, self.local_steps, self.rounds,
                          self.max_batch[index], self.spec_mean_tflops[index], self.spec_slowest_tflops[index],
                          self.lookup, parent[index])


@dataclass(frozen=True)
class NetTables:
    """What the outer sync costs depend on, per scenario; the rest is shared by all rows."""

    links_gbps: np.ndarray  # (S, n): each node's WAN link
    outer_step_s: np.ndarray  # (S,): the outer step's time (simulator.models.network.outer_step_s)
    params: float
    latency_ms: float
    payload_dtype: str  # the scenario's
    collective: str  # the scenario's
    # The scenario's [diloco] Streaming DiLoCo keys: what every strategy plans with unless it chooses.
    fragments: int = 1
    sync_delay_steps: int = 0
    fragment_alpha: float = 0.0
    fragment_pattern: str = "sequential"
    max_fragments: int = 1 << 20  # the model's layers (a fragment groups layers), if known
    codec: CodecCost = field(default_factory=CodecCost)  # encode/decode of the payload (the network profile's; none: 0)
    wire: WireCost = field(default_factory=WireCost)  # the links as measured on a shaped WAN (none: the byte count)

    def payload_bytes(self, dtype: str) -> float:
        return self.params * PAYLOAD_BYTES[dtype]

    def allreduce_s(self, dtype: str | None = None, collective: str | None = None, fragments=1) -> np.ndarray:
        """The all-reduce of 1/fragments of the payload per row, encoding and decoding included
        (default: the scenario's dtype and collective, the whole payload). fragments may be an
        array (S,)."""
        dtype, collective = dtype or self.payload_dtype, collective or self.collective
        parts = np.asarray(fragments, dtype=float)
        payload = self.payload_bytes(dtype) / parts
        wire_s = self.wire.seconds_raw(dtype, collective,
                                       wire_bytes_s_raw(collective, self.latency_ms, payload, self.links_gbps))
        return wire_s + self.codec.seconds_raw(dtype, collective, self.params / parts, self.links_gbps)

    def sync_s(self, fragments=None) -> np.ndarray:
        """comm_s of one outer sync per row: the all-reduce plus the outer step, of one fragment
        (1/fragments of the model; default the scenario's fragments: 1, the whole model)."""
        p = self.fragments if fragments is None else fragments
        return self.allreduce_s(fragments=p) + self.outer_step_s / np.asarray(p, dtype=float)


def fragment_keys(scenario) -> dict:
    """NetTables' Streaming DiLoCo fields from a scenario's [diloco] and model."""
    d, arch = scenario.diloco, scenario.model.arch
    keys = {"fragments": d.fragments, "sync_delay_steps": d.sync_delay_steps, "fragment_alpha": d.fragment_alpha,
            "fragment_pattern": d.fragment_pattern}
    if arch is not None:
        keys["max_fragments"] = arch.num_layers
    return keys


def batch_cap(batch_size: int) -> int:
    return MAX_BATCH_FACTOR * batch_size


def node_spec_tflops(scenario, node) -> tuple[float, float]:
    """(mean, slowest) spec TFLOPS of a node's GPUs, each GPU counted once (the paper's convention)."""
    figures = {key: spec_tflops(get_gpu(key), scenario.model.dtype) for key in node.gpus}
    mean = sum(count * figures[key] for key, count in node.gpus.items()) / node.gpu_count
    return mean, min(figures.values())


def from_scenario(scenario, timings) -> tuple[NodeTables, NetTables]:
    """The arrays of one scenario (S = 1), from its timings: t_i(b) exactly as NodeTiming gives it.

    Nodes that share a timing memo (same GPUs, step time, profiles: `timing.signature`) share
    one computed row, so 10,000 alike nodes cost about what one does."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    cap = batch_cap(b)
    n = len(timings)
    step = np.empty((1, n, cap))
    max_batch = np.empty((1, n), dtype=np.int64)
    spec = np.empty((2, 1, n))
    rows: dict[int, tuple] = {}
    for i, timing in enumerate(timings):
        key = id(timing.memo)
        if key not in rows:
            largest = timing.max_batch()
            row = np.full(cap, np.inf)
            for batch in range(1, min(largest, cap) + 1):
                row[batch - 1] = timing.step_s(batch)
            rows[key] = (row, largest, node_spec_tflops(scenario, timing.node))
        step[0, i], max_batch[0, i], (spec[0, 0, i], spec[1, 0, i]) = rows[key]
    gpus = np.array([[t.node.gpu_count for t in timings]], dtype=np.int64)

    def lookup(_rows: np.ndarray, batch: np.ndarray) -> np.ndarray:
        return np.array([[timings[i].step_s(int(v)) for i, v in enumerate(r)] for r in batch], dtype=float)

    net = NetTables(links_gbps=np.array([link_gbps(scenario)], dtype=float),
                    outer_step_s=np.array([outer_step_s(scenario, [t.layout for t in timings])], dtype=float),
                    params=scenario.model.param_count, latency_ms=scenario.network.latency_ms,
                    payload_dtype=scenario.network.payload_dtype, collective=scenario.network.collective,
                    codec=codec_cost(scenario), wire=wire_cost(scenario), **fragment_keys(scenario))
    return NodeTables(step, gpus, b, h, scenario.training.rounds, max_batch, spec[0], spec[1], lookup), net
