"""Time to loss end to end: --target-loss on simulate, plan and validate, and geodt calibrate convergence."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from formats.timeline import LOSS_COLUMNS, VALIDATION_COLUMNS
from simulator.cli import plan_main, simulate_main
from simulator.outputs.report import answer_table, recommend

torch = pytest.importorskip("torch")


def test_simulate_with_a_target_ranks_by_it(tmp_path, capsys):
    out = tmp_path / "s"
    assert simulate_main(["hetero-cpu", "--target-loss", "4.0", "--out", str(out),
                          "--strategy", "baseline", "rebalance", "measured-batch"]) == 0
    printed = capsys.readouterr().out
    assert "ranked by the predicted time to loss 4" in printed and "loss model: fitted: built-in" in printed
    summary = pd.read_csv(out / "summary.csv")
    for column in LOSS_COLUMNS:
        assert summary[column].notna().all()
    per = summary.groupby("strategy")["time_to_target_s"].first()
    assert per["rebalance"] < per["baseline"]  # the same tokens per round, no idle: sooner
    assert "target_loss = 4.0" in (out / "scenario.toml").read_text()
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_without_a_target_ranks_by_the_time_to_the_baseline_loss(tmp_path, capsys):
    """Issue 55: without --target-loss the answer is weighed by loss (the baseline's, at its last token), and
    says so; the baseline reaches its own loss at its end, rebalance (same tokens, less idle) sooner."""
    assert simulate_main(["hetero-cpu", "--out", str(tmp_path / "s"), "--strategy", "baseline", "rebalance"]) == 0
    printed = capsys.readouterr().out
    assert "loss_end" in printed and "ranked by the predicted time to the baseline's predicted loss" in printed
    per = pd.read_csv(tmp_path / "s" / "summary.csv").groupby("strategy")[["time_to_target_s", "loss_band"]].first()
    assert np.isfinite(per["time_to_target_s"]).all() and per.loc["rebalance", "time_to_target_s"] < per.loc[
        "baseline", "time_to_target_s"]
    assert (per["loss_band"] >= 0).all()


@pytest.mark.parametrize("main", [simulate_main, plan_main])
def test_a_target_below_the_floor_is_one_line_and_writes_nothing(main, tmp_path, capsys):
    out = tmp_path / "s"
    args = ["hetero-cpu", "--target-loss", "0.3", "--out", str(out)] + (["--strategy", "baseline"]
                                                                           if main is plan_main else [])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.target_loss = 0.3: at or below the loss floor" in err[0]
    assert not out.exists()


def test_plan_prints_the_time_to_the_target(tmp_path, capsys):
    assert plan_main(["hetero-cpu", "--strategy", "rebalance", "--target-loss", "4", "--out", str(tmp_path)]) == 0
    assert "rebalance: predicted loss" in capsys.readouterr().out


def test_recommendation_by_target_takes_the_earliest_and_names_the_fastest():
    table = pd.DataFrame({"strategy": ["baseline", "quick-but-bad", "steady"], "round_s": [1.0, 0.5, 0.8],
                          "tokens_per_round": [10, 10, 10], "tokens": [100, 100, 100],
                          "tokens_vs_baseline": [1.0, 1.0, 1.0], "tokens_per_s": [10.0, 20.0, 12.5],
                          "speedup": [1.0, 2.0, 1.25], "idle_s": [5.0, 0.0, 1.0], "comparable": [True] * 3,
                          "loss_end": [3.0, 3.5, 2.9], "time_to_target_s": [8.0, math.inf, 6.0]})
    rec = recommend(table, {"strategy": "baseline", "tokens_per_s": 10.0, "idle_s": 5.0}, target=3.2)
    assert rec.strategy == "steady"
    assert rec.reason.startswith("ranked by the predicted time to loss 3.2: 6.0 s, 0.75× the baseline's")
    assert "quick-but-bad has the most tokens/s (2.00×) but reaches the loss never" in rec.reason
    never = table.assign(time_to_target_s=math.inf)
    assert recommend(never, {}, target=1.0).strategy is None


def test_validate_compares_loss_and_time_to_target(tmp_path, capsys):
    from geodt.run_cmd import validate_main

    out = tmp_path / "v"
    # no --data: with a target the run trains on the profile's corpus, and says so
    assert validate_main(["hetero-cpu", "--strategy", "rebalance", "--out", str(out), "--no-progress", "--emulate",
                          "--target-loss", "6.0", "--time-scale", "0.5",
                          "--set", "training.rounds=3", "--checkpoint-every", "3"]) == 0
    captured = capsys.readouterr()
    assert "training on the convergence profile's corpus (python-stdlib" in captured.err
    printed = captured.out
    assert "time to loss 6: predicted" in printed and "loss by round (predicted / measured" in printed
    table = pd.read_csv(out / "validation.csv")
    assert list(table.columns) == VALIDATION_COLUMNS
    row = table.iloc[0]
    # the loss falls from ln(1024) = 6.93 at the start: both reach 6.0 within the run
    assert np.isfinite(row["predicted_time_to_target_s"]) and np.isfinite(row["measured_time_to_target_s"])
    assert 3.0 < row["measured_loss_end"] < 7.0


def test_validate_target_on_another_corpus_is_refused_before_anything_is_written(tmp_path, capsys):
    from geodt.run_cmd import validate_main

    out = tmp_path / "v"
    data = tmp_path / "text.txt"
    data.write_bytes(b"some other text " * 4096)
    assert validate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--emulate",
                          "--target-loss", "4", "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was measured on python-stdlib:" in err[0] and "this run trains on file:" in err[0]
    assert not out.exists()


@pytest.mark.slow
def test_calibrate_convergence_writes_and_resumes(tmp_path, capsys, monkeypatch):
    from formats.convergence import COLUMNS, read_convergence_profile
    from geodt.calibration.cli import main

    # stderr captured is not a terminal (a log): a progress line every PROGRESS_S while a run trains, where
    # nothing was printed for the minutes of a calibration (issue 58); 1 s here so each run prints one
    monkeypatch.setattr("geodt.calibration.convergence.PROGRESS_S", 1.0)

    out = tmp_path / "conv.csv"
    small = ["--set", "training.rounds=2", "--set", "training.local_steps=3", "--time-scale", "0.5"]
    assert main(["convergence", "hetero-cpu", "--runs", "baseline,unequal-steps", "--out", str(out), *small]) == 0
    frame = read_convergence_profile(out)
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == 2 * 4 * 2 and set(frame["run"]) == {"baseline", "unequal-steps"}
    assert set(frame["corpus"].str.split(":").str[0]) == {"python-stdlib"}
    # measured-steps gives the fast nodes more local steps than the baseline's 3
    steps = frame[frame["run"] == "unequal-steps"].groupby("node")["local_steps"].first()
    assert steps["fast"] > steps["slowest"] == 3
    err = capsys.readouterr().err
    for k, run in enumerate(("baseline", "unequal-steps")):
        assert f"geodt calibrate convergence: run {k + 1}/2 ({run}): " in err, err
    assert main(["convergence", "hetero-cpu", "--runs", "baseline,unequal-steps,fp16-payload", "--out", str(out),
                 *small]) == 0
    assert "holds baseline, unequal-steps; measuring fp16-payload" in capsys.readouterr().out
    assert set(read_convergence_profile(out)["run"]) == {"baseline", "unequal-steps", "fp16-payload"}


def test_calibrate_convergence_refuses_an_unknown_run(tmp_path, capsys):
    from geodt.calibration.cli import main

    assert main(["convergence", "hetero-cpu", "--runs", "baseline,nope", "--out", str(tmp_path / "c.csv")]) == 2
    assert "unknown run 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "c.csv").exists()


def test_answer_table_carries_the_loss_columns():
    from formats.plan import NodePlan, Plan
    from simulator.engines.engine import simulate
    from simulator.scenario import load_scenario

    scenario = load_scenario("hetero-cpu")
    plan = Plan("baseline", tuple(NodePlan(n.name, 1, 4, 10, 0.1) for n in scenario.nodes), 0.5, 64)
    timeline = simulate(scenario, plan, "analytic")
    table, _ = answer_table([(plan, timeline)], (plan, timeline), {"baseline": {"loss_end": 3.0,
                                                                               "time_to_target_s": 7.0}})
    assert list(table[["loss_end", "time_to_target_s"]].iloc[0]) == [3.0, 7.0]


def test_sweep_with_a_target_adds_the_loss_columns_and_the_finding(tmp_path, capsys):
    from simulator.sweep.sweep_cli import main

    out = tmp_path / "sw"
    assert main(["--gpu-types", "a30,t4", "--samples", "6", "--bandwidth-gbps", "1", "--out", str(out),
                 "--workers", "1", "--target-loss", "5.3", "--strategy", "baseline", "measured-steps", "B"]) == 0
    assert "Earliest to the target loss (predicted)" in capsys.readouterr().out
    data = pd.read_parquet(out / "sweep")
    assert data["loss_end"].notna().all() and (data["time_to_target_s"] > 0).all()
    # a strategy that trains on more tokens per round in the same rounds ends lower
    per = data.pivot(index="scenario_id", columns="strategy", values="loss_end")
    assert (per["B"] <= per["baseline"] + 1e-9).all()
    assert "training.target_loss=5.3" in (out / "spec.json").read_text()


def test_sweep_table_with_a_target(tmp_path, capsys):
    from simulator.sweep.sweep_cli import main

    assert main(["--table", "hetero-cpu", "--out", str(tmp_path / "t"), "--target-loss", "4",
                 "--strategy", "baseline", "rebalance"]) == 0
    table = pd.read_csv(tmp_path / "t" / "table.csv")
    assert list(table["strategy"]) == ["baseline", "rebalance"] and table["loss_end"].notna().all()
    assert "Predicted loss (simulator/models/loss_prediction.py), target 4" in capsys.readouterr().out


def test_calibrate_convergence_refuses_an_unreadable_corpus_in_one_line(tmp_path, capsys):
    from geodt.calibration.cli import main

    assert main(["convergence", "hetero-cpu", "--data", str(tmp_path / "none.txt"),
                 "--out", str(tmp_path / "c.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data:" in err[0] and "not found" in err[0]
