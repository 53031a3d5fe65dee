"""simulate(scenario, plan, engine) -> the timeline DataFrame; summary(timeline, plan) -> per node totals.

simulate_syncs also returns the fragment syncs (SYNC_COLUMNS, one row per node and sync).
simulate_chunks hands the same two tables on in chunks of whole rounds as they are produced
(`geodt simulate` writes them as they come: memory bounded by a chunk, not the run); the
chunks, concatenated, are simulate_syncs' tables (tests/test_simulate_chunks.py). Each kind of
round is timed by the engine its registry entry names (formats/rounds.py `engine`; frames.py
`engine_for`): rounds_barrier.py (DiLoCo, sync-ddp: an adaptive plan or one with an outage is
simulated whole and handed on as one chunk, its rounds made or settled over the whole run),
rounds_streaming.py (Streaming DiLoCo's fragment syncs) and rounds_server.py (async and quorum,
one chunk). Engine "auto" (pick_engine) is the analytic path wherever it is exact, else SimPy.
"""
from __future__ import annotations

import pandas as pd

from formats.plan import Plan
from formats.timeline import SUMMARY_COLUMNS
from simulator.engines.frames import (
    ENGINES,
    MAX_TIMELINE_ROWS,
    check_size,
    engine_for,
    node_comm_s,
    outer_share_s,
    pick_engine,
)
from simulator.engines.rounds_streaming import streaming_frames
from simulator.models.totals import RunTotals
from simulator.scenario import Scenario

# what the callers import from here (the engine choice, the size check and the sync arithmetic are frames.py's)
__all__ = ["ENGINES", "MAX_TIMELINE_ROWS", "check_size", "node_comm_s", "outer_share_s", "pick_engine", "simulate",
           "simulate_chunks", "simulate_syncs", "streaming_frames", "summary"]


def simulate(scenario: Scenario, plan: Plan, engine: str = "simpy") -> pd.DataFrame:
    """Timeline (one row per node and round, rounds outer) with docs/DESIGN.md's columns (and
    STALE_FIELDS for a plan without a barrier)."""
    return engine_for(plan).timeline(scenario, plan, engine)


def simulate_syncs(scenario: Scenario, plan: Plan, engine: str = "simpy") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(timeline, syncs): the timeline and one row per node and fragment sync (SYNC_COLUMNS)."""
    return engine_for(plan).syncs(scenario, plan, engine)


def simulate_chunks(scenario: Scenario, plan: Plan, engine: str, emit, chunk_rounds: int) -> None:
    """simulate_syncs' (timeline, syncs), handed to emit(timeline, syncs) in chunks of
    chunk_rounds whole rounds (the last shorter) as the engine produces them."""
    return engine_for(plan).chunks(scenario, plan, engine, emit, chunk_rounds)


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
