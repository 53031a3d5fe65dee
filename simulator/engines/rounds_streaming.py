"""Streaming DiLoCo rounds: the model syncs in P fragments whose all-reduces overlap τ inner steps.

The fragment-sync engines (engine_analytic.run_streaming_analytic, engine_simpy.run_streaming_simpy)
record each node's segments and each fragment's all-reduce; `streaming_frames` makes the timeline
(one row per node and round) and the syncs table (one per node and fragment sync) from them.
An outage is refused (simulator/models/outage.py models it for classic rounds).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from formats.plan import Plan
from formats.timeline import SYNC_COLUMNS, TIMELINE_COLUMNS
from simulator.engines.engine_analytic import run_streaming_analytic, stream_state, wait_split
from simulator.engines.engine_simpy import run_streaming_simpy
from simulator.engines.frames import RoundEngine, checked_engine, frame, node_offsets_s, outer_share_s, round_tokens
from simulator.models import outage
from simulator.models.checkpoints import checkpoint_cost, round_s
from simulator.models.workload import segment_matrices
from simulator.scenario import Scenario


def streaming_ckpt_s(scenario: Scenario, plan: Plan, pre: np.ndarray, delay: np.ndarray) -> np.ndarray:
    """Per round, the checkpoint after its last fragment (simulator/models/checkpoints.py), from each
    round's compute (its fragments' segments) and its fragments' syncs."""
    rounds = pre.shape[0] // plan.fragments
    compute = (pre + delay)[:rounds * plan.fragments].reshape(rounds, plan.fragments, -1).sum(axis=1)
    return checkpoint_cost(scenario).block_s(round_s(compute, plan.comm_s))


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
    syncs = frame(plan, per_sync, SYNC_COLUMNS, per_round=p, first_round=first_round)
    k_total, n = merge.shape
    by_round = lambda a: np.asarray(a).reshape(k_total // p, p, n)
    arrays = {"compute_s": by_round(merge - rec["compute_start_s"]).sum(axis=1), "idle_s": by_round(idle).sum(axis=1),
              "comm_s": by_round(exposed + outer).sum(axis=1),
              "round_start_s": by_round(rec["compute_start_s"])[:, 0], "round_end_s": by_round(rec["resume_s"])[:, -1],
              "tokens": round_tokens(plan)}
    return frame(plan, arrays, TIMELINE_COLUMNS, first_round=first_round), syncs


class StreamingRounds(RoundEngine):
    """formats/rounds.py's streaming kind: P fragment syncs a round, overlapping compute."""

    def timeline(self, scenario: Scenario, plan: Plan, engine: str) -> pd.DataFrame:
        return self.syncs(scenario, plan, engine)[0]

    def syncs(self, scenario: Scenario, plan: Plan, engine: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        engine = checked_engine(scenario, plan, engine)
        outage.prepare(scenario, plan, np.zeros((1, len(plan.nodes))), 0.0)  # refuses an outage here
        pre, delay = segment_matrices(scenario, plan)
        outer = outer_share_s(scenario, plan)
        allreduce = max(plan.comm_s - outer, 0.0)
        run = run_streaming_simpy if engine == "simpy" else run_streaming_analytic
        rec = run(pre, delay, allreduce, outer, plan.fragments, streaming_ckpt_s(scenario, plan, pre, delay),
                  node_offsets_s=node_offsets_s(scenario, plan))
        return streaming_frames(plan, rec)

    def chunks(self, scenario: Scenario, plan: Plan, engine: str, emit, chunk_rounds: int) -> None:
        engine = checked_engine(scenario, plan, engine)
        outer = outer_share_s(scenario, plan)
        outage.prepare(scenario, plan, np.zeros((1, len(plan.nodes))), 0.0)  # refuses an outage here
        p = plan.fragments

        def streaming(rec, first_sync):
            emit(*streaming_frames(plan, rec, first_round=first_sync // p))
        pre, delay = segment_matrices(scenario, plan)
        allreduce = max(plan.comm_s - outer, 0.0)
        offsets = node_offsets_s(scenario, plan)
        ckpt = streaming_ckpt_s(scenario, plan, pre, delay)
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
