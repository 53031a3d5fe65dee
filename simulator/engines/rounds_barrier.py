"""Rounds with a barrier and one sync each (DiLoCo, sync-ddp), on the analytic path or SimPy's events.

Every node computes its round, waits at the barrier for the slowest, then the one all-reduce (and,
for DiLoCo, the outer step: formats/rounds.py `outer_step`). An adaptive plan's rounds and an
outage's time are settled on the whole run (simulator/models/adaptive.py, simulator/models/outage.py);
the others are handed on in chunks of whole rounds as they are produced.
"""
from __future__ import annotations

import pandas as pd

from formats.plan import Plan
from formats.timeline import TIMELINE_COLUMNS
from simulator.engines.engine_analytic import next_start_s, run_analytic
from simulator.engines.engine_simpy import run_simpy
from simulator.engines.frames import (
    RoundEngine,
    checked_engine,
    classic_syncs,
    frame,
    node_comm_s,
    outer_share_s,
    round_tokens,
)
from simulator.models import outage
from simulator.models.adaptive import adaptive_rounds
from simulator.models.checkpoints import checkpoint_cost, round_s
from simulator.models.workload import compute_matrix
from simulator.scenario import Scenario


def whole_rounds(scenario: Scenario, plan: Plan, engine: str) -> dict:
    """The plan's arrays (tokens included), every round at once: an adaptive plan's rounds
    depend on what the rounds before measured (simulator/models/adaptive.py), an outage is settled on the
    whole arrays (simulator/models/outage.py)."""
    comm = node_comm_s(scenario, plan)
    compute, steps = adaptive_rounds(scenario, plan, comm) if plan.adaptive else (compute_matrix(scenario, plan), None)
    compute, fixups = outage.prepare(scenario, plan, compute, comm)  # a node lost for a while
    ckpt = checkpoint_cost(scenario).block_s(round_s(compute, comm))
    arrays = (run_simpy if engine == "simpy" else run_analytic)(compute, comm, ckpt)
    arrays, tokens = outage.settle(arrays, fixups, round_tokens(plan, steps))
    return {**arrays, "tokens": tokens}


class BarrierRounds(RoundEngine):
    """formats/rounds.py's diloco and gradients kinds: every node, one sync a round."""

    def timeline(self, scenario: Scenario, plan: Plan, engine: str) -> pd.DataFrame:
        engine = checked_engine(scenario, plan, engine)
        return frame(plan, whole_rounds(scenario, plan, engine), TIMELINE_COLUMNS)

    def syncs(self, scenario: Scenario, plan: Plan, engine: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        timeline = self.timeline(scenario, plan, engine)
        return timeline, classic_syncs(timeline, plan, outer_share_s(scenario, plan))

    def chunks(self, scenario: Scenario, plan: Plan, engine: str, emit, chunk_rounds: int) -> None:
        engine = checked_engine(scenario, plan, engine)
        outer = outer_share_s(scenario, plan)

        def classic(arrays, first_round):
            timeline = frame(plan, arrays, TIMELINE_COLUMNS, first_round=first_round)
            emit(timeline, classic_syncs(timeline, plan, outer))
        if plan.adaptive or outage.outages(scenario, plan):  # rounds made or settled on the whole run
            return classic(whole_rounds(scenario, plan, engine), 0)
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
