"""simulator/outputs/perfetto.py: timelines as Chrome / Perfetto trace-event JSON.

Checks the trace-event format's required fields (JSON object form; complete events "X" with
name, ph, ts, dur, pid, tid; metadata events "M" naming processes and threads), that the slices
of each node never overlap, and that they add up to the timeline's numbers.
"""
from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict

import pandas as pd
import pytest

from simulator.cli import simulate_main
from simulator.engines.engine import simulate
from simulator.outputs.perfetto import (
    SIMULATION_NOTE,
    _by_strategy,
    run_trace,
    simulation_trace,
    simulation_trace_text,
    trace_csv_to_json,
    trace_document,
    trace_json_text,
    trace_rounds,
    trace_text,
    validation_trace,
    write_trace_json,
)
from simulator.scenario import load_scenario
from simulator.strategies import STRATEGIES, make_plan

METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}
# the catapult colour names chrome://tracing accepts in `cname` (a subset: those used here)
CNAMES = {"thread_state_running", "terrible", "thread_state_iowait"}
PART_COLUMN = {"compute": "compute_s", "idle": "idle_s", "sync": "comm_s"}


def check_format(doc: dict) -> list[dict]:
    """Assert the trace-event format's required fields; return the complete ("X") events."""
    assert set(doc) <= {"traceEvents", "displayTimeUnit", "otherData"} and doc["displayTimeUnit"] in ("ms", "ns")
    doc = json.loads(trace_text(doc))  # what a viewer reads: strict JSON (no NaN), the same numbers
    slices, named_threads, named_processes = [], set(), set()
    for event in doc["traceEvents"]:
        assert isinstance(event["name"], str) and isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "M":
            assert event["name"] in METADATA and METADATA[event["name"]] in event["args"]
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
        else:
            assert event["ph"] == "X"
            for key in ("ts", "dur"):
                assert isinstance(event[key], (int, float)) and math.isfinite(event[key]) and event[key] >= 0
            assert event["dur"] > 0 and event["name"] in PART_COLUMN and event["cname"] in CNAMES
            assert isinstance(event["args"]["round"], int)
            slices.append(event)
    assert {(e["pid"], e["tid"]) for e in slices} <= named_threads
    assert {e["pid"] for e in slices} <= named_processes
    return slices


def tracks(slices: list[dict]) -> dict[tuple[int, int], list[dict]]:
    by_track = defaultdict(list)
    for e in slices:
        by_track[e["pid"], e["tid"]].append(e)
    return {k: sorted(v, key=lambda e: e["ts"]) for k, v in by_track.items()}


def assert_no_overlap(slices: list[dict]) -> None:
    for track in tracks(slices).values():
        for first, second in itertools.pairwise(track):
            assert second["ts"] >= first["ts"] + first["dur"]  # exactly as a viewer adds them


def names(doc: dict, kind: str) -> dict:
    return {(e["pid"], e["tid"]) if kind == "thread_name" else e["pid"]: e["args"]["name"]
            for e in doc["traceEvents"] if e["name"] == kind}


def test_hand_worked_scenario(write_scenario):
    """Steps 0.1, 0.2, 0.25 s, H = 10, 2 rounds: compute 1, 2, 2.5 s; idle 1.5, 0.5, 0 s per round."""
    scenario = load_scenario(str(write_scenario()))
    plan = make_plan(scenario, "baseline")
    timeline = simulate(scenario, plan, "simpy")
    doc = simulation_trace(timeline, plan.to_frame())
    slices = check_format(doc)
    assert names(doc, "process_name") == {1: "baseline"}
    assert names(doc, "thread_name") == {(1, 1): "a", (1, 2): "b", (1, 3): "c"}
    by_track = tracks(slices)
    expected = {1: [("compute", 1e6), ("idle", 1.5e6)], 2: [("compute", 2e6), ("idle", 0.5e6)],
                3: [("compute", 2.5e6)]}  # the slowest node waits 0 s: no idle slice
    for tid, parts in expected.items():
        # the sync is SimPy's own clock difference (plan.comm_s up to rounding), × 1e6
        syncs = [("sync", s * 1e6) for s in timeline[timeline["node"] == "abc"[tid - 1]]["comm_s"]]
        assert syncs[0][1] == pytest.approx(plan.comm_s * 1e6, rel=1e-12)
        # round 1 starts at a clock time after a sync that is not round in binary: its durations
        # are differences of such times, exact to rounding (1e-12 relative)
        got = [(e["name"], pytest.approx(e["dur"], rel=1e-12)) for e in by_track[1, tid]]
        assert got == parts + syncs[:1] + parts + syncs[1:]
        assert [e["args"]["round"] for e in by_track[1, tid]] == [0] * (len(parts) + 1) + [1] * (len(parts) + 1)
        assert {e["args"]["tokens"] for e in by_track[1, tid]} == {10 * 4 * 64}  # H × b × gpus × seq_len
        first = by_track[1, tid][0]
        assert first["ts"] == 0.0
    # idle in the trace, in seconds, is the hand-worked 3.0, 1.0 and 0 s
    idle = {tid: sum(e["dur"] for e in by_track[1, tid] if e["name"] == "idle") / 1e6 for tid in (1, 2, 3)}
    assert idle == pytest.approx({1: 3.0, 2: 1.0, 3: 0.0}, rel=1e-12)
    assert_no_overlap(slices)


def test_every_strategy_on_paper_matches_the_timeline():
    scenario = load_scenario("paper")
    plans = [make_plan(scenario, s) for s in STRATEGIES]
    timeline = pd.concat([simulate(scenario, p, "analytic") for p in plans], ignore_index=True)
    doc = simulation_trace(timeline, pd.concat([p.to_frame() for p in plans], ignore_index=True))
    slices = check_format(doc)
    assert list(names(doc, "process_name").values()) == list(STRATEGIES)
    assert_no_overlap(slices)
    process = {name: pid for pid, name in names(doc, "process_name").items()}
    thread = {(pid, name): tid for (pid, tid), name in names(doc, "thread_name").items()}
    got = {(e["pid"], e["tid"], e["args"]["round"], e["name"]): e["dur"] for e in slices}
    totals = defaultdict(list)
    for row in timeline.itertuples():
        pid = process[row.strategy]
        tid = thread[pid, row.node]
        for part, column in PART_COLUMN.items():
            seconds = getattr(row, column)
            # each slice is exactly the timeline's seconds × 1e6; a 0 s part has none
            assert got.pop((pid, tid, row.round, part), 0.0) == seconds * 1e6
            totals[pid, tid, part].append(seconds)
    assert not got  # no slice beyond the timeline's
    for (pid, tid, part), seconds in totals.items():
        durs = [e["dur"] for e in slices if (e["pid"], e["tid"], e["name"]) == (pid, tid, part)]
        # the same numbers summed in µs instead of s: equal up to binary rounding of the scaling
        assert math.fsum(durs) / 1e6 == pytest.approx(math.fsum(seconds), rel=1e-12, abs=1e-9)


def test_simulate_writes_trace_json(tmp_path, write_scenario):
    assert simulate_main([str(write_scenario()), "--out", str(tmp_path), "--strategy", "baseline", "C"]) == 0
    doc = json.loads((tmp_path / "trace.json").read_text())
    check_format(doc)
    assert list(names(doc, "process_name").values()) == ["baseline", "C"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # written via a temp name, renamed


def frame(rounds, compute, idle, comm, start=None, **extra):
    """A two-node timeline-shaped frame, rows round by round (nodes a, b)."""
    n = len(rounds)
    return pd.DataFrame({"strategy": "C", "node": ["a", "b"] * (n // 2), "round": rounds, "compute_s": compute,
                         "idle_s": idle, "comm_s": comm,
                         "round_start_s": start if start is not None else [0.0] * n, "round_end_s": 0.0, **extra})


def test_validation_side_by_side_in_scenario_seconds():
    timeline = frame([0, 0, 1, 1, 2, 2], [1.0, 2.0] * 3, [1.0, 0.0] * 3, [0.5] * 6, [0, 0, 2.5, 2.5, 5, 5])
    # measured at time scale 0.5 (halves of the scenario's seconds), rounds 0 and 1 only
    trace = frame([0, 0, 1, 1], [0.5, 1.0, 0.5, 1.0], [0.625, 0.0, 0.5, 0.125], [0.25] * 4,
                  [0.0, 0.0, 1.5, 1.5], tokens=[100, 200, 100, 200])
    doc = validation_trace(timeline, trace, time_scale=0.5)
    slices = check_format(doc)
    assert names(doc, "process_name") == {1: "predicted: C", 2: "measured: C"}
    assert "0.5" in doc["otherData"]["geodt"]
    by_track = tracks(slices)
    assert {e["args"]["round"] for e in by_track[1, 1]} == {0, 1}  # the rounds the run measured
    assert [(e["name"], e["ts"], e["dur"]) for e in by_track[2, 1]] == [
        ("compute", 0.0, 1e6), ("idle", 1e6, 1.25e6), ("sync", 2.25e6, 0.5e6),
        ("compute", 3e6, 1e6), ("idle", 4e6, 1e6), ("sync", 5e6, 0.5e6)]
    assert [e["args"]["tokens"] for e in by_track[2, 2]] == [200] * 5  # round 0 of b: no idle
    assert_no_overlap(slices)


def test_a_round_starting_an_instant_early_starts_at_the_previous_end():
    # round 0 of both nodes ends at 0.5 s (a: 0.1 + 0.1 + 0.3, b: 0.2 + 0.3); round 1 is recorded as
    # starting 1 ns before that (a clock's rounding): it starts at the end instead, never overlapping.
    t = frame([0, 0, 1, 1], [0.1, 0.2, 0.1, 0.2], [0.1, 0.0, 0.1, 0.0], [0.3] * 4, [0.0, 0.0, 0.5 - 1e-9, 0.5 - 1e-9])
    slices = check_format(simulation_trace(t))
    assert_no_overlap(slices)
    for track in tracks(slices).values():
        sync0, compute1 = track[len(track) // 2 - 1], track[len(track) // 2]
        assert compute1["args"]["round"] == 1 and compute1["ts"] == sync0["ts"] + sync0["dur"]
    assert "tokens" not in slices[0]["args"]  # no plan, no tokens column: not known


def test_run_trace_csv_to_json(tmp_path):
    trace = frame([0, 0], [0.5, 1.0], [0.5, 0.0], [0.25, 0.25], tokens=[100, 200], loss=[5.0, 5.0])
    trace.to_csv(tmp_path / "trace.csv", index=False)
    path = trace_csv_to_json(tmp_path / "trace.csv", tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    slices = check_format(doc)
    assert names(doc, "process_name") == {1: "measured: C"}
    assert [(e["tid"], e["name"], e["dur"], e["args"]["tokens"]) for e in slices] == [
        (1, "compute", 5e5, 100), (1, "idle", 5e5, 100), (1, "sync", 2.5e5, 100),
        (2, "compute", 1e6, 200), (2, "sync", 2.5e5, 200)]
    assert json.loads((tmp_path / "trace.json").read_text()) == json.loads(trace_text(run_trace(trace)))


@pytest.mark.parametrize("column,value,message", [
    ("idle_s", -0.5, "node b, round 0: idle_s = -0.5; expected a finite number >= 0"),
    ("compute_s", float("nan"), "node b, round 0: compute_s = nan"),
])
def test_bad_numbers_name_the_node_and_round(tmp_path, column, value, message):
    t = frame([0, 0], [0.5, 1.0], [0.5, 0.0], [0.25, 0.25])
    t.loc[1, column] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        write_trace_json(simulation_trace(t), tmp_path / "trace.json")
    assert not list(tmp_path.iterdir())


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="missing timeline columns round_start_s, round_end_s"):
        simulation_trace(frame([0, 0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]).drop(columns=["round_start_s",
                                                                                          "round_end_s"]))


def test_text_writer_equals_the_documents_json(write_scenario):
    """trace_json_text (one format over all slices) writes exactly what json.dumps writes of the dicts."""
    scenario = load_scenario("paper")
    plans = [make_plan(scenario, s) for s in STRATEGIES]
    timeline = pd.concat([simulate(scenario, p, "simpy") for p in plans], ignore_index=True)
    plan_frame = pd.concat([p.to_frame() for p in plans], ignore_index=True)
    text, kept = simulation_trace_text(timeline, plan_frame)
    assert kept is None and text == trace_text(simulation_trace(timeline, plan_frame))
    t = frame([0, 0, 1, 1], [0.1, 0.2, 0.1, 0.2], [0.1, 0.0, 0.1, 0.0], [0.3] * 4, [0.0, 0.0, 0.5 - 1e-9, 0.5 - 1e-9])
    assert trace_json_text(_by_strategy(t)) == trace_text(trace_document(_by_strategy(t)))  # no tokens
    some = pd.DataFrame({"strategy": ["C", "C"], "node": ["a", "zz"], "tokens_per_round": [7, 9]})[:1]
    assert trace_json_text(_by_strategy(t), some) == trace_text(trace_document(_by_strategy(t), some))  # a: 7, b: ?
    timeline = frame([0, 0], [1.0, 2.0], [1.0, 0.0], [0.5, 0.5])
    trace = frame([0, 0], [0.5, 1.0], [0.625, 0.0], [0.25, 0.25], tokens=[100, 200])
    sources = [("predicted: C", timeline), ("measured: C", trace)]
    assert (trace_json_text(sources, time_scales=[1.0, 0.5], note="n")
            == trace_text(trace_document(sources, time_scales=[1.0, 0.5], note="n")))
    empty = frame([], [], [], [], [])
    assert json.loads(trace_json_text([("x", empty)])) == trace_document([("x", empty)])


def test_large_timelines_keep_their_first_rounds(tmp_path, write_scenario):
    """Over max_node_rounds rows the trace holds the first rounds that fit, says so, and --full-trace
    writes all: 3 nodes x 2 rounds = 6 rows, a cap of 4 keeps round 0 only."""
    scenario = load_scenario(str(write_scenario()))
    plan = make_plan(scenario, "baseline")
    timeline = simulate(scenario, plan, "simpy")
    assert trace_rounds(timeline, 6) is None and trace_rounds(timeline, None) is None
    assert trace_rounds(timeline, 5) == 1 and trace_rounds(timeline, 1) == 1  # at least one round
    text, kept = simulation_trace_text(timeline, plan.to_frame(), 4)
    doc = json.loads(text)
    slices = check_format(doc)
    assert kept == 1 and {e["args"]["round"] for e in slices} == {0}
    assert "rounds 0-0 of 2" in doc["otherData"]["geodt"] and "--full-trace" in doc["otherData"]["geodt"]
    assert text == trace_text(simulation_trace(timeline[timeline["round"] == 0], plan.to_frame())).replace(
        SIMULATION_NOTE, doc["otherData"]["geodt"])


def test_simulate_caps_the_trace_unless_full_trace(tmp_path, write_scenario, capsys, monkeypatch):
    import simulator.cli

    monkeypatch.setattr(simulator.cli, "TRACE_MAX_NODE_ROUNDS", 4)  # the cap geodt simulate applies
    path = str(write_scenario())
    assert simulate_main([path, "--out", str(tmp_path / "capped"), "--strategy", "baseline"]) == 0
    assert "trace.json holds rounds 0-0 of 2" in capsys.readouterr().out
    rounds = {e["args"]["round"] for e in check_format(json.loads((tmp_path / "capped" / "trace.json").read_text()))}
    assert rounds == {0}
    assert simulate_main([path, "--out", str(tmp_path / "full"), "--strategy", "baseline", "--full-trace"]) == 0
    assert "trace.json holds" not in capsys.readouterr().out
    rounds = {e["args"]["round"] for e in check_format(json.loads((tmp_path / "full" / "trace.json").read_text()))}
    assert rounds == {0, 1}
    timeline = pd.read_parquet(tmp_path / "capped" / "timeline.parquet")  # the tables keep every round
    assert sorted(set(timeline["round"])) == [0, 1]
