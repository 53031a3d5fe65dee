"""What-if sweeps: node mixes from the catalog × bandwidths × strategies, decided in bulk.

A sweep scenario is the base scenario (model, training, latency, collective, payload dtype:
`paper` unless told) with its nodes replaced by a mix of node kinds and its bandwidth set.
A node kind is K GPUs: one type (homogeneous nodes) or any multiset of the given types
(`--mixed-nodes`). The mixes are every multiset of N kinds when mixes × bandwidths fit in
`samples`, else a seeded sample of ⌈samples / bandwidths⌉ distinct mixes (nodes drawn
independently and uniformly from the kinds), each at every bandwidth.

The fast path decides a chunk of scenarios at once. Step times come from per-GPU-type
tables computed with `simulator.timing.gpu_step_s` on the base scenario, combined exactly as
`NodeTiming` does (slowest GPU, then the intra-node all-reduce), so the floats are the same
ones `make_plan` sees. The paper's strategies and the measured ones are re-expressed in
numpy with the same arithmetic; geodt's own strategies run their own batched code. Rounds
are deterministic, so the metrics are closed forms of the plan (the analytic engine's
sums, in another order: they agree with `simulate` to rounding, and the plans agree
exactly; tests/test_sweep.py checks both on a handful of scenarios).

Metrics per scenario × strategy (the whole simulated run; R = the plan's rounds):
  round_s = max_i compute_i + comm_s;  wall_s = R × round_s
  idle_s = R × Σ_i (max_j compute_j − compute_i);  idle_floor_s = R × Σ_i t_i(b_i)
  utilization = Σ_i compute_i / (n × round_s);  tokens = R × Σ_i H_i·b_i·gpus_i·seq_len
  idle_s_equal_tokens = idle_s × baseline tokens / tokens (the idle of as many tokens as the
  baseline trains); idle_left = that / the baseline's idle_s; speedup = tokens_per_s / baseline's.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

from calibrate.catalog import get_gpu
from simulator.network import outer_step_raw, partitioned_allreduce_raw, ring_allreduce_raw
from simulator.scenario import NetworkConfig, NodeConfig, Scenario
from simulator.strategies import STRATEGIES, round_half_up
from simulator.strategies.hybrid import hybrid_decide
from simulator.strategies.measured import EPS
from simulator.strategies.network_aware import COLLECTIVES, network_aware_decide
from simulator.strategies.paper import mean_spec_tflops
from simulator.strategies.slowest import c_slowest_steps, slowest_spec_tflops
from simulator.strategies.sync_ddp import sync_ddp_batches
from simulator.strategies.tables import NetTables, NodeTables, batch_cap
from simulator.timing import NodeTiming, gpu_step_s, intra_node_allreduce_s

Kind = tuple[tuple[str, int], ...]  # ((gpu key, count), ...) in the order of --gpu-types


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep covers; saved as spec.json so that a rerun can resume it."""

    nodes: int
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    mixed_nodes: bool
    bandwidths_gbps: tuple[float, ...]
    strategies: tuple[str, ...]
    samples: int
    seed: int
    base: str = "paper"
    overrides: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def node_kinds(spec: SweepSpec) -> list[Kind]:
    """Homogeneous: one kind per GPU type; mixed: every multiset of K GPUs over the types."""
    k = spec.gpus_per_node
    if not spec.mixed_nodes:
        return [((key, k),) for key in spec.gpu_types]
    kinds = []
    for combo in itertools.combinations_with_replacement(spec.gpu_types, k):
        counts = Counter(combo)
        kinds.append(tuple((key, counts[key]) for key in spec.gpu_types if key in counts))
    return kinds


def kind_label(kind: Kind) -> str:
    return "+".join(f"{key}x{count}" for key, count in kind)


def choose_mixes(spec: SweepSpec, n_kinds: int) -> np.ndarray:
    """(M, N) kind indices: every multiset if it fits in the samples, else a seeded sample."""
    per_bw = max(1, math.ceil(spec.samples / len(spec.bandwidths_gbps)))
    total = math.comb(n_kinds + spec.nodes - 1, spec.nodes)
    if total <= per_bw:
        return np.array(list(itertools.combinations_with_replacement(range(n_kinds), spec.nodes)), dtype=np.int64)
    rng = np.random.default_rng(spec.seed)
    seen: dict[tuple, None] = {}
    while len(seen) < per_bw:
        draw = np.sort(rng.integers(0, n_kinds, size=(per_bw, spec.nodes)), axis=1)
        for row in map(tuple, draw.tolist()):
            seen.setdefault(row, None)
            if len(seen) == per_bw:
                break
    return np.array(list(seen), dtype=np.int64)


def scenario_grid(spec: SweepSpec, n_kinds: int) -> tuple[np.ndarray, np.ndarray]:
    """(kinds (S, N), bandwidth (S,)): every chosen mix at every bandwidth, mixes outer."""
    mixes = choose_mixes(spec, n_kinds)
    bws = np.asarray(spec.bandwidths_gbps, dtype=float)
    return np.repeat(mixes, len(bws), axis=0), np.tile(bws, len(mixes))


class KindTables:
    """Per node kind, what the strategies need, computed from the base scenario exactly as NodeTiming does."""

    def __init__(self, base: Scenario, kinds: list[Kind]):
        self.base, self.kinds = base, kinds
        b = base.training.batch_size
        single = {}
        for key in sorted({k for kind in kinds for k, _ in kind}):
            node = NodeConfig(name="x", gpus={key: 1})
            single[key] = NodeTiming(replace(base, nodes=(node,)), node)
        type_max = {key: t.max_batch() for key, t in single.items()}
        self.max_batch = np.array([min(type_max[key] for key, _ in kind) for kind in kinds], dtype=np.int64)
        self.types = tuple(single)
        self.width = 0
        self.ensure_width(int(max(batch_cap(b), b, self.max_batch.max())))
        self.gpus = np.array([sum(c for _, c in kind) for kind in kinds], dtype=np.int64)
        configs = [self.node_config(kind, "x") for kind in kinds]
        self.mean_tflops = np.array([mean_spec_tflops(base, node) for node in configs])
        self.slowest_tflops = np.array([slowest_spec_tflops(base, node) for node in configs])
        self.mem_gbs = np.array([min(get_gpu(key).memory_bandwidth_gbs for key, _ in kind) for kind in kinds])

    def ensure_width(self, width: int) -> None:
        """Make step_s[k, b - 1] = t_k(b) available for b = 1..width (strategy A may ask for large b)."""
        if width <= self.width:
            return
        base = self.base
        type_step = {key: np.array([gpu_step_s(base, key, batch) for batch in range(1, width + 1)])
                     for key in self.types}
        self.step_s = np.empty((len(self.kinds), width))
        for i, kind in enumerate(self.kinds):
            node = self.node_config(kind, "x")
            self.step_s[i] = np.max([type_step[key] for key, _ in kind], axis=0) + intra_node_allreduce_s(base, node)
        self.width = width

    @staticmethod
    def node_config(kind: Kind, name: str) -> NodeConfig:
        return NodeConfig(name=name, gpus=dict(kind))

    def scenario(self, kinds_row, bandwidth_gbps: float) -> Scenario:
        """The Scenario a sweep row stands for (what make_plan + simulate would be given)."""
        nodes = tuple(self.node_config(self.kinds[k], f"node{i + 1}") for i, k in enumerate(kinds_row))
        network = replace(self.base.network, bandwidth_gbps=float(bandwidth_gbps))
        scenario = replace(self.base, name="sweep", nodes=nodes, network=network)
        return scenario


def _net(kt: KindTables, kinds: np.ndarray, bw: np.ndarray) -> NetTables:
    base = kt.base
    return NetTables(links_gbps=np.broadcast_to(bw[:, None], kinds.shape).astype(float),
                     slowest_mem_gbs=kt.mem_gbs[kinds].min(axis=1), params=base.model.param_count,
                     latency_ms=base.network.latency_ms, payload_dtype=base.network.payload_dtype,
                     collective=base.network.collective)


def allreduce_raw(net: NetTables, dtype: str, collective: str) -> np.ndarray:
    payload = net.payload_bytes(dtype)
    if collective == "partitioned":
        return partitioned_allreduce_raw(net.latency_ms, payload, net.links_gbps)
    return ring_allreduce_raw(net.links_gbps.shape[1], net.latency_ms, payload, net.links_gbps.min(axis=1))


def decide(kt: KindTables, kinds: np.ndarray, bw: np.ndarray, strategy: str) -> dict:
    """The plans of one strategy for a chunk: batch, steps (S, n); comm_s (S,); rounds; collective; dtype."""
    base = kt.base
    b, h = base.training.batch_size, base.training.local_steps
    raw = kt.step_s[kinds]  # (S, n, W): t_i(b) whether or not b fits
    cap = batch_cap(b)
    masked = np.where(np.arange(1, cap + 1) <= kt.max_batch[kinds][:, :, None], raw[:, :, :cap], np.inf)
    tables = NodeTables(masked, kt.gpus[kinds], b, h)
    net = _net(kt, kinds, bw)
    ones = np.ones(kinds.shape, dtype=np.int64)
    out = {"rounds": base.training.rounds, "collective": base.network.collective, "dtype": base.network.payload_dtype}
    sync = lambda: allreduce_raw(net, base.network.payload_dtype, base.network.collective) + outer_step_raw(
        net.params, net.slowest_mem_gbs)
    at_b = raw[:, :, b - 1]
    if strategy == "baseline":
        out.update(batch=ones * b, steps=ones * h)
    elif strategy in ("A", "C"):
        scale = kt.mean_tflops[kinds] / kt.mean_tflops[kinds].min(axis=1, keepdims=True)
        scaled = np.floor((b if strategy == "A" else h) * scale + 0.5).astype(np.int64)
        out.update(batch=scaled if strategy == "A" else ones * b, steps=ones * h if strategy == "A" else scaled)
    elif strategy == "B":
        batch = ones * b
        fits = kt.max_batch[kinds]
        while (grow := batch * 2 <= fits).any():
            batch = np.where(grow, batch * 2, batch)
        out.update(batch=batch, steps=ones * h)
    elif strategy == "C-slowest":
        out.update(batch=ones * b, steps=c_slowest_steps(kt.slowest_tflops[kinds], h))
    elif strategy == "measured-steps":
        target = h * at_b.max(axis=1, keepdims=True)
        out.update(batch=ones * b, steps=np.maximum(1, np.floor(target / at_b + EPS).astype(np.int64)))
    elif strategy == "measured-batch":
        threshold = at_b.max(axis=1, keepdims=True)[:, :, None] * (1 + EPS)
        limit = np.maximum(b, kt.max_batch[kinds])[:, :, None]
        cols = np.arange(1, raw.shape[2] + 1)
        count = ((raw <= threshold) & (cols >= b) & (cols <= limit)).sum(axis=2)
        out.update(batch=np.maximum(b, b - 1 + count), steps=ones * h)
    elif strategy == "hybrid":
        batch, steps = hybrid_decide(tables)
        out.update(batch=batch, steps=steps)
    elif strategy == "sync-ddp":
        out.update(batch=sync_ddp_batches(tables), steps=ones, rounds=base.training.rounds * h,
                   comm_s=allreduce_raw(net, base.network.payload_dtype, base.network.collective))
    elif strategy == "network-aware":
        d = network_aware_decide(tables, net)
        out.update(batch=d["batch"], steps=d["steps"], comm_s=d["comm_s"],
                   collective=np.array(COLLECTIVES)[d["collective"]], dtype=d["dtype"])
    else:
        raise KeyError(strategy)
    if "comm_s" not in out:
        out["comm_s"] = sync()
    if out["batch"].max() > kt.width:
        kt.ensure_width(int(out["batch"].max()))
        raw = kt.step_s[kinds]
    out["step_s"] = np.take_along_axis(raw, (out["batch"] - 1)[:, :, None], axis=2)[:, :, 0]
    return out


def metrics(d: dict, gpus: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """The module docstring's metrics, per scenario, from one strategy's decisions."""
    rounds = d["rounds"]
    compute = d["steps"] * d["step_s"]
    slowest = compute.max(axis=1)
    round_s = slowest + d["comm_s"]
    tokens_per_round = (d["steps"] * d["batch"] * gpus).sum(axis=1) * seq_len
    n = compute.shape[1]
    return {"round_s": round_s, "wall_s": rounds * round_s, "comm_s": d["comm_s"] + 0 * round_s,
            "idle_s": rounds * (slowest[:, None] - compute).sum(axis=1),
            "idle_floor_s": rounds * d["step_s"].sum(axis=1),
            "utilization": compute.sum(axis=1) / (n * round_s),
            "tokens_per_round": tokens_per_round, "tokens": rounds * tokens_per_round,
            "tokens_per_s": rounds * tokens_per_round / (rounds * round_s)}


def chunk_frame(kt: KindTables, kinds: np.ndarray, bw: np.ndarray, strategies, first_id: int) -> pd.DataFrame:
    """Tidy rows (scenario × strategy) for one chunk of scenarios."""
    base = kt.base
    b = base.training.batch_size
    gpus = kt.gpus[kinds]
    at_b = kt.step_s[kinds][:, :, b - 1]
    labels = [" | ".join(kind_label(kt.kinds[k]) for k in row) for row in kinds.tolist()]
    n_types = [len({key for k in row for key, _ in kt.kinds[k]}) for row in kinds.tolist()]
    describe = {"scenario_id": np.arange(first_id, first_id + len(kinds)), "nodes": labels,
                "n_nodes": kinds.shape[1], "gpus_per_node": gpus[:, 0], "gpu_types": n_types,
                "bandwidth_gbps": bw, "speed_ratio": at_b.max(axis=1) / at_b.min(axis=1)}
    frames, results = [], {}
    for strategy in ["baseline", *[s for s in strategies if s != "baseline"]]:
        d = decide(kt, kinds, bw, strategy)
        m = metrics(d, gpus, base.model.seq_len)
        results[strategy] = m
        if strategy not in strategies:
            continue
        frame = pd.DataFrame({**describe, "strategy": strategy, **m,
                              "collective": d["collective"], "payload_dtype": d["dtype"],
                              "batches": [",".join(map(str, r)) for r in d["batch"].tolist()],
                              "local_steps": [",".join(map(str, r)) for r in d["steps"].tolist()]})
        frames.append(frame)
    base_m = results["baseline"]
    out = pd.concat(frames, ignore_index=True)
    reps = len(frames)
    base_tokens, base_idle, base_rate = (np.tile(base_m[k], reps) for k in ("tokens", "idle_s", "tokens_per_s"))
    out["idle_s_equal_tokens"] = out["idle_s"] * base_tokens / out["tokens"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["idle_left"] = np.where(base_idle > 0, out["idle_s_equal_tokens"] / base_idle, np.nan)
    out["speedup"] = out["tokens_per_s"] / base_rate
    return out


def spec_digest(spec: SweepSpec) -> str:
    return hashlib.sha256(spec.to_json().encode()).hexdigest()[:12]


def validate_strategies(names) -> None:
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise KeyError(unknown[0])


__all__ = ["SweepSpec", "KindTables", "node_kinds", "scenario_grid", "decide", "metrics", "chunk_frame",
           "round_half_up", "spec_digest"]
