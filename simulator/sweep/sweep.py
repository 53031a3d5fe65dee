"""What-if sweeps: node mixes from the catalog × bandwidths × strategies, decided in bulk.

A sweep scenario is the base scenario (model, training, latency, collective, payload dtype:
`paper` unless told) with its nodes replaced by a mix of node kinds and its bandwidth set.
A node kind is K GPUs: one type (homogeneous nodes) or any multiset of the given types
(`--mixed-nodes`). The mixes are every multiset of N kinds when mixes × bandwidths fit in
`samples`, else a seeded sample of ⌈samples / bandwidths⌉ distinct mixes (nodes drawn
independently and uniformly from the kinds), each at every bandwidth.

The fast path decides a chunk of scenarios at once. Step times come from the per-GPU-type
coefficients of `simulator.models.timing.gpu_step_s` on the base scenario, each node kind under the
memory layout `geodt plan` chooses for it (sharding, recomputation: simulator/sweep/sweep_fit.py),
combined exactly as `NodeTiming` does (slowest GPU, then the intra-node collectives), so the
floats are the same ones `make_plan` sees. Every strategy is decided by its one registered, batched rule (the
function make_plan runs on a batch of one), so any registered strategy sweeps. Rounds
are deterministic, so the metrics are closed forms of the plan (the analytic engine's
sums, in another order: they agree with `simulate` to rounding, and the plans agree
exactly; tests/test_sweep.py checks both on a handful of scenarios).

Metrics per scenario × strategy (the whole simulated run; R = the plan's rounds):
  round_s = max_i compute_i + comm_s (Streaming DiLoCo plans: wall time / R of the analytic
  engine's fragment-sync recurrence, and idle_s its idle);  wall_s = R × round_s
  idle_s = R × Σ_i (max_j compute_j − compute_i)
  idle_floor_s = R × Σ_i t_i(b_i): the one-step bound (the CSV keeps its first name). Not a floor:
    a bound from above on the idle of a plan balanced to the step: when every node finishes
    within one of its own inner steps of the slowest, idle_i < t_i(b_i) each round, so idle_s <
    idle_floor_s; idle_vs_floor = idle_s / idle_floor_s < 1 says a plan is balanced that finely.
  utilization = Σ_i compute_i / (n × round_s);  tokens = R × Σ_i H_i·b_i·gpus_i·seq_len
  idle_s_equal_tokens = idle_s × baseline tokens / tokens (the idle of as many tokens as the
  baseline trains); idle_left = that / the baseline's idle_s; speedup = tokens_per_s / baseline's.
  comparable = tokens within ±5% of the baseline's (simulator/outputs/report.py does_baseline_work, the rule
  `geodt simulate` marks with *): false, the strategy does other work there and its speed-up is not
  like for like.
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

from formats.rounds import is_streaming
from simulator.engines.engine_analytic import run_streaming_analytic
from simulator.models.loss_prediction import loss_setup, sweep_losses
from simulator.models.network import node_outer_step_s, outer_step_s
from simulator.models.timing import gpu_estimate, intra_node_comm_s
from simulator.outputs.report import does_baseline_work
from simulator.scenario import NodeConfig, Scenario
from simulator.strategies import STRATEGIES, complete, round_half_up
from simulator.strategies.streaming import segments
from simulator.strategies.tables import NetTables, NodeTables, batch_cap, fragment_keys, node_spec_tflops
from simulator.sweep.sweep_drift import drifted_metrics, sweep_factors
from simulator.sweep.sweep_fit import check_kinds_fit, kind_node, kind_timing

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
    drift: str = ""  # --drift: a TOML list of drift events for every node (simulator/sweep/sweep_drift.py)

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


def describe_grid(spec: SweepSpec, n_kinds: int) -> str:
    """How --samples became this many scenarios (choose_mixes' rule), in words."""
    bws = len(spec.bandwidths_gbps)
    per_bw = max(1, math.ceil(spec.samples / bws))
    total = math.comb(n_kinds + spec.nodes - 1, spec.nodes)
    mixes = min(total, per_bw)
    if total <= per_bw:
        why = (f"all {total:,} distinct mixes of {spec.nodes} nodes over {n_kinds} node kinds (--samples "
               f"{spec.samples} over {bws} bandwidth{'s' if bws > 1 else ''} asks for up to {per_bw:,} each"
               + (", and there are no more)" if total < per_bw else ")"))
    else:
        why = (f"{mixes:,} mixes of {spec.nodes} nodes drawn (seed {spec.seed}) from the {total:,} distinct ones "
               f"over {n_kinds} node kinds (--samples {spec.samples} / {bws} bandwidth{'s' if bws > 1 else ''}, "
               "rounded up)")
    return f"{mixes * bws:,} scenarios: {why}, each at {bws} bandwidth{'s' if bws > 1 else ''}"


def scenario_grid(spec: SweepSpec, n_kinds: int) -> tuple[np.ndarray, np.ndarray]:
    """(kinds (S, N), bandwidth (S,)): every chosen mix at every bandwidth, mixes outer."""
    mixes = choose_mixes(spec, n_kinds)
    bws = np.asarray(spec.bandwidths_gbps, dtype=float)
    return np.repeat(mixes, len(bws), axis=0), np.tile(bws, len(mixes))


class KindTables:
    """Per node kind, what the strategies need, computed from the base scenario exactly as NodeTiming does
    (each kind under the memory layout plan chooses for it: simulator/sweep/sweep_fit.py)."""

    def __init__(self, base: Scenario, kinds: list[Kind]):
        self.base, self.kinds = base, kinds
        b = base.training.batch_size
        self.types = tuple(dict.fromkeys(key for kind in kinds for key, _ in kind))
        check_kinds_fit(base, self.types, sum(c for _, c in kinds[0]))  # every node must hold batch b
        timings: dict[frozenset, object] = {}  # kinds of the same types share layout, limits, collectives
        for kind in kinds:
            timings.setdefault(frozenset(key for key, _ in kind), kind_timing(base, kind))
        per_kind = [timings[frozenset(key for key, _ in kind)] for kind in kinds]
        self.max_batch = np.array([t.max_batch() for t in per_kind], dtype=np.int64)
        self._estimate_groups(per_kind)
        self.present = np.array([[key in dict(kind) for key in self.types] for kind in kinds])
        self.gpus = np.array([sum(c for _, c in kind) for kind in kinds], dtype=np.int64)
        configs = [self.node_config(kind, "x") for kind in kinds]
        self.intra_s = np.array([t.intra_s for t in per_kind])
        self.outer_kind_s = np.array([node_outer_step_s(base, node, t.layout) for node, t in zip(configs, per_kind)])
        spec = np.array([node_spec_tflops(base, node) for node in configs]).reshape(len(kinds), 2)
        self.mean_tflops, self.slowest_tflops = spec[:, 0], spec[:, 1]
        cap = batch_cap(b)
        batches = np.arange(1, cap + 1, dtype=np.int64)
        table = self.step_of(np.arange(len(kinds))[:, None], batches[None, :])  # (K, cap)
        self.step_table = np.where(batches[None, :] <= self.max_batch[:, None], table, np.inf)

    def _estimate_groups(self, per_kind) -> None:
        """Per-type estimates of each distinct (layout, overlapped collectives), as NodeTiming.estimate_s
        takes them: fsdp overlaps its collectives with compute, the other layouts add them after."""
        groups: dict = {}
        self.group = np.empty(len(per_kind), dtype=np.int64)
        for k, timing in enumerate(per_kind):
            layout = timing.layout
            overlapped = (intra_node_comm_s(timing.scenario, timing.node, layout)[0] if layout.sharding == "fsdp"
                          else 0.0)
            self.group[k] = groups.setdefault((layout, overlapped), len(groups))
        self.estimates = [[gpu_estimate(self.base, key, layout, overlapped) for key in self.types]
                          for layout, overlapped in groups]

    def outer_s(self, kinds: np.ndarray) -> np.ndarray:
        """(S,) the outer step each scenario's plan prices: its slowest node's under the node's layout
        (make_plan's). The engines time a fragment's outer step as outer_step_s(scenario), without
        layouts, and so do the sweep's metrics (chunk_frame)."""
        return self.outer_kind_s[kinds].max(axis=1)

    def loss_setup(self, nodes: int):
        """The loss model of the base scenario at this node count (once per sweep process and count)."""
        cache = self.__dict__.setdefault("_loss_setups", {})
        if nodes not in cache:
            cache[nodes] = loss_setup(self.base, nodes=nodes)
        return cache[nodes]

    def step_of(self, kind: np.ndarray, batch: np.ndarray) -> np.ndarray:
        """t_k(b) for kind indices and batches of one shape: slowest GPU type plus the intra-node collectives.

        The same float operations as NodeTiming.estimate_s (gpu_step_s per type, max, + collectives)."""
        if len(self.estimates) == 1:  # one layout for every kind (the common case): no masks
            per_type = np.stack([_step_s(est, np.asarray(batch)) for est in self.estimates[0]], axis=-1)
            return np.where(self.present[kind], per_type, -np.inf).max(axis=-1) + self.intra_s[kind]
        kind, batch = np.broadcast_arrays(np.asarray(kind), np.asarray(batch))
        out = np.empty(kind.shape, dtype=float)
        group = self.group[kind]
        for g, estimates in enumerate(self.estimates):
            sel = group == g
            if sel.any():
                per_type = np.stack([_step_s(est, batch[sel]) for est in estimates], axis=-1)  # (m, T)
                out[sel] = np.where(self.present[kind[sel]], per_type, -np.inf).max(axis=-1) + self.intra_s[kind[sel]]
        return out

    def tables(self, kinds: np.ndarray) -> NodeTables:
        """The strategies' arrays for a chunk of scenarios (kinds (S, n))."""
        base = self.base

        def lookup(rows: np.ndarray, batch: np.ndarray) -> np.ndarray:
            return self.step_of(kinds[rows], batch)

        return NodeTables(self.step_table[kinds], self.gpus[kinds], base.training.batch_size,
                          base.training.local_steps, base.training.rounds, self.max_batch[kinds],
                          self.mean_tflops[kinds], self.slowest_tflops[kinds], lookup)

    @staticmethod
    def node_config(kind: Kind, name: str) -> NodeConfig:
        return kind_node(kind, name)

    def scenario(self, kinds_row, bandwidth_gbps: float) -> Scenario:
        """The Scenario a sweep row stands for (what make_plan + simulate would be given)."""
        nodes = tuple(self.node_config(self.kinds[k], f"node{i + 1}") for i, k in enumerate(kinds_row))
        network = replace(self.base.network, bandwidth_gbps=float(bandwidth_gbps))
        scenario = replace(self.base, name="sweep", nodes=nodes, network=network)
        return scenario


def _step_s(estimate, batch: np.ndarray) -> np.ndarray:
    """estimate.step_s elementwise: at once, or batch by batch where collectives overlap the compute
    (fsdp: its scalar overlap rule), so that the floats are NodeTiming's."""
    if not estimate.comm_s:
        return estimate.step_s(batch)
    values, where = np.unique(batch, return_inverse=True)
    return np.array([estimate.step_s(int(v)) for v in values], dtype=float)[where.reshape(batch.shape)]


def _net(kt: KindTables, kinds: np.ndarray, bw: np.ndarray) -> NetTables:
    base = kt.base
    return NetTables(links_gbps=np.broadcast_to(bw[:, None], kinds.shape).astype(float),
                     outer_step_s=kt.outer_s(kinds), params=base.model.param_count,
                     latency_ms=base.network.latency_ms, payload_dtype=base.network.payload_dtype,
                     collective=base.network.collective, **fragment_keys(base))


def decide(kt: KindTables, kinds: np.ndarray, bw: np.ndarray, strategy: str) -> dict:
    """The plans of one strategy for a chunk, by the strategy's own (batched) rule, the one make_plan runs:
    batch, steps, step_s (S, n); comm_s (S,); rounds; collective; dtype."""
    tables, net = kt.tables(kinds), _net(kt, kinds, bw)
    out = complete(STRATEGIES[strategy](tables, net), tables, net)
    if out["rounds"] is None:
        out["rounds"] = kt.base.training.rounds
    if (out["batch"] > tables.max_batch).any():  # make_plan refuses such a plan; the sweep must never make one
        raise AssertionError(f"strategy {strategy} planned a batch that does not fit")
    out["step_s"] = tables.step_at(out["batch"])
    return out


def metrics(d: dict, gpus: np.ndarray, seq_len: int, outer_s: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The module docstring's metrics, per scenario, from one strategy's decisions.

    Streaming DiLoCo rows (fragments > 1 or a delay) are timed by the analytic engine's fragment-sync
    recurrence (their syncs overlap compute: no closed form in general); outer_s (S,): the outer step."""
    rounds = d["rounds"]
    compute = d["steps"] * d["step_s"]
    slowest = compute.max(axis=1)
    round_s = slowest + d["comm_s"]
    idle_s = rounds * (slowest[:, None] - compute).sum(axis=1)
    fragments = np.broadcast_to(np.asarray(d.get("fragments", 1)), slowest.shape)
    delay = np.broadcast_to(np.asarray(d.get("delay", 0)), slowest.shape)
    streaming = is_streaming(fragments, delay)
    for p in np.unique(fragments[streaming]).tolist():
        idx = np.flatnonzero((fragments == p) & streaming)
        round_s, idle_s = round_s.astype(float), idle_s.astype(float)
        round_s[idx], idle_s[idx] = _streaming_rounds(d, idx, int(p), delay[idx], int(np.ravel(rounds)[0]), outer_s)
    tokens_per_round = (d["steps"] * d["batch"] * gpus).sum(axis=1) * seq_len
    n = compute.shape[1]
    return {"round_s": round_s, "wall_s": rounds * round_s, "comm_s": d["comm_s"] + 0 * round_s,
            "idle_s": idle_s, "idle_floor_s": rounds * d["step_s"].sum(axis=1),
            "utilization": compute.sum(axis=1) / (n * round_s),
            "tokens_per_round": tokens_per_round, "tokens": rounds * tokens_per_round,
            "tokens_per_s": rounds * tokens_per_round / (rounds * round_s)}


def _streaming_rounds(d: dict, idx: np.ndarray, fragments: int, delay: np.ndarray, rounds: int, outer_s):
    """(round_s, idle_s summed over nodes and rounds) of the streaming rows idx (deterministic steps)."""
    outer = np.broadcast_to(np.asarray(outer_s, dtype=float), (len(d["steps"]),))[idx] / fragments
    allreduce = np.broadcast_to(np.asarray(d["comm_s"], dtype=float), (len(d["steps"]),))[idx] - outer
    pre, window = segments(d["steps"][idx], d["step_s"][idx], fragments, delay)
    out = run_streaming_analytic(pre, window, allreduce, outer, fragments, record=False, syncs=rounds * fragments)
    return out["wall_s"] / rounds, out["idle_s"].sum(axis=1)


def chunk_frame(kt: KindTables, kinds: np.ndarray, bw: np.ndarray, strategies, first_id: int,
                drift: tuple = (), seed: int = 0) -> pd.DataFrame:
    """Tidy rows (scenario × strategy) for one chunk of scenarios; drift: every node's events."""
    base = kt.base
    factors = None
    if drift:
        factors = sweep_factors(drift, base.training.rounds, np.arange(first_id, first_id + len(kinds)),
                                kinds.shape[1], seed)
    b = base.training.batch_size
    gpus = kt.gpus[kinds]
    at_b = kt.step_of(kinds, np.full(kinds.shape, b, dtype=np.int64))
    names = [kind_label(kind) for kind in kt.kinds]  # once per kind, not per node of every scenario
    types = [{key for key, _ in kind} for kind in kt.kinds]
    labels = [" | ".join([names[k] for k in row]) for row in kinds.tolist()]
    n_types = [len(set().union(*[types[k] for k in row])) for row in kinds.tolist()]
    describe = {"scenario_id": np.arange(first_id, first_id + len(kinds)), "nodes": labels,
                "n_nodes": kinds.shape[1], "gpus_per_node": gpus[:, 0], "gpu_types": n_types,
                "bandwidth_gbps": bw, "speed_ratio": at_b.max(axis=1) / at_b.min(axis=1)}
    frames, results = [], {}
    for strategy in ["baseline", *[s for s in strategies if s != "baseline"]]:
        d = decide(kt, kinds, bw, strategy)
        m = (metrics(d, gpus, base.model.seq_len, outer_step_s(base)) if factors is None else
             drifted_metrics(d, gpus, base.model.seq_len, factors, outer_step_s(base)))
        results[strategy] = m
        if strategy not in strategies:
            continue
        if base.training.target_loss is not None:  # the loss model's columns (simulator/models/loss_prediction.py)
            m = {**m, **sweep_losses(kt.loss_setup(kinds.shape[1]), base, d, gpus, m["wall_s"] / d["rounds"],
                                   strategy)}
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
    out["comparable"] = does_baseline_work(out["tokens"] / base_tokens)
    return out


def spec_digest(spec: SweepSpec) -> str:
    return hashlib.sha256(spec.to_json().encode()).hexdigest()[:12]


def validate_strategies(names) -> None:
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise KeyError(unknown[0])


__all__ = [
    "KindTables",
    "SweepSpec",
    "chunk_frame",
    "decide",
    "metrics",
    "node_kinds",
    "round_half_up",
    "scenario_grid",
    "spec_digest",
]
