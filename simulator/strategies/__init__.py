"""Strategies: rules that turn a scenario into a plan. Names are stable CLI words.

A strategy is ONE batched function `decide(tables, net) -> dict` registered with
@register("name", "what it does, in one sentence", sync=...) (the plans' sync column: its kind of round,
formats/rounds.py; diloco by default): it decides every row (scenario) of `NodeTables`/`NetTables` at once and
returns at least `batch` and `steps` (S, n); optionally `comm_s` (S,), `rounds`, `collective`,
`dtype`, `fragments` and `delay` (Streaming DiLoCo's P and τ) (scalars or (S,) arrays) where
it changes how the nodes sync; what it leaves out is the scenario's. `make_plan` calls it
on a batch of one scenario; `geodt sweep` calls the very same function on thousands, so a new
strategy works in both at once. Modules listed at the bottom register themselves on import.

Memory: every plan is checked against what each node holds (profile OOM rows or peak memory,
else the memory model): a node that cannot hold batch 1, or a plan that puts a batch on a
node that cannot hold it (the baseline batch, for the strategies that keep it), is a one-line
error naming the node, the GPU and the memory needed and available.
"""
from __future__ import annotations

import math

import numpy as np

from formats.errors import FieldError, InputError, did_you_mean
from formats.plan import NodePlan, Plan, PlanError, QuorumSettings
from simulator.models.network import sync_s
from simulator.models.timing import NodeTiming, node_timings
from simulator.scenario import Scenario
from simulator.strategies.registry import BARRIERLESS, STRATEGIES, Strategy, known, register  # noqa: F401 (the package's API)
from simulator.strategies.tables import NetTables, NodeTables, from_scenario


def round_half_up(x: float) -> int:
    """Round to nearest, halves up (the paper's 4 × 1.45 = 5.8 → 6; Python's round() is banker's)."""
    return math.floor(x + 0.5)


def node_plan(timing: NodeTiming, batch_size: int, local_steps: int) -> NodePlan:
    node = timing.node
    layout = timing.layout
    return NodePlan(node=node.name, gpus=node.gpu_count, batch_size=batch_size, local_steps=local_steps,
                    step_s=timing.step_s(batch_size), cpu_cores=node.cpu_cores, cpu_quota=node.cpu_quota,
                    sharding=layout.sharding, activation_checkpointing=layout.checkpointing)


def uniform_plan(name: str, scenario: Scenario, nodes: list[NodePlan], note: str = "") -> Plan:
    """A plan whose rounds end with one ordinary outer sync over the scenario's network."""
    layouts = [t.layout for t in node_timings(scenario)]
    return Plan(strategy=name, nodes=tuple(nodes), comm_s=sync_s(scenario, layouts=layouts),
                seq_len=scenario.model.seq_len, note=note, outer_state=scenario.diloco.outer_state)


def complete(d: dict, tables: NodeTables, net: NetTables) -> dict:
    """A decision with every key: the scenario's own sync where the strategy keeps it."""
    out = dict(d)
    if "comm_s" not in out:
        out["comm_s"] = net.sync_s()
    out.setdefault("rounds", None)
    out.setdefault("collective", net.collective)
    out.setdefault("dtype", net.payload_dtype)
    out.setdefault("fragments", net.fragments)
    out.setdefault("delay", net.sync_delay_steps)
    return out


def check_batch_one(timings: list[NodeTiming]) -> None:
    """FieldError naming the first node that cannot hold even batch 1 (no strategy can plan it)."""
    seen: set[int] = set()
    for timing in timings:  # the memory limit is one per catalog_signature, whatever the given step times
        if id(timing.shared) in seen:
            continue
        seen.add(id(timing.shared))
        problem = timing.memory_problem(1)
        if problem is not None:
            raise FieldError(f"nodes[{timing.position}]",
                             f"node {timing.node.name!r} cannot hold even batch 1: {problem}; expected GPUs "
                             "with more memory, a smaller model or a shorter seq_len")


def _check_fits(name: str, scenario: Scenario, timings: list[NodeTiming], batch: np.ndarray,
                max_batch: np.ndarray) -> None:
    over = np.flatnonzero(batch > max_batch)
    if not len(over):
        return
    i = int(over[0])
    timing, b = timings[i], int(batch[i])
    problem = timing.memory_problem(b) or f"batch {b} is above the largest batch geodt plans ({int(max_batch[i])})"
    base = scenario.training.batch_size
    if b == base:
        raise FieldError("training.batch_size", f"node {timing.node.name!r} (nodes[{i}]): {problem}; "
                         f"expected a baseline batch that fits every node (at most {int(max_batch[i])} here)")
    raise FieldError(f"nodes[{i}]", f"strategy {name} gives node {timing.node.name!r} batch {b}, which does not "
                     f"fit: {problem}")


def make_plan(scenario: Scenario, strategy: str) -> Plan:
    """The plan of a named strategy (its batched rule on one row); InputError for unknown names."""
    rule = known(strategy)
    if rule is None:
        raise InputError(f"--strategy {strategy}: unknown strategy; expected one of {', '.join(STRATEGIES)}, or "
                         f"without a barrier, named only, {', '.join(BARRIERLESS)}"
                         f"{did_you_mean(strategy, [*STRATEGIES, *BARRIERLESS])}")
    timings = node_timings(scenario)
    check_batch_one(timings)
    tables, net = from_scenario(scenario, timings)
    raw = rule(tables, net)
    d = complete(raw, tables, net)
    batch, steps = np.asarray(d["batch"])[0], np.asarray(d["steps"])[0]
    _check_fits(strategy, scenario, timings, batch, tables.max_batch[0])
    nodes = tuple(node_plan(t, int(b), int(h)) for t, b, h in zip(timings, batch.tolist(), steps.tolist()))
    first = lambda v: v[0] if np.ndim(v) else v
    try:
        return Plan(strategy=strategy, nodes=nodes, comm_s=float(first(d["comm_s"])),
                    seq_len=scenario.model.seq_len, note=rule.note(d, tables) if rule.note else "",
                    rounds=None if d["rounds"] is None else int(first(d["rounds"])),
                    collective=str(first(raw["collective"])) if "collective" in raw else None,
                    payload_dtype=str(first(raw["dtype"])) if "dtype" in raw else None,
                    sync=raw.get("sync"), outer_state=scenario.diloco.outer_state,
                    fragments=int(first(d["fragments"])),
                    sync_delay_steps=int(first(d["delay"])), fragment_alpha=scenario.diloco.fragment_alpha,
                    fragment_pattern=scenario.diloco.fragment_pattern, adapt=raw.get("adapt"),
                    quorum=QuorumSettings.from_columns(
                        raw.get("quorum"), None if raw.get("grace_s") is None else float(first(raw["grace_s"]))))
    except PlanError as exc:  # the scenario's fragments do not fit this strategy's local steps
        raise FieldError(f"diloco.{exc.key}", f"strategy {strategy}: {exc.expected}") from None


# Registration happens on import; keep this list in the order strategies are printed (not sorted).
# isort: off
from simulator.strategies import paper, measured, slowest, hybrid, sync_ddp, network_aware, streaming, adaptive  # noqa: E402, F401
from simulator.strategies import barrierless  # noqa: E402, F401
# isort: on
