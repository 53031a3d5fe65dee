"""simulate(scenario, plan, engine) -> the timeline DataFrame; summary(timeline, plan) -> per node totals."""
from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.engine_analytic import run_analytic
from simulator.engine_simpy import run_simpy
from simulator.errors import InputError
from simulator.plan import Plan
from simulator.scenario import Scenario
from simulator.workload import compute_matrix

ENGINES = ("simpy", "analytic")
TIMELINE_COLUMNS = ["strategy", "node", "round", "compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s"]
SUMMARY_COLUMNS = ["strategy", "node", "compute_s", "idle_s", "comm_s", "tokens", "utilization"]


def simulate(scenario: Scenario, plan: Plan, engine: str = "simpy") -> pd.DataFrame:
    """Timeline (one row per node and round, rounds outer) with DESIGN.md's columns."""
    compute = compute_matrix(scenario, plan)
    names = [n.node for n in plan.nodes]
    if engine == "simpy":
        rows = sorted(run_simpy(compute, plan.comm_s), key=lambda row: (row[1], row[0]))
        frame = pd.DataFrame(rows, columns=["node", "round", *TIMELINE_COLUMNS[3:]])
        frame["node"] = [names[i] for i in frame["node"]]
    elif engine == "analytic":
        arrays = run_analytic(compute, plan.comm_s)
        rounds, n = compute.shape
        frame = pd.DataFrame({"node": np.tile(names, rounds), "round": np.repeat(np.arange(rounds), n),
                              **{k: v.ravel() for k, v in arrays.items()}})
    else:
        raise InputError(f"--engine {engine}: unknown engine; expected one of {', '.join(ENGINES)}")
    frame.insert(0, "strategy", plan.strategy)
    return frame[TIMELINE_COLUMNS]


def summary(timeline: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Per node totals over all rounds; utilization = compute / (compute + idle + comm)."""
    totals = timeline.groupby("node", sort=False)[["compute_s", "idle_s", "comm_s"]].sum().reset_index()
    rounds = timeline["round"].nunique()
    tokens = {n.node: n.tokens_per_round(plan.seq_len) * rounds for n in plan.nodes}
    totals["tokens"] = totals["node"].map(tokens)
    totals["utilization"] = totals["compute_s"] / (totals["compute_s"] + totals["idle_s"] + totals["comm_s"])
    totals.insert(0, "strategy", plan.strategy)
    return totals[SUMMARY_COLUMNS]
