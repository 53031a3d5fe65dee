"""Timelines as Chrome / Perfetto trace-event JSON: open `trace.json` in ui.perfetto.dev or chrome://tracing.

Input: frames with the timeline columns (docs/DESIGN.md, "Outputs"): strategy, node, round, compute_s,
idle_s, comm_s, round_start_s, round_end_s; `timeline.csv` from the simulator or `trace.csv`
from a real run (whose extra `tokens` column is used when present). Output: the JSON object
form of the trace-event format, {"traceEvents": [...], "displayTimeUnit": "ms"}, where

- each source (a strategy of a simulation, or "predicted" and "measured" of a validation;
  "emulated" for a run under --emulate, never "measured") is one process (pid), named by a
  `process_name` metadata event;
- each node is one thread (tid) of it, named by a `thread_name` event, in the plan's order;
- each round of a node is three complete events (ph "X") on its thread: `compute`, `idle`
  (the wait at the sync barrier) and `sync` (the outer all-reduce and optimizer step), back to
  back from round_start_s, with args round, tokens (the node's tokens that round) and seconds;
  a part that lasted 0 s (the slowest node's idle) has no event.

Timestamps and durations are microseconds (the format's unit): dur = seconds × 1e6, and each
part starts where the previous one ends (ts + dur), so the parts of one node never overlap.
A round starting an instant (floating-point rounding) before the previous one ended starts at
its end instead. Torch-free, for `geodt simulate` (simulation_trace_text), `geodt run` (run_trace,
trace_csv_to_json) and `geodt validate` (validation_trace).

The slices are computed as columns (source_slices), then written either as dicts
(trace_document: the reference, small traces) or straight to JSON text by one format over all
slices (trace_json_text: the same bytes as json.dumps of the dicts, tested, ~15 times faster).
`geodt simulate` keeps the first rounds up to TRACE_MAX_NODE_ROUNDS node-rounds (trace_rounds)
unless --full-trace: a trace is for looking at, and past that size ui.perfetto.dev opens it slowly.

A Streaming DiLoCo strategy (given its fragment syncs, formats.timeline.SYNC_COLUMNS) is drawn per
fragment sync instead (`streaming_events`, the dict path): on the node's thread `compute` up to
the merge point, then `idle` and `sync` (exposed comm and the outer step); on a second thread per
node, "<node> all-reduce", each fragment's all-reduce from its start to its end, beside the
compute it overlaps.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from formats.timeline import MODES, TIMELINE_COLUMNS
from simulator.outputs.outputs import write_text

# `geodt simulate` writes the first rounds up to this many node-rounds (rows of the timeline) into
# trace.json, about 3 slices (0.6 kB) each: for 1024 nodes x 200 rounds, rounds 0-18 in 12 MB,
# written in about 0.4 s (three float reprs a slice bound it), where every round is 122 MB, past
# what ui.perfetto.dev opens comfortably. Without jitter the rounds after them repeat the same
# pattern; --full-trace writes every round. (50,000 until the whole `geodt simulate` process had
# to stay within 3x its bare event loop: the trace was a fifth of it, issue 32.)
TRACE_MAX_NODE_ROUNDS = 20_000
# slice name, timeline column, catapult colour name (chrome://tracing; Perfetto colours by name)
PARTS = (("compute", "compute_s", "thread_state_running"), ("idle", "idle_s", "terrible"),
         ("sync", "comm_s", "thread_state_iowait"))
US_PER_S = 1e6


def _check(frame: pd.DataFrame, label: str) -> None:
    # the columns the slices are drawn from (a timeline or trace written before `tokens` was one still reads)
    missing = [c for c in TIMELINE_COLUMNS if c not in frame.columns and c != "tokens"]
    if missing:
        raise ValueError(f"{label}: missing timeline columns {', '.join(missing)}")
    for column in ("compute_s", "idle_s", "comm_s", "round_start_s"):
        values = frame[column].to_numpy(float)
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            row = frame[bad].iloc[0]
            raise ValueError(f"{label}: node {row['node']}, round {row['round']}: {column} = {row[column]}; "
                             f"expected a finite number >= 0")


def _tokens(frame: pd.DataFrame, nodes: np.ndarray, plan_frame: pd.DataFrame | None) -> np.ndarray | None:
    """Per row, the node's tokens that round (int64, -1 where not known): the frame's own `tokens`
    (trace.csv), else plan.csv's tokens_per_round for the row's strategy and node; None if neither."""
    if "tokens" in frame.columns:
        return frame["tokens"].to_numpy(np.int64)
    if plan_frame is None:
        return None
    plan = plan_frame[["strategy", "node", "tokens_per_round"]].astype({"strategy": str, "node": str})
    keys = pd.DataFrame({"strategy": frame["strategy"].astype(str).to_numpy(), "node": nodes})
    merged = keys.merge(plan.drop_duplicates(["strategy", "node"], keep="last"), how="left", on=["strategy", "node"])
    return merged["tokens_per_round"].fillna(-1).to_numpy(np.int64)


def _geometry(frame: pd.DataFrame, tids: np.ndarray, time_scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows in (node, round) order; per row and part the slice's ts and dur in µs.

    Returns (order, ts, dur) with ts and dur of shape (rows, 3). Round r of a node starts at
    max(its round_start_s, where round r-1 of the node ended): the same floating-point sums a
    loop over rows would make (x + 0.0 is x, so a 0 s part moves nothing), round by round
    across all nodes at once."""
    order = np.lexsort((frame["round"].to_numpy(), tids))
    start = frame["round_start_s"].to_numpy(float)[order] / time_scale * US_PER_S
    dur = np.stack([frame[column].to_numpy(float)[order] / time_scale * US_PER_S for _, column, _ in PARTS], axis=1)
    ts = np.empty_like(dur)
    rows = len(order)
    sorted_tids = tids[order]
    first = np.ones(rows, dtype=bool)
    first[1:] = sorted_tids[1:] != sorted_tids[:-1]
    position = np.arange(rows) - np.maximum.accumulate(np.where(first, np.arange(rows), 0))
    by_position = np.argsort(position, kind="stable")
    bounds = np.cumsum(np.bincount(position, minlength=1))[:-1] if rows else []
    end = np.empty(rows)
    for k, rows_k in enumerate(np.split(by_position, bounds) if rows else []):
        at = start[rows_k] if k == 0 else np.maximum(start[rows_k], end[rows_k - 1])
        for part in range(len(PARTS)):
            ts[rows_k, part] = at
            at = at + dur[rows_k, part]
        end[rows_k] = at
    return order, ts, dur


def source_slices(frame: pd.DataFrame, process: str, pid: int, plan_frame: pd.DataFrame | None = None,
                  time_scale: float = 1.0) -> tuple[list[dict], dict[str, np.ndarray]]:
    """One process: its metadata events, and its slices as columns (name index into PARTS, ts, dur,
    tid, round, seconds, tokens (-1: not known), in node, round, part order).

    Times are divided by time_scale first (a run emulated at time scale x, back in scenario seconds).
    """
    _check(frame, process)
    meta: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
                        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    codes, uniques = pd.factorize(frame["node"].astype(str), sort=False)  # tids in the plan's node order
    tids = codes.astype(np.int64) + 1
    for tid, node in enumerate(uniques, start=1):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": str(node)}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    order, ts, dur = _geometry(frame, tids, time_scale)
    seconds = np.stack([frame[column].to_numpy(float)[order] / time_scale for _, column, _ in PARTS], axis=1)
    kept = seconds != 0  # a part that lasted 0 s (the slowest node's idle) has no slice
    tokens = _tokens(frame, np.asarray(uniques.astype(str))[codes] if len(frame) else np.zeros(0, str), plan_frame)
    per_row = lambda values: np.repeat(values[order], len(PARTS)).reshape(-1, len(PARTS))[kept]
    slices = {"part": np.broadcast_to(np.arange(len(PARTS)), kept.shape)[kept], "ts": ts[kept], "dur": dur[kept],
              "tid": per_row(tids), "round": per_row(frame["round"].to_numpy(np.int64)), "seconds": seconds[kept],
              "tokens": per_row(tokens) if tokens is not None else np.full(int(kept.sum()), -1, np.int64)}
    return meta, slices


def _slice_dicts(slices: dict[str, np.ndarray], pid: int) -> list[dict]:
    events = []
    columns = [slices[k].tolist() for k in ("part", "ts", "dur", "tid", "round", "seconds", "tokens")]
    for part, ts, dur, tid, rnd, seconds, tokens in zip(*columns):
        args = {"round": rnd, "seconds": seconds}
        if tokens >= 0:
            args["tokens"] = tokens
        name, _, colour = PARTS[part]
        events.append({"name": name, "cat": "diloco", "ph": "X", "ts": ts, "dur": dur,
                       "pid": pid, "tid": tid, "cname": colour, "args": args})
    return events


def source_events(frame: pd.DataFrame, process: str, pid: int, plan_frame: pd.DataFrame | None = None,
                  time_scale: float = 1.0) -> list[dict]:
    """One process's events: metadata, then per node (one thread each) its compute, idle and sync slices."""
    meta, slices = source_slices(frame, process, pid, plan_frame, time_scale)
    return meta + _slice_dicts(slices, pid)


def _sources(sources, plan_frame, time_scales):
    scales = list(time_scales) if time_scales is not None else [1.0] * len(sources)
    return [(pid, *source_slices(frame, name, pid, plan_frame, scale))
            for pid, ((name, frame), scale) in enumerate(zip(sources, scales), start=1)]


def trace_document(sources: Sequence[tuple[str, pd.DataFrame]], plan_frame: pd.DataFrame | None = None,
                   time_scales: Sequence[float] | None = None, note: str = "") -> dict:
    """The trace-event JSON object: one process per (name, frame) source, pids 1, 2, ... in order."""
    events: list[dict] = []
    for pid, meta, slices in _sources(sources, plan_frame, time_scales):
        events += meta + _slice_dicts(slices, pid)
    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    if note:
        doc["otherData"] = {"geodt": note}
    return doc


def _slices_text(slices: dict[str, np.ndarray], pid: int) -> str:
    """The slices as trace-event JSON, exactly as json.dumps writes their dicts (_slice_dicts), formatted
    by one `%` of a repeated event template instead of one dict per slice (10^5 slices in 0.2 s)."""
    count = len(slices["ts"])
    if not count:
        return ""
    names = np.array([json.dumps(name) for name, _, _ in PARTS], dtype=object)[slices["part"]]
    colours = np.array([json.dumps(colour) for _, _, colour in PARTS], dtype=object)[slices["part"]]
    tokens = slices["tokens"]
    columns = [names, slices["ts"], slices["dur"], slices["tid"], colours, slices["round"], slices["seconds"]]
    template = ('{"name":%s,"cat":"diloco","ph":"X","ts":%r,"dur":%r,"pid":' + str(pid)
                + ',"tid":%d,"cname":%s,"args":{"round":%d,"seconds":%r')
    if (tokens >= 0).all():
        template += ',"tokens":%d}}'
        columns.append(tokens)
    elif (tokens < 0).all():
        template += "}}"
    else:
        template += "%s}}"
        columns.append(np.array([f',"tokens":{t}' if t >= 0 else "" for t in tokens.tolist()], dtype=object))
    cells = np.empty((count, len(columns)), dtype=object)
    for j, column in enumerate(columns):
        cells[:, j] = column.tolist()
    return ((template + ",") * count % tuple(cells.ravel().tolist()))[:-1]


def trace_json_text(sources: Sequence[tuple[str, pd.DataFrame]], plan_frame: pd.DataFrame | None = None,
                    time_scales: Sequence[float] | None = None, note: str = "") -> str:
    """trace_text(trace_document(...)) byte for byte, without building a dict per slice."""
    parts = []
    for pid, meta, slices in _sources(sources, plan_frame, time_scales):
        parts += [json.dumps(event, separators=(",", ":"), allow_nan=False) for event in meta]
        text = _slices_text(slices, pid)
        if text:
            parts.append(text)
    tail = ',"otherData":' + json.dumps({"geodt": note}, separators=(",", ":")) if note else ""
    return '{"traceEvents":[' + ",".join(parts) + '],"displayTimeUnit":"ms"' + tail + "}\n"


def _by_strategy(frame: pd.DataFrame, prefix: str = "") -> list[tuple[str, pd.DataFrame]]:
    strategies = list(dict.fromkeys(str(s) for s in frame["strategy"]))
    return [(f"{prefix}{s}", frame[frame["strategy"].astype(str) == s]) for s in strategies]


SIMULATION_NOTE = "simulated timeline; times in the scenario's seconds"


def simulation_trace(timeline: pd.DataFrame, plan_frame: pd.DataFrame | None = None,
                     syncs: pd.DataFrame | None = None, note: str = SIMULATION_NOTE) -> dict:
    """`geodt simulate`: one process per strategy; tokens from plan.csv's tokens_per_round. With the
    fragment syncs, Streaming DiLoCo strategies are drawn per fragment sync (streaming_events)."""
    doc = trace_document(_by_strategy(timeline), plan_frame, note=note)
    streaming = _streaming(plan_frame, syncs)
    if not streaming:
        return doc
    pids = {name: pid for pid, (name, _) in enumerate(_by_strategy(timeline), start=1)}
    redrawn = {pids[name] for name in streaming if name in pids}
    events = [event for event in doc["traceEvents"] if event["pid"] not in redrawn]
    for name in streaming:
        if name in pids:
            events += streaming_events(syncs[syncs["strategy"].astype(str) == name], name, pids[name])
    doc["traceEvents"] = events
    return doc


def _streaming(plan_frame: pd.DataFrame | None, syncs: pd.DataFrame | None) -> list[str]:
    """The Streaming DiLoCo strategies of a plan.csv frame (fragments > 1 or a delay), when syncs are given."""
    if syncs is None or plan_frame is None or "fragments" not in plan_frame.columns:
        return []
    rows = plan_frame[(plan_frame["fragments"] > 1) | (plan_frame["sync_delay_steps"] > 0)]
    return list(dict.fromkeys(rows["strategy"].astype(str)))


def trace_rounds(timeline: pd.DataFrame, max_node_rounds: int | None = TRACE_MAX_NODE_ROUNDS) -> int | None:
    """How many first rounds `geodt simulate`'s trace.json keeps: None (all) when the timeline has at
    most max_node_rounds rows (or no cap is set), else the most rounds whose rows, over every
    strategy, stay within it; at least one."""
    if max_node_rounds is None or len(timeline) <= max_node_rounds:
        return None
    rows_before = np.cumsum(np.bincount(timeline["round"].to_numpy(np.int64)))  # rows of rounds < k + 1
    return max(1, int(np.searchsorted(rows_before, max_node_rounds, side="right")))


def simulation_trace_text(timeline: pd.DataFrame, plan_frame: pd.DataFrame | None = None,
                          max_node_rounds: int | None = TRACE_MAX_NODE_ROUNDS,
                          syncs: pd.DataFrame | None = None,
                          total_rounds: int | None = None) -> tuple[str, int | None]:
    """trace.json of `geodt simulate` as text, and how many first rounds it holds (None: all of them).
    With Streaming DiLoCo strategies among the syncs, the dict path (simulation_trace).
    total_rounds: the run's rounds where `timeline` holds only its first ones (every strategy's
    rounds below max_node_rounds / its nodes + 2 at least, so that the rounds kept are the same)."""
    kept = trace_rounds(timeline, max_node_rounds)
    note = SIMULATION_NOTE
    if kept is not None:
        total = int(timeline["round"].max()) + 1 if total_rounds is None else total_rounds
        timeline = timeline[timeline["round"].to_numpy() < kept]
        syncs = None if syncs is None else syncs[syncs["round"].to_numpy() < kept]
        note += (f"; rounds 0-{kept - 1} of {total} (at most {max_node_rounds:,} node-rounds; "
                 "geodt simulate --full-trace writes every round)")
    if _streaming(plan_frame, syncs):
        return trace_text(simulation_trace(timeline, plan_frame, syncs, note)), kept
    return trace_json_text(_by_strategy(timeline), plan_frame, note=note), kept


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
                events.append({"name": name, "cat": "diloco", "ph": "X", "ts": float(ts),
                               "dur": float(seconds * US_PER_S), "pid": pid, "tid": 2 * k + 1, "cname": colour,
                               "args": {**args, "seconds": float(seconds)}})
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


def run_trace(trace: pd.DataFrame, emulated: bool = False) -> dict:
    """`geodt run`: trace.csv as measured, or as emulated (steps padded to the plan's): each node on
    its own clock, real seconds."""
    kind = MODES[emulated]
    return trace_document(_by_strategy(trace, f"{kind}: "), note=f"{kind} trace.csv; real seconds")


def validation_trace(timeline: pd.DataFrame, trace: pd.DataFrame, time_scale: float = 1.0,
                     plan_frame: pd.DataFrame | None = None, emulated: bool = False) -> dict:
    """`geodt validate`: predicted (timeline, the trace's rounds only) and measured (trace) side by side;
    an emulated run's track is named "emulated", never "measured".

    Measured times are divided by time_scale, as in validation.csv, so both are in the scenario's seconds.
    """
    rounds = set(trace["round"])
    predicted = timeline[timeline["round"].isin(rounds)]
    strategy = str(timeline["strategy"].iloc[0]) if len(timeline) else ""
    kind = MODES[emulated]
    note = f"predicted vs {kind}" + (f"; {kind} times divided by the time scale {time_scale:g}"
                                     if time_scale != 1.0 else "")
    return trace_document([(f"predicted: {strategy}", predicted), (f"{kind}: {strategy}", trace)],
                          plan_frame, [1.0, time_scale], note=note)


def trace_text(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n"


def write_trace_json(doc: dict, path: str | Path) -> Path:
    """Write the document whole or not at all (simulator.outputs.outputs' temp name, then rename)."""
    write_text(path, trace_text(doc))
    return Path(path)


def trace_csv_to_json(trace_csv: str | Path, json_path: str | Path, emulated: bool = False) -> Path:
    """trace.csv of `geodt run` -> trace.json beside it (or where given); emulated: the run's steps
    were padded (--emulate), and its track says so."""
    return write_trace_json(run_trace(pd.read_csv(trace_csv), emulated), json_path)
