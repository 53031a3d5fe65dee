"""Timelines as Chrome / Perfetto trace-event JSON: open `trace.json` in ui.perfetto.dev or chrome://tracing.

Input: frames with the timeline columns (docs/DESIGN.md, "Outputs"): strategy, node, round, compute_s,
idle_s, comm_s, round_start_s, round_end_s; `timeline.csv` from the simulator or `trace.csv`
from a real run (whose extra `tokens` column is used when present). Output: the JSON object
form of the trace-event format, {"traceEvents": [...], "displayTimeUnit": "ms"}, where

- each source (a strategy of a simulation, or "predicted" and "measured" of a validation) is
  one process (pid), named by a `process_name` metadata event;
- each node is one thread (tid) of it, named by a `thread_name` event, in the plan's order;
- each round of a node is three complete events (ph "X") on its thread: `compute`, `idle`
  (the wait at the sync barrier) and `sync` (the outer all-reduce and optimizer step), back to
  back from round_start_s, with args round, tokens (the node's tokens that round) and seconds;
  a part that lasted 0 s (the slowest node's idle) has no event.

Timestamps and durations are microseconds (the format's unit): dur = seconds × 1e6, and each
part starts where the previous one ends (ts + dur), so the parts of one node never overlap.
A round starting an instant (floating-point rounding) before the previous one ended starts at
its end instead.

A Streaming DiLoCo strategy (given its fragment syncs, engine.SYNC_COLUMNS) is drawn per fragment
sync instead (`streaming_events`): on the node's thread `compute` up to the merge point, then
`idle` and `sync` (exposed comm and the outer step); on a second thread per node, "<node> all-reduce",
each fragment's all-reduce from its start to its end, overlapping the compute beside it. Torch-free, for `geodt simulate` (simulation_trace), `geodt run` (run_trace,
trace_csv_to_json) and `geodt validate` (validation_trace).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.engine import TIMELINE_COLUMNS
from simulator.outputs import write_text

# slice name, timeline column, catapult colour name (chrome://tracing; Perfetto colours by name)
PARTS = (("compute", "compute_s", "thread_state_running"), ("idle", "idle_s", "terrible"),
         ("sync", "comm_s", "thread_state_iowait"))
US_PER_S = 1e6


def _check(frame: pd.DataFrame, label: str) -> None:
    missing = [c for c in TIMELINE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{label}: missing timeline columns {', '.join(missing)}")
    for column in ("compute_s", "idle_s", "comm_s", "round_start_s"):
        values = frame[column].to_numpy(float)
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            row = frame[bad].iloc[0]
            raise ValueError(f"{label}: node {row['node']}, round {row['round']}: {column} = {row[column]}; "
                             f"expected a finite number >= 0")


def _tokens(frame: pd.DataFrame, nodes: np.ndarray, plan_frame: pd.DataFrame | None) -> list:
    """Per row, the node's tokens that round: the frame's own `tokens` (trace.csv), else plan.csv's
    tokens_per_round for the row's strategy and node, else None (not known)."""
    if "tokens" in frame.columns:
        return [int(t) for t in frame["tokens"]]
    if plan_frame is None:
        return [None] * len(frame)
    per_round = {(str(s), str(n)): int(t) for s, n, t in
                 plan_frame[["strategy", "node", "tokens_per_round"]].itertuples(index=False)}
    return [per_round.get((str(s), n)) for s, n in zip(frame["strategy"], nodes)]


def source_events(frame: pd.DataFrame, process: str, pid: int, plan_frame: pd.DataFrame | None = None,
                  time_scale: float = 1.0) -> list[dict]:
    """One process's events: metadata, then per node (one thread each) its compute, idle and sync slices.

    Times are divided by time_scale first (a run emulated at time scale x, back in scenario seconds).
    """
    _check(frame, process)
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
                          {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    nodes = frame["node"].astype(str).to_numpy()
    tids = {node: tid for tid, node in enumerate(dict.fromkeys(nodes), start=1)}  # the plan's node order
    for node, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": node}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    rounds = frame["round"].to_numpy()
    order = np.lexsort((rounds, np.array([tids[n] for n in nodes], dtype=np.int64)))  # by node, then round
    start = frame["round_start_s"].to_numpy(float)
    parts = [(name, frame[column].to_numpy(float), colour) for name, column, colour in PARTS]
    tokens = _tokens(frame, nodes, plan_frame)
    end_us, last_tid = -math.inf, None
    for i in order:
        tid = tids[nodes[i]]
        if tid != last_tid:
            end_us, last_tid = -math.inf, tid
        ts = max(start[i] / time_scale * US_PER_S, end_us)
        for name, values, colour in parts:
            seconds = values[i] / time_scale
            if seconds == 0:
                continue
            dur = seconds * US_PER_S
            args = {"round": int(rounds[i]), "seconds": float(seconds)}
            if tokens[i] is not None:
                args["tokens"] = tokens[i]
            events.append({"name": name, "cat": "diloco", "ph": "X", "ts": float(ts), "dur": float(dur),
                           "pid": pid, "tid": tid, "cname": colour, "args": args})
            ts = ts + dur
        end_us = ts
    return events


def trace_document(sources: Sequence[tuple[str, pd.DataFrame]], plan_frame: pd.DataFrame | None = None,
                   time_scales: Sequence[float] | None = None, note: str = "") -> dict:
    """The trace-event JSON object: one process per (name, frame) source, pids 1, 2, ... in order."""
    scales = list(time_scales) if time_scales is not None else [1.0] * len(sources)
    events: list[dict] = []
    for pid, ((name, frame), scale) in enumerate(zip(sources, scales), start=1):
        events += source_events(frame, name, pid, plan_frame, scale)
    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    if note:
        doc["otherData"] = {"geodt": note}
    return doc


def _by_strategy(frame: pd.DataFrame, prefix: str = "") -> list[tuple[str, pd.DataFrame]]:
    strategies = list(dict.fromkeys(str(s) for s in frame["strategy"]))
    return [(f"{prefix}{s}", frame[frame["strategy"].astype(str) == s]) for s in strategies]


def simulation_trace(timeline: pd.DataFrame, plan_frame: pd.DataFrame | None = None,
                     syncs: pd.DataFrame | None = None) -> dict:
    """`geodt simulate`: one process per strategy; tokens from plan.csv's tokens_per_round. With the
    fragment syncs, Streaming DiLoCo strategies (plan_frame's fragments > 1 or sync_delay_steps > 0)
    are drawn per fragment sync, their all-reduces on a track of their own."""
    doc = trace_document(_by_strategy(timeline), plan_frame, note="simulated timeline; times in the scenario's seconds")
    if syncs is None or plan_frame is None or "fragments" not in plan_frame.columns:
        return doc
    streaming = set(plan_frame.loc[(plan_frame["fragments"] > 1) | (plan_frame["sync_delay_steps"] > 0), "strategy"])
    if not streaming:
        return doc
    kept, sources = [], _by_strategy(timeline)
    pids = {name: pid for pid, (name, _) in enumerate(sources, start=1)}
    for event in doc["traceEvents"]:
        if not any(event["pid"] == pids[s] for s in streaming if s in pids):
            kept.append(event)
    for name in streaming:
        if name in pids:
            frame = syncs[syncs["strategy"].astype(str) == name]
            kept += streaming_events(frame, name, pids[name])
    doc["traceEvents"] = kept
    return doc


def streaming_events(syncs: pd.DataFrame, process: str, pid: int) -> list[dict]:
    """One Streaming DiLoCo strategy's events from its fragment syncs (module docstring)."""
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
                          {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    nodes = list(dict.fromkeys(syncs["node"].astype(str)))
    for k, node in enumerate(nodes):
        for tid, label in ((2 * k + 1, node), (2 * k + 2, f"{node} all-reduce")):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for k, node in enumerate(nodes):
        rows = syncs[syncs["node"].astype(str) == node]
        end_us = -math.inf
        for r in rows.itertuples(index=False):
            args = {"round": int(r.round), "fragment": int(r.fragment)}
            ts = max(r.compute_start_s * US_PER_S, end_us)
            parts = (("compute", r.merge_point_s - r.compute_start_s, "thread_state_running"),
                     ("idle", r.idle_s, "terrible"), ("sync", r.exposed_s + r.outer_s, "thread_state_iowait"))
            for name, seconds, colour in parts:
                if seconds <= 0:
                    continue
                events.append({"name": name, "cat": "diloco", "ph": "X", "ts": float(ts), "dur": float(seconds * US_PER_S),
                               "pid": pid, "tid": 2 * k + 1, "cname": colour, "args": {**args, "seconds": float(seconds)}})
                ts = ts + seconds * US_PER_S
            end_us = ts
            span = r.end_s - r.start_s
            if span > 0:
                hidden = max(span - r.exposed_s, 0.0)
                events.append({"name": "all-reduce", "cat": "diloco", "ph": "X", "ts": float(r.start_s * US_PER_S),
                               "dur": float(span * US_PER_S), "pid": pid, "tid": 2 * k + 2, "cname": "generic_work",
                               "args": {**args, "seconds": float(span), "exposed_s": float(r.exposed_s),
                                        "hidden_s": float(hidden)}})
    return events


def run_trace(trace: pd.DataFrame) -> dict:
    """`geodt run`: trace.csv as measured (each node on its own clock, real seconds)."""
    return trace_document(_by_strategy(trace, "measured: "), note="measured trace.csv; real seconds")


def validation_trace(timeline: pd.DataFrame, trace: pd.DataFrame, time_scale: float = 1.0,
                     plan_frame: pd.DataFrame | None = None) -> dict:
    """`geodt validate`: predicted (timeline, the trace's rounds only) and measured (trace) side by side.

    Measured times are divided by time_scale, as in validation.csv, so both are in the scenario's seconds.
    """
    rounds = set(trace["round"])
    predicted = timeline[timeline["round"].isin(rounds)]
    strategy = str(timeline["strategy"].iloc[0]) if len(timeline) else ""
    note = "predicted vs measured" + (f"; measured times divided by the time scale {time_scale:g}"
                                      if time_scale != 1.0 else "")
    return trace_document([(f"predicted: {strategy}", predicted), (f"measured: {strategy}", trace)],
                          plan_frame, [1.0, time_scale], note=note)


def trace_text(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n"


def write_trace_json(doc: dict, path: str | Path) -> Path:
    """Write the document whole or not at all (simulator.outputs' temp name, then rename)."""
    write_text(path, trace_text(doc))
    return Path(path)


def trace_csv_to_json(trace_csv: str | Path, json_path: str | Path) -> Path:
    """trace.csv of `geodt run` -> trace.json beside it (or where given)."""
    return write_trace_json(run_trace(pd.read_csv(trace_csv)), json_path)
