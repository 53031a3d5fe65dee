"""Streaming DiLoCo in the simulator (the executor's side: tests/test_streaming.py): the scenario
keys and plan columns, the fragment-sync engines (hand-worked rounds, SimPy against the analytic
recurrence, classic DiLoCo unchanged) and the `streaming` strategy."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from formats.plan import NodePlan, Plan, PlanError, load_plan, merge_steps
from formats.timeline import SYNC_COLUMNS
from simulator.cli import simulate_main
from simulator.engines.engine import simulate, simulate_syncs
from simulator.engines.engine_analytic import run_analytic, run_streaming_analytic
from simulator.engines.engine_simpy import run_streaming_simpy
from simulator.models.network import outer_step_s
from simulator.models.workload import segment_matrices
from simulator.scenario import load_scenario
from simulator.strategies import make_plan

FRAGMENT_KEYS = ["diloco.fragments=4", "diloco.sync_delay_steps=2"]


def two_nodes(step_a: float = 1.0, step_b: float = 1.0, steps: int = 8, rounds: int = 3, extra: str = "") -> str:
    return (f'name = "s"\n[model]\nparams = 1e8\nseq_len = 64\n[training]\nrounds = {rounds}\n'
            f'local_steps = {steps}\nbatch_size = 1\n{extra}'
            f'[[nodes]]\nname = "a"\ngpus = {{ "a30" = 1 }}\nstep_time_s = {step_a}\n'
            f'[[nodes]]\nname = "b"\ngpus = {{ "a30" = 1 }}\nstep_time_s = {step_b}\n')


# --- plan.csv and the scenario -------------------------------------------------------------

def test_merge_steps_are_torchfts_when_p_divides_h_and_floors_otherwise():
    assert merge_steps(100, 4) == [25, 50, 75, 100]
    assert merge_steps(17, 4) == [4, 8, 12, 17]
    assert merge_steps(5, 1) == [5]


def test_plan_columns_round_trip_and_empty_cells_mean_classic(tmp_path, write_scenario):
    scenario = load_scenario(str(write_scenario()), ["diloco.fragments=2", "diloco.sync_delay_steps=1",
                                                     "diloco.fragment_alpha=0.5", "diloco.fragment_pattern=strided"])
    plan = make_plan(scenario, "baseline")
    path = tmp_path / "plan.csv"
    plan.to_frame(scenario).to_csv(path, index=False)
    back = load_plan(path)
    assert (back.fragments, back.sync_delay_steps, back.fragment_alpha, back.fragment_pattern) == (2, 1, 0.5, "strided")
    frame = pd.read_csv(path)
    frame[["fragments", "sync_delay_steps", "fragment_alpha", "fragment_pattern"]] = ""
    frame.to_csv(path, index=False)
    classic = load_plan(path)
    assert (classic.fragments, classic.sync_delay_steps, classic.fragment_alpha, classic.fragment_pattern) == \
        (1, 0, 0.0, "sequential")
    assert not classic.streaming
    pd.read_csv(path).drop(columns=["fragments", "sync_delay_steps", "fragment_alpha", "fragment_pattern"]).to_csv(
        path, index=False)
    assert load_plan(path).fragments == 1


@pytest.mark.parametrize("column, value, expected", [
    ("fragments", "0", "fragments: expected an integer >= 1"),
    ("fragments", "11", "fragments: node a (local_steps 10): expected at most local_steps fragments"),
    ("sync_delay_steps", "5", ("sync_delay_steps: node a (local_steps 10): expected sync_delay_steps < "
                              "local_steps // fragments = 5, got 5")),
    ("sync_delay_steps", "-1", "sync_delay_steps: expected an integer >= 0"),
    ("fragment_alpha", "1.5", "fragment_alpha: expected a number in [0, 1], got 1.5"),
    ("fragment_pattern", "random", "fragment_pattern: expected one of sequential, strided, got 'random'"),
])
def test_bad_plan_cells_are_one_line_errors(tmp_path, write_scenario, column, value, expected):
    scenario = load_scenario(str(write_scenario()), ["diloco.fragments=2"])
    path = tmp_path / "plan.csv"
    frame = make_plan(scenario, "baseline").to_frame(scenario)
    frame[column] = value
    frame.to_csv(path, index=False)
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert str(err.value).startswith(f"{path}: {expected}") and "\n" not in str(err.value)


def test_gradient_sync_refuses_fragments():
    node = NodePlan(node="a", gpus=1, batch_size=1, local_steps=1, step_s=1.0)
    with pytest.raises(PlanError, match="sync = gradients syncs every step"):
        Plan(strategy="x", nodes=(node,), comm_s=1.0, seq_len=8, sync="gradients", fragments=1, sync_delay_steps=1)


@pytest.mark.parametrize("setting, expected", [
    ("diloco.fragments=0", "diloco.fragments: expected a positive finite number, got 0"),
    ("diloco.fragments=3", "diloco.fragments: expected at most the model's 2 layers"),
    ("diloco.sync_delay_steps=10", ("diloco.sync_delay_steps: expected 0 <= sync_delay_steps < "
                                   "training.local_steps // fragments = 10, got 10")),
    ("diloco.fragment_alpha=-0.1", "diloco.fragment_alpha: expected a number in [0, 1], got -0.1"),
    ("diloco.fragment_pattern=zigzag", "diloco.fragment_pattern: expected one of sequential, strided"),
])
def test_bad_scenario_keys_exit_2_with_one_line(write_scenario, capsys, tmp_path, setting, expected):
    path = write_scenario()
    assert simulate_main([str(path), "--set", setting, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_scenario_fragments_that_a_strategys_steps_cannot_hold_are_named(write_scenario, capsys, tmp_path):
    path = write_scenario(two_nodes(0.1, 0.3, steps=12, extra="[diloco]\nfragments = 2\n"))
    scenario = load_scenario(str(path))
    assert make_plan(scenario, "baseline").fragments == 2  # every strategy plans with the scenario's
    assert make_plan(scenario, "sync-ddp").fragments == 1  # but gradient sync has no fragments
    # hybrid gives node b one step per round: it cannot sync two fragments in it
    assert simulate_main([str(path), "--strategy", "hybrid", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert ("diloco.fragments: strategy hybrid: node b (local_steps 1): expected at most local_steps fragments, "
            "got 2") in err and err.count("\n") == 1


# --- the fragment-sync engines ---------------------------------------------------------------

def _rounds(pre, delay, allreduce_s, outer_s, fragments, engine):
    run = run_streaming_simpy if engine == "simpy" else run_streaming_analytic
    return run(np.asarray(pre, float), np.asarray(delay, float), allreduce_s, outer_s, fragments)


@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_hidden_all_reduce_costs_only_the_outer_steps(engine):
    # two equal nodes, 1 s steps, H = 8, P = 2 (merges after steps 4 and 8), τ = 2: each all-reduce
    # (1.5 s) starts 2 steps before its merge point and fits in the 2 s window: a round is 8 s + 2 outer
    # steps of 0.25 s (the second fragment's all-reduce starts at 4 + 0.25 + 2).
    pre, delay = [[2.0, 2.0]] * 6, [[2.0, 2.0]] * 6
    rec = _rounds(pre, delay, 1.5, 0.25, 2, engine)
    assert rec["resume_s"][-1].tolist() == [3 * 8.5] * 2
    assert rec["start_s"].tolist()[:2] == [2.0, 6.25] and rec["end_s"].tolist()[:2] == [3.5, 7.75]
    assert rec["merge_point_s"][:2, 0].tolist() == [4.0, 8.25]


@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_without_a_delay_every_fragment_is_exposed_and_the_slow_node_sets_the_start(engine):
    # node a 1 s steps, node b 2 s, H = 4, P = 2, τ = 0: every all-reduce (1 s) starts when b reaches
    # the sync point; a waits there for b (idle), both wait the all-reduce (exposed), then 0.5 s outer.
    pre = [[2.0, 4.0], [2.0, 4.0]]
    rec = _rounds(pre, [[0.0, 0.0]] * 2, 1.0, 0.5, 2, engine)
    assert rec["start_s"].tolist() == [4.0, 9.5] and rec["end_s"].tolist() == [5.0, 10.5]
    assert rec["resume_s"].tolist() == [[5.5, 5.5], [11.0, 11.0]]
    from simulator.engines.engine import streaming_frames
    plan = Plan(strategy="x", seq_len=8, comm_s=1.5, fragments=2, nodes=(
        NodePlan(node="a", gpus=1, batch_size=1, local_steps=4, step_s=1.0),
        NodePlan(node="b", gpus=1, batch_size=1, local_steps=4, step_s=2.0)))
    timeline, syncs = streaming_frames(plan, rec)
    assert timeline[["compute_s", "idle_s", "comm_s"]].to_numpy().tolist() == [[4.0, 4.0, 3.0], [8.0, 0.0, 3.0]]
    assert syncs["exposed_s"].tolist() == [1.0] * 4 and syncs["outer_s"].tolist() == [0.5] * 4


@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_a_fast_nodes_wait_splits_at_the_all_reduces_start(engine):
    # a (1 s steps) reaches its sync point at 1 s, b (3 s) at 3 s; τ = 1 step: a merges at 2 s and
    # waits for the all-reduce (3 s to 3.5 s): idle until it starts (1 s), exposed while it runs (0.5 s).
    rec = _rounds([[1.0, 3.0]], [[1.0, 3.0]], 0.5, 0.0, 1, engine)
    from simulator.engines.engine import streaming_frames
    plan = Plan(strategy="x", seq_len=8, comm_s=0.5, sync_delay_steps=1, nodes=(
        NodePlan(node="a", gpus=1, batch_size=1, local_steps=2, step_s=1.0),
        NodePlan(node="b", gpus=1, batch_size=1, local_steps=2, step_s=3.0)))
    timeline, syncs = streaming_frames(plan, rec)
    assert syncs[["idle_s", "exposed_s"]].to_numpy().tolist() == [[1.0, 0.5], [0.0, 0.0]]
    assert timeline["round_end_s"].tolist() == [3.5, 6.0]


@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_a_node_that_ends_the_all_reduce_early_merges_early_and_waits_at_the_next_start(engine):
    # a and b: 1 s steps, τ = 1, all-reduce 3 s, a measured to end it 1.5 s before b. Sync 0:
    # both at the sync point at 2, start 2, a's end 3.5, b's 5; both merge at 3: a exposed 0.5,
    # b 2. Sync 1: a at its sync point at 5.5, b at 7 (start 7); a merges at 6.5 and waits: idle
    # 0.5 until the start, then exposed until its own end 8.5 (1.5); b exposed 8 → 10 (2).
    from simulator.engines.engine import streaming_frames

    run = run_streaming_simpy if engine == "simpy" else run_streaming_analytic
    rec = run(np.array([[2.0, 2.0]] * 2), np.array([[1.0, 1.0]] * 2), 3.0, 0.0, 2, node_offsets_s=[-1.5, 0.0])
    assert rec["start_s"].tolist() == [2.0, 7.0] and rec["end_s"].tolist() == [5.0, 10.0]
    assert rec["node_end_s"].tolist() == [[3.5, 5.0], [8.5, 10.0]]
    assert rec["resume_s"].tolist() == [[3.5, 5.0], [8.5, 10.0]]
    plan = Plan(strategy="x", seq_len=8, comm_s=3.0, fragments=2, sync_delay_steps=1, nodes=(
        NodePlan(node="a", gpus=1, batch_size=1, local_steps=6, step_s=1.0),
        NodePlan(node="b", gpus=1, batch_size=1, local_steps=6, step_s=1.0)))
    _, syncs = streaming_frames(plan, rec)
    assert syncs[["idle_s", "exposed_s"]].to_numpy().tolist() == [[0.0, 0.5], [0.0, 2.0], [0.5, 1.5], [0.0, 2.0]]
    assert syncs["end_s"].tolist() == [3.5, 5.0, 8.5, 10.0]


def test_the_group_runs_its_all_reduces_in_issue_order():
    # Plans never overlap two all-reduces (τ < H/P); the engine still queues a second one FIFO
    # behind the first rather than sharing the links, as one process group runs its collectives.
    pre = np.array([[1.0], [0.0]])
    for run in (run_streaming_simpy, run_streaming_analytic):
        rec = run(pre, np.array([[0.0], [0.0]]), 2.0, 0.0, 1)
        assert rec["start_s"].tolist() == [1.0, 3.0]


def test_streaming_engine_on_a_classic_schedule_is_the_round_engine():
    rng = np.random.default_rng(4)
    compute = rng.uniform(0.5, 3.0, size=(7, 5))
    comm, outer = 2.0, 0.3
    classic = run_analytic(compute, comm)
    for run in (run_streaming_simpy, run_streaming_analytic):
        rec = run(compute, np.zeros_like(compute), comm - outer, outer, 1)
        assert np.max(np.abs(rec["resume_s"] - classic["round_end_s"])) <= 1e-12
        assert np.max(np.abs(rec["compute_start_s"] - classic["round_start_s"])) <= 1e-12


def test_classic_plans_keep_the_round_engine_and_their_syncs_are_whole(write_scenario):
    scenario = load_scenario(str(write_scenario()))
    plan = make_plan(scenario, "baseline")
    timeline, syncs = simulate_syncs(scenario, plan, "simpy")
    pd.testing.assert_frame_equal(timeline, simulate(scenario, plan, "simpy"))
    outer = outer_step_s(scenario)
    assert np.allclose(syncs["exposed_s"], plan.comm_s - outer, rtol=0, atol=1e-12)
    assert (syncs["outer_s"] == outer).all() and (syncs["fragment"] == 0).all()
    assert np.allclose(syncs["end_s"] + syncs["outer_s"], timeline["round_end_s"], rtol=0, atol=1e-12)


def test_segments_split_the_rounds_at_the_fragment_points(write_scenario):
    scenario = load_scenario(str(write_scenario()), ["diloco.fragments=2", "diloco.sync_delay_steps=1"])
    plan = make_plan(scenario, "baseline")  # H = 10: merges after steps 5 and 10, all-reduces start after 4 and 9
    pre, delay = segment_matrices(scenario, plan)
    assert pre.shape == (4, 3)
    assert np.allclose(pre[:, 0], 4 * 0.1) and np.allclose(delay[:, 2], 0.25)


# --- trace.json and the strategy -----------------------------------------------------------

def test_trace_draws_all_reduces_on_their_own_track_overlapping_compute(tmp_path):
    import json

    out = tmp_path / "out"
    assert simulate_main(["paper", "--strategy", "hybrid", "--strategy", "streaming", "--out", str(out)]) == 0
    doc = json.loads((out / "trace.json").read_text())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    streaming_pid = next(e["pid"] for e in doc["traceEvents"]
                         if e["name"] == "process_name" and e["args"]["name"] == "streaming")
    reduces = [e for e in slices if e["pid"] == streaming_pid and e["name"] == "all-reduce"]
    computes = [e for e in slices if e["pid"] == streaming_pid and e["name"] == "compute"]
    assert reduces and all(names[streaming_pid, e["tid"]].endswith(" all-reduce") for e in reduces)
    assert not any(e["name"] == "all-reduce" for e in slices if e["pid"] != streaming_pid)  # classic: none
    # some all-reduce runs while the node beside it computes
    node1 = [e for e in computes if names[streaming_pid, e["tid"]] == "node1"]
    assert any(c["ts"] < r["ts"] + r["dur"] and r["ts"] < c["ts"] + c["dur"] for r in reduces for c in node1
               if names[streaming_pid, r["tid"]] == "node1 all-reduce")
    # a node's own slices never overlap and add up to its timeline
    timeline = pd.read_parquet(out / "timeline.parquet")
    mine = sorted((e for e in slices if e["pid"] == streaming_pid and names[streaming_pid, e["tid"]] == "node1"),
                  key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in itertools.pairwise(mine))
    row = timeline[(timeline.strategy == "streaming") & (timeline.node == "node1")]
    for part, column in (("compute", "compute_s"), ("idle", "idle_s"), ("sync", "comm_s")):
        total = sum(e["dur"] for e in mine if e["name"] == part) / 1e6
        assert total == pytest.approx(row[column].sum(), rel=1e-6, abs=1e-6)
    syncs = pd.read_parquet(out / "syncs.parquet")
    assert len(syncs[syncs.strategy == "streaming"]) == 10 * 4 * make_plan(load_scenario("paper"), "streaming").fragments


def given_steps_scenario(bandwidth_gbps: float) -> str:
    # four nodes of one GPU each at given step times (2.5x apart), llama-150m over a WAN: the
    # numbers do not depend on the catalog's estimate
    nodes = "".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ "a30" = 1 }}\nstep_time_s = {t}\n'
                    for i, t in enumerate((0.2, 0.3, 0.4, 0.5)))
    return (f'name = "g"\n[model]\npreset = "llama-150m"\n[training]\nrounds = 10\nlocal_steps = 100\n'
            f'batch_size = 4\n[network]\nbandwidth_gbps = {bandwidth_gbps}\npayload_dtype = "fp16"\n{nodes}')


@pytest.mark.parametrize("bandwidth_gbps", [1.0, 2.0])
def test_streaming_hides_the_sync_at_hybrids_work(write_scenario, bandwidth_gbps):
    scenario = load_scenario(str(write_scenario(given_steps_scenario(bandwidth_gbps))))
    hybrid, streaming = make_plan(scenario, "hybrid"), make_plan(scenario, "streaming")
    assert [(n.batch_size, n.local_steps) for n in streaming.nodes] == [(n.batch_size, n.local_steps)
                                                                        for n in hybrid.nodes]
    assert streaming.streaming
    assert streaming.sync_delay_steps < min(n.local_steps for n in streaming.nodes) // streaming.fragments
    t_hybrid, t_stream = (simulate(scenario, p, "analytic")["round_end_s"].max() / 10 for p in (hybrid, streaming))
    compute = max(n.compute_s for n in hybrid.nodes)
    bound = max(compute, hybrid.comm_s)
    # the round is above its bound by the outer steps (not overlapped) and little more
    assert bound <= t_stream <= bound * 1.05 and t_stream < t_hybrid
    assert f"bound max(slowest compute, sync) = {bound:.2f} s" in streaming.note
    # the all-reduce alone is hidden, so this much is the outer steps plus the idle of unequal H_i
    assert t_stream - compute >= outer_step_s(scenario) * (1 - 1e-9)


def test_streaming_keeps_classic_diloco_when_nothing_is_to_hide(write_scenario):
    # a fast network: the sync is a sliver of the round; one fragment, no delay, hybrid exactly
    scenario = load_scenario(str(write_scenario(given_steps_scenario(1000.0))))
    plan = make_plan(scenario, "streaming")
    assert (plan.fragments, plan.sync_delay_steps) == (1, 0) and not plan.streaming


def test_the_executor_runs_the_fragments_plan_csv_carries(tmp_path):
    """plan.csv's streaming columns, as the simulator writes them, are what the executor runs
    (real/core/streaming.py reads the Plan attributes): two fragments, one step of delay, per node."""
    pytest.importorskip("torch")
    from real.core.options import ExecOptions
    from real.process.launch import launch
    from tests.test_real_runs import scenario_text

    nodes = (NodePlan(node="a", gpus=1, batch_size=1, local_steps=4, step_s=0.01),
             NodePlan(node="b", gpus=1, batch_size=2, local_steps=4, step_s=0.01))
    plan = Plan(strategy="streaming", nodes=nodes, comm_s=0.0, seq_len=32, fragments=2, sync_delay_steps=1,
                fragment_alpha=0.5, fragment_pattern="strided")
    plan.to_frame().to_csv(tmp_path / "plan.csv", index=False)
    (tmp_path / "scenario.toml").write_text(scenario_text(1))
    options = ExecOptions(out_dir=str(tmp_path / "out"), threads=1, progress=False, summary=False)
    assert launch(tmp_path / "plan.csv", tmp_path / "scenario.toml", options) == 0
    syncs = pd.read_csv(tmp_path / "out" / "syncs.csv")  # the simulator's syncs.csv columns, measured
    assert list(syncs.columns) == SYNC_COLUMNS + ["bytes_sent"]
    assert list(zip(syncs["fragment"], syncs["node"])) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    # Each fragment's average starts at its sync point and the node waits for it one step later.
    assert (syncs["merge_point_s"] > syncs["sync_point_s"]).all()


def test_size_limits_name_timeline_rows_for_classic_plans_and_fragment_syncs_for_streaming(write_scenario):
    # A classic plan past the limit was once refused as "fragment syncs" (the streaming check ran first).
    from formats.errors import InputError
    from simulator.engines.engine import MAX_TIMELINE_ROWS, check_size

    scenario = load_scenario(str(write_scenario(two_nodes(steps=8))))
    nodes = (NodePlan("a", 1, 4, 8, 1.0), NodePlan("b", 1, 4, 8, 1.0))
    classic = Plan("baseline", nodes, comm_s=1.0, seq_len=64, rounds=MAX_TIMELINE_ROWS // 2 + 1)
    with pytest.raises(InputError, match="timeline rows"):
        check_size(scenario, classic)
    streaming = Plan("streaming", nodes, comm_s=1.0, seq_len=64, rounds=MAX_TIMELINE_ROWS // 4 + 1, fragments=2)
    with pytest.raises(InputError, match="fragment syncs"):
        check_size(scenario, streaming)
    check_size(scenario, Plan("baseline", nodes, comm_s=1.0, seq_len=64, rounds=MAX_TIMELINE_ROWS // 4 + 1))
