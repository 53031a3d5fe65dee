"""simulate(scenario, plan, engine) -> the timeline DataFrame; summary(timeline, plan) -> per node totals."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from formats.errors import InputError
from formats.plan import Plan
from formats.timeline import SUMMARY_COLUMNS, TIMELINE_COLUMNS
from simulator.engine_analytic import run_analytic
from simulator.engine_simpy import run_simpy
from simulator.network import checkpoint_s
from simulator.scenario import Scenario
from simulator.workload import compute_matrix

ENGINES = ("simpy", "analytic")


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
    """Timeline (one row per node and round, rounds outer) with docs/DESIGN.md's columns."""
    runners = {"simpy": run_simpy, "analytic": run_analytic}
    if engine not in runners:
        raise InputError(f"--engine {engine}: unknown engine; expected one of {', '.join(ENGINES)}")
    check_size(scenario, plan)
    compute = compute_matrix(scenario, plan)
    arrays = runners[engine](compute, plan.comm_s, checkpoint_s(scenario))
    rounds, n = compute.shape
    names = [p.node for p in plan.nodes]
    # categorical columns: building 10^5 Python strings would cost more than the simulation
    frame = pd.DataFrame({
        "strategy": pd.Categorical.from_codes(np.zeros(rounds * n, dtype=np.int8), [plan.strategy]),
        "node": pd.Categorical.from_codes(np.tile(np.arange(n), rounds), names),
        "round": np.repeat(np.arange(rounds), n),
        **{k: np.ravel(v) for k, v in arrays.items()}})
    return frame[TIMELINE_COLUMNS]


def summary(timeline: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Per node totals over all rounds; utilization = compute / (compute + idle + comm)."""
    totals = timeline.groupby("node", sort=False, observed=True)[["compute_s", "idle_s", "comm_s"]].sum().reset_index()
    rounds = timeline["round"].nunique()
    tokens = {n.node: n.tokens_per_round(plan.seq_len) * rounds for n in plan.nodes}
    totals["node"] = totals["node"].astype(str)
    totals["tokens"] = totals["node"].map(tokens)
    totals["utilization"] = totals["compute_s"] / (totals["compute_s"] + totals["idle_s"] + totals["comm_s"])
    totals.insert(0, "strategy", plan.strategy)
    return totals[SUMMARY_COLUMNS]
