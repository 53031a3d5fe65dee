"""Rounds without a barrier (formats/rounds.py's async and quorum kinds): the timeline from engine_async's clocks.

The timeline carries the staleness columns beside (STALE_FIELDS: not written to timeline files;
summary.csv's staleness comes from them); the syncs table is the classic one (each node's one
sync a round). Checkpoints are not priced here; an outage is refused. Handed on as one chunk: its
rounds end node by node, not together.
"""
from __future__ import annotations

from abc import abstractmethod

import numpy as np
import pandas as pd

from formats.errors import InputError
from formats.plan import Plan, quorum_need
from formats.timeline import TIMELINE_COLUMNS
from simulator.engines.engine_async import STALE_FIELDS, run_async_analytic, run_async_simpy, run_quorum_simpy
from simulator.engines.engine_async import service_s as async_service_s
from simulator.engines.frames import RoundEngine, checked_engine, classic_syncs, frame, outer_share_s, round_tokens
from simulator.models import outage
from simulator.models.workload import compute_matrix
from simulator.scenario import Scenario


class ServerRounds(RoundEngine):
    """What async and quorum rounds share: the checks, the frame, the syncs table."""

    @abstractmethod
    def arrays(self, scenario: Scenario, plan: Plan, compute: np.ndarray, engine: str) -> dict:
        """The clock's per node and round arrays (engine_async.py)."""

    def timeline(self, scenario: Scenario, plan: Plan, engine: str) -> pd.DataFrame:
        engine = checked_engine(scenario, plan, engine)
        if outage.outages(scenario, plan):
            raise InputError(f"strategy {plan.strategy}: a node's outage is modelled for barrier rounds only; "
                             "expected no [[nodes]] outage with async or quorum")
        arrays = self.arrays(scenario, plan, compute_matrix(scenario, plan), engine)
        return frame(plan, {**arrays, "tokens": round_tokens(plan)}, TIMELINE_COLUMNS + STALE_FIELDS)

    def syncs(self, scenario: Scenario, plan: Plan, engine: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        timeline = self.timeline(scenario, plan, engine)
        return timeline, classic_syncs(timeline, plan, outer_share_s(scenario, plan))


class AsyncRounds(ServerRounds):
    """A parameter server, first come first served, in SimPy or its analytic twin."""

    def arrays(self, scenario: Scenario, plan: Plan, compute: np.ndarray, engine: str) -> dict:
        return (run_async_simpy if engine == "simpy" else run_async_analytic)(compute, async_service_s(scenario, plan))


class QuorumRounds(ServerRounds):
    """Rounds closed by ⌈quorum·n⌉ arrivals plus a grace window: SimPy only."""

    def arrays(self, scenario: Scenario, plan: Plan, compute: np.ndarray, engine: str) -> dict:
        quorum = plan.quorum  # the kind's own settings (formats/plan.py QuorumSettings)
        return run_quorum_simpy(compute, quorum_need(quorum.share, len(plan.nodes)), quorum.grace_s, plan.comm_s)
