"""Rounds without a barrier (issue 40): the async server and quorum rounds, simulated (simulator/engines/engine_async.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from formats.plan import Plan, QuorumSettings, load_plan, quorum_need
from simulator.engines.engine import simulate, simulate_syncs
from simulator.engines.engine_async import (
    FIELDS,
    push_pull_raw,
    run_async_analytic,
    run_async_simpy,
    run_quorum_simpy,
)
from simulator.models.loss_prediction import loss_setup, plan_rounds, predict
from simulator.scenario import load_scenario
from simulator.strategies import BARRIERLESS, STRATEGIES, make_plan


def test_async_two_nodes_by_hand():
    """A computes 1 s a round, B 2 s, each sync 0.1 s at the server: nobody waits, every merge's staleness
    is the updates the others made since the node's pull."""
    out = run_async_analytic(np.array([[1.0, 2.0]] * 3), [0.1, 0.1])
    # merges in order: A@1.0, B@2.0, A@2.1, A@3.2, B@4.1, B@6.2
    assert out["round_start_s"][:, 0] == pytest.approx([0.0, 1.1, 2.2])
    assert out["round_end_s"][:, 0] == pytest.approx([1.1, 2.2, 3.3])
    assert out["round_start_s"][:, 1] == pytest.approx([0.0, 2.1, 4.2])
    assert out["round_end_s"][:, 1] == pytest.approx([2.1, 4.2, 6.3])
    assert out["staleness"][:, 0].tolist() == [0, 1, 0]  # A: fresh; B's first merge between; fresh
    assert out["staleness"][:, 1].tolist() == [1, 2, 0]  # B: A's first; A's second and third; fresh
    assert out["stale_work"].tolist() == out["staleness"].tolist()  # one pseudo-gradient per update
    assert np.abs(out["idle_s"]).max() < 1e-12
    assert out["comm_s"] == pytest.approx(np.full((3, 2), 0.1))


def test_async_contention_waits_in_the_server_queue():
    """Both arrive at 1 s; the server serves A (first scheduled) then B, whose wait is idle."""
    for run in (run_async_analytic, run_async_simpy):
        out = run(np.array([[1.0, 1.0]]), [0.5, 0.5])
        assert out["idle_s"][0].tolist() == [0.0, 0.5]
        assert out["round_end_s"][0].tolist() == [1.5, 2.0]
        assert out["staleness"][0].tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(6))
def test_async_simpy_equals_analytic(seed):
    rng = np.random.default_rng(seed)
    n, rounds = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    compute = rng.uniform(0.1, 3.0, (rounds, n))
    if seed % 2:  # ties: equal compute and service, every node arriving together
        compute = np.round(compute, 0) + 1.0
    service = rng.uniform(0.0, 1.5, n) if seed % 3 else np.full(n, 0.5)
    a, s = run_async_analytic(compute, service), run_async_simpy(compute, service)
    for name in FIELDS:
        assert np.array_equal(a[name], s[name]), name


def test_async_scenario_engines_equal_with_jitter():
    scenario = load_scenario("paper", ["simulation.jitter_cv=0.1", "training.rounds=4"])
    plan = make_plan(scenario, "async")
    a, s = simulate(scenario, plan, "analytic"), simulate(scenario, plan, "simpy")
    pd.testing.assert_frame_equal(a, s)


def test_quorum_late_node_merged_next_round():
    """A and B take 1 s, C 3 s; 2 of 3 close a round, 0.2 s grace, all-reduce 0.1 s. C misses both of A's
    and B's closes (1.2 s, 2.5 s): at 3.0 it pulls the latest model (0.1 s) and computes on; its late
    pseudo-gradient is merged by the next close (its own next arrival, nobody else left), two updates stale."""
    out = run_quorum_simpy(np.array([[1.0, 1.0, 3.0]] * 2), need=2, grace_s=0.2, comm_s=0.1)
    assert out["idle_s"][:, :2] == pytest.approx(np.full((2, 2), 0.2))  # A, B wait out the grace window
    assert out["round_end_s"][:, 0] == pytest.approx([1.3, 2.6])
    assert out["staleness"][:, :2].tolist() == [[0, 0], [0, 0]]
    # C arrives at 3.0 after both of A's and B's rounds merged: alone now, it closes at once
    assert out["round_start_s"][:, 2] == pytest.approx([0.0, 3.1])
    assert out["idle_s"][:, 2] == pytest.approx([0.0, 0.0])
    assert out["round_end_s"][:, 2] == pytest.approx([3.1, 6.2])
    assert out["staleness"][:, 2].tolist() == [2, 0]
    assert out["stale_work"][:, 2].tolist() == [4, 0]  # the four pseudo-gradients of A's and B's rounds


def test_quorum_late_node_does_not_wait_for_the_next_quorum():
    """C (1.5 s) misses the close at 1.2 s: it pulls that round's model and computes on at once; its
    pseudo-gradient goes into the next close (2.5 s, A's and B's second round), one update stale."""
    out = run_quorum_simpy(np.array([[1.0, 1.0, 1.5]] * 2), need=2, grace_s=0.2, comm_s=0.1)
    assert out["round_end_s"][:, 2] == pytest.approx([1.6, 3.3])
    assert out["idle_s"][:, 2] == pytest.approx([0.0, 0.1])  # the run's last close: its all-reduce, then the pull
    assert out["staleness"][:, 2].tolist() == [1, 1] and out["stale_work"][:, 2].tolist() == [2, 3]
    assert out["round_end_s"][:, 0] == pytest.approx([1.3, 2.6]) and out["staleness"][:, :2].max() == 0


def test_quorum_node_within_grace_joins_the_round():
    """C arrives inside the grace window: everyone still training waits, so the round closes then."""
    out = run_quorum_simpy(np.array([[1.0, 1.0, 1.1]]), need=2, grace_s=0.2, comm_s=0.1)
    assert out["round_end_s"][0] == pytest.approx([1.2, 1.2, 1.2])
    assert out["idle_s"][0] == pytest.approx([0.1, 0.1, 0.0])
    assert out["staleness"][0].tolist() == [0, 0, 0]


def test_quorum_of_everyone_is_a_barrier():
    compute = np.array([[1.0, 2.0, 1.5], [2.0, 1.0, 1.2]])
    out = run_quorum_simpy(compute, need=3, grace_s=5.0, comm_s=0.25)
    assert out["round_end_s"].tolist() == [[2.25] * 3, [4.5] * 3]
    assert out["staleness"].max() == 0


def test_strategies_are_apart_from_the_barrier_ones():
    assert set(BARRIERLESS) == {"async", "quorum"} and not set(BARRIERLESS) & set(STRATEGIES)
    scenario = load_scenario("paper")
    a, q = make_plan(scenario, "async"), make_plan(scenario, "quorum")
    assert (a.sync, q.sync, q.quorum.share) == ("async", "quorum", 0.5) and quorum_need(q.quorum.share, 4) == 2
    assert [n.local_steps for n in a.nodes] == [n.local_steps for n in q.nodes] == [85, 85, 128, 102]
    assert a.comm_s == pytest.approx(float(push_pull_raw(1.0, 1.0, 215e6 * 2, 215e6 * 4, 0.0)) + 0.49, rel=0.05)
    from simulator.engines.engine_async import service_s

    assert service_s(scenario, a).max() == a.comm_s  # the plan's comm_s: the slowest node's service, server free
    # four nodes' syncs (4 × 10.81 s) over the slowest round's compute (node3: 128 × 0.198 s = 25.34 s)
    assert "server load 1.71 " in a.note


def test_plan_csv_round_trip(tmp_path):
    scenario = load_scenario("paper")
    plan = make_plan(scenario, "quorum")
    plan.to_frame(scenario).to_csv(tmp_path / "plan.csv", index=False)
    back = load_plan(tmp_path / "plan.csv")
    assert (back.sync, back.quorum.share, back.quorum.grace_s) == ("quorum", 0.5, pytest.approx(plan.quorum.grace_s))
    with pytest.raises(ValueError, match="quorum"):
        Plan(strategy="x", nodes=plan.nodes, comm_s=1.0, seq_len=8, quorum=QuorumSettings(0.5, 0.0))


def test_loss_model_marks_update_staleness_not_calibrated_without_an_async_run(tmp_path):
    """A profile without an async run (one written before it existed) leaves update_staleness unweighed,
    and says so; the built-in profile's async run weighs it (tests/test_async_loss.py)."""
    from formats.convergence import read_convergence_profile
    from simulator.models.loss_prediction import BUILT_IN_PROFILE
    from simulator.outputs.outputs import write_csv

    frame = read_convergence_profile(BUILT_IN_PROFILE)
    write_csv(frame[frame["run"] != "async"], tmp_path / "barriers.csv")
    for profile, calibrated in ((tmp_path / "barriers.csv", False), (BUILT_IN_PROFILE, True)):
        scenario = load_scenario("hetero-cpu", ["training.rounds=4", f"training.convergence_profile={profile}"])
        setup = loss_setup(scenario)
        preds = {}
        for name in ("async", "quorum", "baseline"):
            plan = make_plan(scenario, name)
            preds[name] = predict(setup, scenario, plan, plan_rounds(plan, simulate(scenario, plan, "auto")))
        assert ("update_staleness" in preds["async"]["uncalibrated"]) is not calibrated
        assert "update_staleness" not in preds["baseline"]["uncalibrated"]
        assert ("update_staleness" in setup.model.coefficients) is calibrated


def test_syncs_of_an_async_plan():
    scenario = load_scenario("paper", ["training.rounds=2"])
    timeline, syncs = simulate_syncs(scenario, make_plan(scenario, "async"), "analytic")
    assert len(syncs) == len(timeline) == 8
    assert np.allclose(syncs["end_s"] + syncs["outer_s"], timeline["round_end_s"])


def test_simulate_command_prints_and_writes_staleness(tmp_path, capsys):
    from simulator.cli import simulate_main

    args = ["paper", "--strategy", "async", "--strategy", "quorum", "--strategy", "baseline", "--target-loss", "5.8",
            "--out", str(tmp_path), "--csv"]
    assert simulate_main(args) == 0
    printed = capsys.readouterr().out
    assert "stale mean/p90" in printed and "recommended:" in printed and "not calibrated: update_staleness" not in printed
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns)[-2:] == ["staleness_mean", "staleness_p90"]
    by = summary.groupby("strategy")[["staleness_mean", "staleness_p90", "time_to_target_s"]].first()
    assert by.loc["async", "staleness_mean"] > 2 and by.loc["baseline", "staleness_p90"] == 0
    # async's stale merges (update_staleness, fitted from the built-in profile's async run) cost it the target
    assert np.isfinite(by.loc[["quorum", "baseline"], "time_to_target_s"]).all()
    assert by.loc["async", "time_to_target_s"] > by.loc["baseline", "time_to_target_s"]
    timeline = pd.read_csv(tmp_path / "timeline.csv")
    assert "staleness" not in timeline.columns and set(timeline["strategy"]) == {"async", "quorum", "baseline"}


def test_readme_lists_them():
    from tests.test_help import readme_strategies

    assert [name for name in readme_strategies() if name in BARRIERLESS] == list(BARRIERLESS)


def test_refused_where_only_barrier_rounds_are_timed(tmp_path, capsys):
    from simulator.cli import simulate_main
    from simulator.sweep.sweep_cli import main as sweep_main

    assert simulate_main(["paper", "--strategy", "quorum", "--engine", "analytic", "--out", str(tmp_path)]) == 2
    assert "strategy quorum (quorum rounds) has no analytic path" in capsys.readouterr().err
    assert sweep_main(["--table", "paper", "--strategy", "async", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a strategy without a barrier" in err[0]


def test_recommendation_says_when_its_pick_rests_on_an_uncalibrated_effect():
    from simulator.outputs.report import recommend_by_target

    table = pd.DataFrame({"strategy": ["baseline", "async"], "time_to_target_s": [100.0, 80.0], "idle_s": [5.0, 0.0],
                          "tokens_per_s": [10.0, 12.0], "speedup": [1.0, 1.2], "loss_end": [3.0, 3.0],
                          "uncalibrated": ["", "update_staleness"]})
    rec = recommend_by_target(table, {}, 3.5)
    assert rec.strategy == "async" and "(its loss assumes no effect of update_staleness: not calibrated)" in rec.reason
    table["uncalibrated"] = ""
    assert "not calibrated" not in recommend_by_target(table, {}, 3.5).reason


@pytest.mark.parametrize("seed", range(8))
def test_quorum_accounts_for_every_node_round(seed):
    """Random rounds: every pseudo-gradient merged once, each node's parts add up to its round, rounds
    back to back, nothing negative; the merges' stale work sums as the closes say."""
    rng = np.random.default_rng(seed)
    n, rounds = int(rng.integers(2, 7)), int(rng.integers(1, 7))
    compute = rng.uniform(0.2, 3.0, (rounds, n)) * rng.uniform(0.5, 2.0, n)
    out = run_quorum_simpy(compute, need=int(rng.integers(1, n + 1)), grace_s=float(rng.uniform(0, 1)),
                           comm_s=float(rng.uniform(0.05, 0.5)))
    assert not any(np.isnan(out[name]).any() for name in FIELDS)
    parts = out["compute_s"] + out["idle_s"] + out["comm_s"]
    assert np.allclose(parts, out["round_end_s"] - out["round_start_s"])
    assert np.array_equal(out["compute_s"], compute) or np.allclose(out["compute_s"], compute)
    assert np.allclose(out["round_start_s"][1:], out["round_end_s"][:-1]) and (out["round_start_s"][0] == 0).all()
    assert (out["idle_s"] >= -1e-12).all() and (out["staleness"] >= 0).all()
    assert (out["stale_work"] >= out["staleness"]).all()


@pytest.mark.parametrize("seed", range(4))
def test_quorum_of_everyone_runs_as_the_barrier_engine(seed):
    from simulator.engines.engine_analytic import run_analytic

    rng = np.random.default_rng(seed)
    compute = rng.uniform(0.2, 3.0, (5, 4))
    q, b = run_quorum_simpy(compute, need=4, grace_s=1.0, comm_s=0.3), run_analytic(compute, 0.3)
    for name in ("compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s"):
        assert np.allclose(q[name], b[name], rtol=0, atol=1e-12), name
    assert q["staleness"].max() == 0


def test_late_work_alone_does_not_close_a_quorum_round():
    """A (1 s) and B close two rounds between them before C and D (2.5 s) arrive, late. Their late
    pseudo-gradients wait for the next close; they do not make one (the quorum counts nodes that
    wait). C and D then pull v2, come back on time and close v3 with their work of both rounds.
    Counting late work toward the quorum closed a v3 of late work alone at 2.5 s, and C and D were
    late again (staleness 1)."""
    out = run_quorum_simpy(np.array([[1.0, 1.0, 2.5, 2.5]] * 2), need=2, grace_s=0.0, comm_s=0.0)
    assert out["staleness"].tolist() == [[0, 0, 2, 2], [0, 0, 0, 0]]
    assert out["round_end_s"][:, 2:].tolist() == [[2.5, 2.5], [5.0, 5.0]]
