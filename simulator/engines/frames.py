"""What every kind of round's engine shares: the engine choice, the size check, the tidy frames, each node's sync.

A kind of round (formats/rounds.py) names the class that times it (`RoundEngine`: rounds_barrier.py,
rounds_streaming.py, rounds_server.py); `engine_for` resolves it. Each answers the same three
questions of simulator/engines/engine.py: the timeline, the timeline with its syncs table, and
both in chunks of whole rounds.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pkgutil import resolve_name

import numpy as np
import pandas as pd

from formats.errors import InputError
from formats.plan import Plan
from formats.timeline import SYNC_COLUMNS
from simulator.models.network import node_sync_offsets_s, outer_step_s
from simulator.scenario import Scenario

ENGINES = ("auto", "simpy", "analytic")
# A timeline of more rows than this (or a jittered run drawing more step times) is refused up
# front: it would take gigabytes; and a run this many times longer than a node's compute per
# round would keep too few digits of it in float64 (a round of 1e30 s hides a step of 1 s).
MAX_TIMELINE_ROWS = 20_000_000
MAX_SPAN_RATIO = 1e12


class RoundEngine(ABC):
    """How one kind of round is timed: simulator/engines/engine.py's three entries for its plans."""

    @abstractmethod
    def timeline(self, scenario: Scenario, plan: Plan, engine: str) -> pd.DataFrame:
        """The timeline (one row per node and round)."""

    @abstractmethod
    def syncs(self, scenario: Scenario, plan: Plan, engine: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(timeline, syncs): the timeline and one row per node and (fragment) sync."""

    def chunks(self, scenario: Scenario, plan: Plan, engine: str, emit, chunk_rounds: int) -> None:
        """syncs(), handed to emit(timeline, syncs) in chunks of whole rounds; by default one chunk."""
        emit(*self.syncs(scenario, plan, engine))


def engine_for(plan: Plan) -> RoundEngine:
    """The engine of the plan's kind of round (formats/rounds.py `engine`)."""
    return resolve_name(plan.round_kind.engine)()


def pick_engine(scenario: Scenario, plan: Plan, engine: str = "auto") -> tuple[str, str]:
    """(engine, why): "auto" is the analytic path wherever it is exact: every node's compute per
    round (jitter included) is drawn from the seed before the run, and the sync is the barrier or
    fragment-sync recurrence, so the analytic recurrences make SimPy's additions in SimPy's
    order (tests/test_simulator_engines.py holds them equal). That is every kind of round with an
    analytic path (formats/rounds.py `analytic`): an adaptive plan's next round depends on the step
    times its nodes measured, not on the barrier, so simulator/models/adaptive.py walks its rounds
    before the run and both engines run that matrix; an outage is time put into the matrix before the
    run and moved afterwards (simulator/models/outage.py), the same for both; async rounds
    (simulator/engines/engine_async.py) have their own, a first-come-first-served queue recurrence. A
    kind whose next round depends on the events of the run needs SimPy: quorum rounds, closed by
    arrivals and grace timers (`analytic` is refused)."""
    kind = plan.round_kind
    if not kind.analytic:
        if engine == "analytic":
            raise InputError(f"--engine analytic: strategy {plan.strategy} ({kind.title}) has no analytic path; "
                             "expected auto or simpy")
        return "simpy", kind.analytic_why
    if engine != "auto":
        return engine, "asked for"
    return "analytic", "exact here: rounds fixed before the run; --engine simpy simulates the events"


def check_size(scenario: Scenario, plan: Plan) -> None:
    """InputError (one line) if the simulation would be too large or lose its precision."""
    rounds = plan.settings_from(scenario).rounds
    n = len(plan.nodes)
    name = f"strategy {plan.strategy}"
    if rounds * n > MAX_TIMELINE_ROWS:
        raise InputError(f"{name}: {rounds} rounds x {n} nodes = {rounds * n} timeline rows; expected at most "
                         f"{MAX_TIMELINE_ROWS} (fewer training.rounds, local_steps or nodes)")
    if plan.fragments > 1 and rounds * n * plan.fragments > MAX_TIMELINE_ROWS:
        raise InputError(f"{name}: {rounds} rounds x {plan.fragments} fragments x {n} nodes = "
                         f"{rounds * n * plan.fragments} fragment syncs; expected at most {MAX_TIMELINE_ROWS} "
                         "(fewer training.rounds, fragments or nodes)")
    draws = rounds * sum(p.local_steps for p in plan.nodes)
    if scenario.simulation.jitter_cv and draws > MAX_TIMELINE_ROWS:
        raise InputError(f"{name}: jitter draws {draws} step times; expected at most {MAX_TIMELINE_ROWS} "
                         "(fewer rounds or local_steps, or simulation.jitter_cv = 0)")
    wall = rounds * plan.round_s
    shortest = min(p.compute_s for p in plan.nodes)
    if not (math.isfinite(wall) and shortest > 0 and wall / shortest <= MAX_SPAN_RATIO):
        raise InputError(f"{name}: the run lasts {wall:.3g} s and a node computes {shortest:.3g} s per round, "
                         f"beyond float64's precision (ratio above {MAX_SPAN_RATIO:g}); expected step times, "
                         "bandwidths and rounds closer together")


def checked_engine(scenario: Scenario, plan: Plan, engine: str) -> str:
    """The engine that runs (auto resolved), after the size check."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: unknown engine; expected one of {', '.join(ENGINES)}")
    check_size(scenario, plan)
    return pick_engine(scenario, plan, engine)[0]


def round_tokens(plan: Plan, steps: np.ndarray | None = None) -> np.ndarray:
    """Tokens per node and round: the plan's (1 × nodes), or of the steps each node took (rounds × nodes)."""
    units = np.array([n.batch_size * n.gpus * plan.seq_len for n in plan.nodes], dtype=np.int64)
    if steps is None:
        steps = np.array([[n.local_steps for n in plan.nodes]], dtype=np.int64)
    return steps * units


def node_offsets_s(scenario: Scenario, plan: Plan) -> np.ndarray | None:
    """Per plan node, its own end of one of the plan's all-reduces (a fragment's: 1/P of the
    payload) less the collective's, where the network profile measured each node's own times
    (simulator/models/network.py node_sync_offsets_s) and the kind of round takes them
    (formats/rounds.py "node_offsets"; not sync-ddp's per-step all-reduces: the collective's time);
    None otherwise."""
    if not plan.round_kind.supports("node_offsets"):
        return None
    sync = plan.settings_from(scenario)
    offsets = node_sync_offsets_s(scenario, sync.payload_dtype, sync.collective, plan.fragments)
    if offsets is None:
        return None
    by_name = dict(zip((n.name for n in scenario.nodes), offsets))
    return np.array([by_name[p.node] for p in plan.nodes]) if all(p.node in by_name for p in plan.nodes) else None


def node_comm_s(scenario: Scenario, plan: Plan):
    """A classic round's sync per node: plan.comm_s, each node's own end of the all-reduce where the
    network profile measured it (node_offsets_s), else one number for all."""
    offsets = node_offsets_s(scenario, plan)
    return plan.comm_s if offsets is None else np.maximum(plan.comm_s + offsets, 0.0)


def outer_share_s(scenario: Scenario, plan: Plan) -> float:
    """The outer step of one fragment sync (none for a kind without one: sync = gradients); comm_s − this
    is its all-reduce."""
    return outer_step_s(scenario) / plan.fragments if plan.round_kind.outer_step else 0.0


def frame(plan: Plan, arrays: dict, columns: list[str], per_round: int = 1, first_round: int = 0) -> pd.DataFrame:
    """A tidy frame from (rows × nodes) arrays; categorical strategy and node, rounds (from
    first_round) and fragments. The rows come from compute_s where given (tokens may be 1 × nodes)."""
    rows, n = np.shape(arrays["compute_s" if "compute_s" in arrays else columns[-1]])
    names = [p.node for p in plan.nodes]
    # categorical columns: building 10^5 Python strings would cost more than the simulation
    out = pd.DataFrame({
        "strategy": pd.Categorical.from_codes(np.zeros(rows * n, dtype=np.int8), [plan.strategy]),
        "node": pd.Categorical.from_codes(np.tile(np.arange(n), rows), names),
        "round": np.repeat(first_round + np.arange(rows) // per_round, n),
        **({"fragment": np.repeat(np.arange(rows) % per_round, n)} if "fragment" in columns else {}),
        **{k: np.ravel(np.broadcast_to(v, (rows, n))) for k, v in arrays.items() if k in columns}})
    return out[columns]


def classic_syncs(timeline: pd.DataFrame, plan: Plan, outer_s: float) -> pd.DataFrame:
    """A classic round's one sync: the node stops at its sync point (= merge point), waits for the
    last node (idle), then the whole all-reduce is exposed, then the outer step."""
    sync_point = timeline["round_start_s"].to_numpy() + timeline["compute_s"].to_numpy()
    start = sync_point + timeline["idle_s"].to_numpy()
    allreduce = np.maximum(timeline["comm_s"].to_numpy() - outer_s, 0.0)
    out = timeline[["strategy", "node", "round"]].copy()
    out.insert(3, "fragment", 0)
    out = out.assign(compute_start_s=timeline["round_start_s"].to_numpy(), sync_point_s=sync_point,
                     start_s=start, end_s=start + allreduce, merge_point_s=sync_point,
                     idle_s=timeline["idle_s"].to_numpy(), exposed_s=allreduce, outer_s=outer_s)
    return out[SYNC_COLUMNS].reset_index(drop=True)
