"""simulate(scenario, plan, engine) -> the timeline DataFrame; summary(timeline, plan) -> per node totals.

simulate_syncs also returns the fragment syncs (SYNC_COLUMNS, one row per node and sync). A
classic plan (one fragment, no delay) runs the round engines, unchanged; a Streaming DiLoCo
plan runs the fragment-sync engines (`run_streaming_*`), whose records both tables come from.

simulate_chunks hands the same two tables on in chunks of whole rounds as they are produced
(`geodt simulate` writes them as they come: memory bounded by a chunk, not the run); the
chunks, concatenated, are simulate_syncs' tables (tests/test_simulate_chunks.py); an adaptive
plan or one with an outage is simulated whole and handed on as one chunk (its rounds are made,
or settled, over the whole run). Engine
"auto" (pick_engine) is the analytic path wherever it is exact, else SimPy.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from formats.errors import InputError
from formats.plan import Plan, quorum_need
from formats.timeline import SUMMARY_COLUMNS, SYNC_COLUMNS, TIMELINE_COLUMNS
from simulator.engines.engine_analytic import (
    next_start_s,
    run_analytic,
    run_streaming_analytic,
    stream_state,
    wait_split,
)
from simulator.engines.engine_async import STALE_FIELDS, run_async_analytic, run_async_simpy, run_quorum_simpy
from simulator.engines.engine_async import service_s as async_service_s
from simulator.engines.engine_simpy import run_simpy, run_streaming_simpy
from simulator.models import outage
from simulator.models.adaptive import adaptive_rounds
from simulator.models.checkpoints import checkpoint_cost, round_s
from simulator.models.network import node_sync_offsets_s, outer_step_s
from simulator.models.totals import RunTotals
from simulator.models.workload import compute_matrix, segment_matrices
from simulator.scenario import Scenario

ENGINES = ("auto", "simpy", "analytic")


def pick_engine(scenario: Scenario, plan: Plan, engine: str = "auto") -> tuple[str, str]:
    """(engine, why): "auto" is the analytic path where it is exact: every node's compute per
    round (jitter included) is drawn from the seed before the run, and the sync is the barrier or
    fragment-sync recurrence, so the analytic recurrences make SimPy's additions in SimPy's
    order (tests/test_simulator_engines.py holds them equal). That is every plan today: an
    adaptive plan's next round depends on the step times its nodes measured, not on the barrier,
    so simulator/models/adaptive.py walks its rounds before the run and both engines run that matrix; an
    outage is time put into the matrix before the run and moved afterwards (simulator/models/outage.py),
    the same for both. An async plan (simulator/engines/engine_async.py) has its own analytic path, a
    first-come-first-served queue recurrence. A plan whose next round depends on the events of the
    run needs SimPy: quorum rounds, closed by arrivals and grace timers (`analytic` is refused)."""
    if plan.sync == "quorum":
        if engine == "analytic":
            raise InputError(f"--engine analytic: strategy {plan.strategy} (quorum rounds) has no analytic path; "
                             "expected auto or simpy")
        return "simpy", "quorum rounds close on arrivals and grace windows: SimPy's events"
    if engine != "auto":
        return engine, "asked for"
    return "analytic", "exact here: rounds fixed before the run; --engine simpy simulates the events"


# A timeline of more rows than this (or a jittered run drawing more step times) is refused up
# front: it would take gigabytes; and a run this many times longer than a node's compute per
# round would keep too few digits of it in float64 (a round of 1e30 s hides a step of 1 s).
MAX_TIMELINE_ROWS = 20_000_000
MAX_SPAN_RATIO = 1e12


def check_size(scenario: Scenario, plan: Plan) -> None:
    """InputError (one line) if the simulation would be too large or lose its precision."""
    rounds = plan.rounds or scenario.training.rounds
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


def simulate(scenario: Scenario, plan: Plan, engine: str = "simpy") -> pd.DataFrame:
    """Timeline (one row per node and round, rounds outer) with docs/DESIGN.md's columns (and
    STALE_FIELDS for a plan without a barrier)."""
    if plan.barrierless:
        return barrierless_timeline(scenario, plan, engine)
    if not plan.streaming:  # the syncs table would double a classic plan's time (bench_simulator)
        return _classic_timeline(scenario, plan, engine)
    return simulate_syncs(scenario, plan, engine)[0]


def _classic_timeline(scenario: Scenario, plan: Plan, engine: str) -> pd.DataFrame:
    """A classic plan's timeline on the engine asked for: every node, one sync a round."""
    engine = _check(scenario, plan, engine)
    return _frame(plan, _whole_classic(scenario, plan, engine), TIMELINE_COLUMNS)


def _whole_classic(scenario: Scenario, plan: Plan, engine: str) -> dict:
    """A classic plan's arrays (tokens included), every round at once: an adaptive plan's rounds
    depend on what the rounds before measured (simulator/models/adaptive.py), an outage is settled on the
    whole arrays (simulator/models/outage.py)."""
    comm = node_comm_s(scenario, plan)
    compute, steps = adaptive_rounds(scenario, plan, comm) if plan.adaptive else (compute_matrix(scenario, plan), None)
    compute, fixups = outage.prepare(scenario, plan, compute, comm)  # a node lost for a while
    ckpt = checkpoint_cost(scenario).block_s(round_s(compute, comm))
    arrays = (run_simpy if engine == "simpy" else run_analytic)(compute, comm, ckpt)
    arrays, tokens = outage.settle(arrays, fixups, round_tokens(plan, steps))
    return {**arrays, "tokens": tokens}


def barrierless_timeline(scenario: Scenario, plan: Plan, engine: str) -> pd.DataFrame:
    """An async or quorum plan's timeline (simulator/engines/engine_async.py), its staleness columns beside
    (STALE_FIELDS: not written to timeline files; summary.csv's staleness comes from them).
    Checkpoints are not priced here; an outage is refused."""
    engine = _check(scenario, plan, engine)
    if outage.outages(scenario, plan):
        raise InputError(f"strategy {plan.strategy}: a node's outage is modelled for barrier rounds only; expected "
                         "no [[nodes]] outage with async or quorum")
    compute = compute_matrix(scenario, plan)
    if plan.sync == "async":
        arrays = (run_async_simpy if engine == "simpy" else run_async_analytic)(
            compute, async_service_s(scenario, plan))
    else:
        arrays = run_quorum_simpy(compute, quorum_need(plan.quorum, len(plan.nodes)), plan.grace_s, plan.comm_s)
    return _frame(plan, {**arrays, "tokens": round_tokens(plan)}, TIMELINE_COLUMNS + STALE_FIELDS)


def round_tokens(plan: Plan, steps: np.ndarray | None = None) -> np.ndarray:
    """Tokens per node and round: the plan's (1 × nodes), or of the steps each node took (rounds × nodes)."""
    units = np.array([n.batch_size * n.gpus * plan.seq_len for n in plan.nodes], dtype=np.int64)
    if steps is None:
        steps = np.array([[n.local_steps for n in plan.nodes]], dtype=np.int64)
    return steps * units


def _check(scenario: Scenario, plan: Plan, engine: str) -> str:
    """The engine that runs (auto resolved), after the size check."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: unknown engine; expected one of {', '.join(ENGINES)}")
    check_size(scenario, plan)
    return pick_engine(scenario, plan, engine)[0]


def simulate_syncs(scenario: Scenario, plan: Plan, engine: str = "simpy") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(timeline, syncs): the timeline and one row per node and fragment sync (SYNC_COLUMNS)."""
    if plan.barrierless:
        timeline = barrierless_timeline(scenario, plan, engine)
        return timeline, classic_syncs(timeline, plan, outer_share_s(scenario, plan))
    if not plan.streaming:
        timeline = _classic_timeline(scenario, plan, engine)
        return timeline, classic_syncs(timeline, plan, outer_share_s(scenario, plan))
    engine = _check(scenario, plan, engine)
    outage.prepare(scenario, plan, np.zeros((1, len(plan.nodes))), 0.0)  # refuses an outage here
    pre, delay = segment_matrices(scenario, plan)
    outer = outer_share_s(scenario, plan)
    allreduce = max(plan.comm_s - outer, 0.0)
    run = run_streaming_simpy if engine == "simpy" else run_streaming_analytic
    rec = run(pre, delay, allreduce, outer, plan.fragments, _streaming_ckpt_s(scenario, plan, pre, delay),
              node_offsets_s=node_offsets_s(scenario, plan))
    return streaming_frames(plan, rec)


def simulate_chunks(scenario: Scenario, plan: Plan, engine: str, emit, chunk_rounds: int) -> None:
    """simulate_syncs' (timeline, syncs), handed to emit(timeline, syncs) in chunks of
    chunk_rounds whole rounds (the last shorter) as the engine produces them."""
    if plan.barrierless:  # one chunk: its rounds end node by node, not together
        emit(*simulate_syncs(scenario, plan, engine))
        return None
    engine = _check(scenario, plan, engine)
    outer = outer_share_s(scenario, plan)
    if not plan.streaming:
        def classic(arrays, first_round):
            timeline = _frame(plan, arrays, TIMELINE_COLUMNS, first_round=first_round)
            emit(timeline, classic_syncs(timeline, plan, outer))
        if plan.adaptive or outage.outages(scenario, plan):  # rounds made or settled on the whole run
            return classic(_whole_classic(scenario, plan, engine), 0)
        compute, comm = compute_matrix(scenario, plan), node_comm_s(scenario, plan)
        tokens = round_tokens(plan)
        ckpt = checkpoint_cost(scenario).block_s(round_s(compute, comm))
        if engine == "simpy":
            return run_simpy(compute, comm, ckpt, chunk_rounds=chunk_rounds,
                             emit=lambda arrays, first: classic({**arrays, "tokens": tokens}, first))
        start = 0.0
        for first in range(0, compute.shape[0], chunk_rounds):
            chunk = ckpt[first:first + chunk_rounds]
            arrays = run_analytic(compute[first:first + chunk_rounds], comm, chunk, start)
            start = next_start_s(arrays, chunk[-1])
            classic({**arrays, "tokens": tokens}, first)
        return None
    outage.prepare(scenario, plan, np.zeros((1, len(plan.nodes))), 0.0)  # refuses an outage here
    p = plan.fragments

    def streaming(rec, first_sync):
        emit(*streaming_frames(plan, rec, first_round=first_sync // p))
    pre, delay = segment_matrices(scenario, plan)
    allreduce = max(plan.comm_s - outer, 0.0)
    offsets = node_offsets_s(scenario, plan)
    ckpt = _streaming_ckpt_s(scenario, plan, pre, delay)
    if engine == "simpy":
        return run_streaming_simpy(pre, delay, allreduce, outer, p, ckpt, node_offsets_s=offsets, emit=streaming,
                                   chunk_syncs=chunk_rounds * p)
    state = None
    for first in range(0, pre.shape[0], chunk_rounds * p):
        rows = slice(first, first + chunk_rounds * p)
        chunk = ckpt[first // p:first // p + chunk_rounds]
        rec = run_streaming_analytic(pre[rows], delay[rows], allreduce, outer, p, chunk, node_offsets_s=offsets,
                                     state=state)
        state = stream_state(rec, chunk[-1])
        streaming(rec, first)
    return None


def _streaming_ckpt_s(scenario: Scenario, plan: Plan, pre: np.ndarray, delay: np.ndarray) -> np.ndarray:
    """Per round, the checkpoint after its last fragment (simulator/models/checkpoints.py), from each
    round's compute (its fragments' segments) and its fragments' syncs."""
    rounds = pre.shape[0] // plan.fragments
    compute = (pre + delay)[:rounds * plan.fragments].reshape(rounds, plan.fragments, -1).sum(axis=1)
    return checkpoint_cost(scenario).block_s(round_s(compute, plan.comm_s))


def node_offsets_s(scenario: Scenario, plan: Plan) -> np.ndarray | None:
    """Per plan node, its own end of one of the plan's all-reduces (a fragment's: 1/P of the
    payload) less the collective's, where the network profile measured each node's own times
    (simulator/models/network.py node_sync_offsets_s); None otherwise and for sync-ddp's per-step
    all-reduces (the collective's time)."""
    if plan.sync == "gradients":
        return None
    offsets = node_sync_offsets_s(scenario, plan.payload_dtype or scenario.network.payload_dtype,
                                  plan.collective or scenario.network.collective, plan.fragments)
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
    """The outer step of one fragment sync (none for sync = gradients); comm_s − this is its all-reduce."""
    return 0.0 if plan.sync == "gradients" else outer_step_s(scenario) / plan.fragments


def _frame(plan: Plan, arrays: dict, columns: list[str], per_round: int = 1, first_round: int = 0) -> pd.DataFrame:
    """A tidy frame from (rows × nodes) arrays; categorical strategy and node, rounds (from
    first_round) and fragments. The rows come from compute_s where given (tokens may be 1 × nodes)."""
    rows, n = np.shape(arrays["compute_s" if "compute_s" in arrays else columns[-1]])
    names = [p.node for p in plan.nodes]
    # categorical columns: building 10^5 Python strings would cost more than the simulation
    frame = pd.DataFrame({
        "strategy": pd.Categorical.from_codes(np.zeros(rows * n, dtype=np.int8), [plan.strategy]),
        "node": pd.Categorical.from_codes(np.tile(np.arange(n), rows), names),
        "round": np.repeat(first_round + np.arange(rows) // per_round, n),
        **({"fragment": np.repeat(np.arange(rows) % per_round, n)} if "fragment" in columns else {}),
        **{k: np.ravel(np.broadcast_to(v, (rows, n))) for k, v in arrays.items() if k in columns}})
    return frame[columns]


def classic_syncs(timeline: pd.DataFrame, plan: Plan, outer_s: float) -> pd.DataFrame:
    """A classic round's one sync: the node stops at its sync point (= merge point), waits for the
    last node (idle), then the whole all-reduce is exposed, then the outer step."""
    sync_point = timeline["round_start_s"].to_numpy() + timeline["compute_s"].to_numpy()
    start = sync_point + timeline["idle_s"].to_numpy()
    allreduce = np.maximum(timeline["comm_s"].to_numpy() - outer_s, 0.0)
    frame = timeline[["strategy", "node", "round"]].copy()
    frame.insert(3, "fragment", 0)
    frame = frame.assign(compute_start_s=timeline["round_start_s"].to_numpy(), sync_point_s=sync_point,
                         start_s=start, end_s=start + allreduce, merge_point_s=sync_point,
                         idle_s=timeline["idle_s"].to_numpy(), exposed_s=allreduce, outer_s=outer_s)
    return frame[SYNC_COLUMNS].reset_index(drop=True)


def streaming_frames(plan: Plan, rec: dict, first_round: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(timeline, syncs) from the fragment-sync records (K × nodes, K = rounds × P), the first
    of round first_round."""
    p = plan.fragments
    end = rec["node_end_s"]  # each node's own end of each all-reduce (K × nodes)
    start = np.asarray(rec["start_s"])[:, None]
    merge = rec["merge_point_s"]
    waited, idle, exposed, _ = wait_split(merge, start, end)
    outer = rec["resume_s"] - waited
    per_sync = {"compute_start_s": rec["compute_start_s"], "sync_point_s": rec["sync_point_s"], "start_s": start,
                "end_s": end, "merge_point_s": merge, "idle_s": idle, "exposed_s": exposed, "outer_s": outer}
    syncs = _frame(plan, per_sync, SYNC_COLUMNS, per_round=p, first_round=first_round)
    k_total, n = merge.shape
    by_round = lambda a: np.asarray(a).reshape(k_total // p, p, n)
    arrays = {"compute_s": by_round(merge - rec["compute_start_s"]).sum(axis=1), "idle_s": by_round(idle).sum(axis=1),
              "comm_s": by_round(exposed + outer).sum(axis=1),
              "round_start_s": by_round(rec["compute_start_s"])[:, 0], "round_end_s": by_round(rec["resume_s"])[:, -1],
              "tokens": round_tokens(plan)}
    return _frame(plan, arrays, TIMELINE_COLUMNS, first_round=first_round), syncs


def summary(timeline: pd.DataFrame | RunTotals, plan: Plan) -> pd.DataFrame:
    """Per node totals over all rounds; utilization = compute / (compute + idle + comm). From the
    timeline, or from its totals accumulated chunk by chunk (simulator/models/totals.py); tokens are
    those the rounds trained on (an adaptive plan's vary, an outage's lost rounds train none)."""
    run = timeline if isinstance(timeline, RunTotals) else RunTotals.of(timeline)
    totals = run.node_frame()
    if run.node_tokens is None:  # a timeline without the tokens column (written before it was one)
        totals["tokens"] = totals["node"].map({n.node: n.tokens_per_round(plan.seq_len) * run.rounds
                                               for n in plan.nodes})
    else:
        totals["tokens"] = run.node_tokens
    busy_s = totals["compute_s"] + totals["idle_s"] + totals["comm_s"]
    # a node lost for every round spent no time in the run: it computed none of it (0, not 0/0)
    totals["utilization"] = (totals["compute_s"] / busy_s.where(busy_s > 0)).fillna(0.0)
    totals.insert(0, "strategy", plan.strategy)
    return totals[SUMMARY_COLUMNS]
