"""The loss of a run without a barrier (issue 40): the async calibration run's staleness in the convergence
profile (formats/convergence.py), read as stale work by the loss model (simulator/models/convergence.py), which
fits update_staleness from it; old profiles without the column still load."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from formats.convergence import COLUMNS, ConvergenceProfileError, read_convergence_profile
from simulator.models.convergence import LossCurve, features, fit_model, round_frame
from simulator.models.loss_prediction import BUILT_IN_PROFILE, loss_setup, plan_rounds, predict
from simulator.scenario import load_scenario
from simulator.strategies import make_plan

CURVE = LossCurve(2.0, 50.0, 0.5, "test")
NODES = ("a", "b", "c", "d")


def _run_rows(run: str, strategy: str, eta: float, staleness: int) -> list[dict]:
    """12 rounds of four equal nodes laid on CURVE, the tokens worth `eta` of the baseline's; every
    node-round's merge `staleness` global updates late."""
    rows, done, tokens = [], 0, 2 * 8 * 10
    for r in range(12):
        middle = done + len(NODES) * tokens / 2
        for node in NODES:
            rows.append({"run": run, "strategy": strategy, "model": "tiny", "params": 1e5, "seq_len": 8,
                         "corpus": "markov", "seed": 0, "nodes": len(NODES), "rounds": 12, "base_local_steps": 10,
                         "base_batch_size": 2, "averaging": "uniform", "payload_dtype": "fp32", "fragments": 1,
                         "sync_delay_steps": 0, "fragment_alpha": 0.0, "inner_lr": 1e-3, "host": "h",
                         "torch_version": "t", "measured_at": "now", "node": node, "round": r, "gpus": 1,
                         "batch_size": 2, "local_steps": 10, "tokens": tokens, "loss": float(CURVE.loss(eta * middle)),
                         "round_end_s": float(r + 1), "staleness": staleness})
        done += len(NODES) * tokens
    return rows


def _profile(async_eta: float) -> pd.DataFrame:
    return pd.DataFrame(_run_rows("baseline", "baseline", 1.0, 0) + _run_rows("async", "async", async_eta, 3))


def test_an_async_run_gives_update_staleness_a_fitted_effect():
    model = fit_model(_profile(0.5), "synthetic")
    run = model.runs.set_index("run")
    # every merge 3 updates late, over 4 nodes: x = 0.75; its tokens worth half: c = ln 2 / 0.75
    assert run.loc["async", "update_staleness"] == pytest.approx(0.75)
    assert run.loc["baseline", "update_staleness"] == 0
    assert set(model.coefficients) == {"update_staleness"}
    assert model.coefficients["update_staleness"] == pytest.approx(math.log(2) / 0.75, rel=0.01)
    assert model.uncalibrated({"update_staleness": 0.7}) == []


def test_a_trace_or_profile_staleness_is_the_stale_work():
    """Before the profile had staleness, a trace's staleness was read as no stale work: x = 0."""
    rows = pd.DataFrame(_run_rows("async", "async", 1.0, 3))
    rounds = round_frame(rows, dict.fromkeys(NODES, 2), dict.fromkeys(NODES, 1), 8)
    x = features(rounds, base_batch=2, base_steps=10, averaging="uniform", fragments=1, sync_delay_steps=0,
                 payload_dtype="fp32", ref_nodes=4)
    assert x["update_staleness"] == pytest.approx(0.75)
    # the simulator's stale_work wins where both are there (quorum: several pseudo-gradients per update)
    rounds = round_frame(rows.assign(stale_work=6), dict.fromkeys(NODES, 2), dict.fromkeys(NODES, 1), 8)
    assert rounds["stale_work"].sum() == 6 * len(rows)


def test_an_old_profile_without_the_staleness_column_loads(tmp_path):
    path = tmp_path / "old.csv"
    _profile(0.5).drop(columns="staleness").to_csv(path, index=False)
    frame = read_convergence_profile(path)
    assert list(frame.columns) == list(COLUMNS) and (frame["staleness"] == 0).all()
    # an old profile's async rows (none existed; here to show it) would fit no staleness effect
    assert "update_staleness" not in fit_model(frame, "old").coefficients


def test_a_profile_without_a_required_column_is_still_refused(tmp_path):
    path = tmp_path / "short.csv"
    _profile(0.5).drop(columns="round_end_s").to_csv(path, index=False)
    with pytest.raises(ConvergenceProfileError, match="no column 'round_end_s'"):
        read_convergence_profile(path)
    _profile(0.5).assign(staleness="late").to_csv(path, index=False)
    with pytest.raises(ConvergenceProfileError, match="staleness = 'late'; expected a finite number"):
        read_convergence_profile(path)


def test_the_built_in_profile_calibrates_update_staleness(capsys):
    frame = read_convergence_profile(BUILT_IN_PROFILE)
    async_rows = frame[frame["run"] == "async"]
    assert len(async_rows) and async_rows["staleness"].gt(0).any() and (frame["run"] != "async").sum()
    assert (frame.loc[frame["run"] != "async", "staleness"] == 0).all()
    scenario = load_scenario("hetero-cpu", ["training.target_loss=3.9"])
    setup = loss_setup(scenario)
    assert "update_staleness" in setup.model.coefficients
    plan = make_plan(scenario, "async")
    from simulator.engines.engine import simulate

    got = predict(setup, scenario, plan, plan_rounds(plan, simulate(scenario, plan, "auto")))
    assert got["uncalibrated"] == [] and got["efficiency"] < 1


@pytest.mark.slow
def test_calibrate_convergence_adds_an_async_run_to_an_old_profile(tmp_path):
    """`--runs async` on a profile written before the staleness column: the old rows come back as they
    were (the default 0 after them), the async rows with the trace's staleness, and the fit weighs it."""
    pytest.importorskip("torch")  # the async run is real training
    from geodt.calibration.cli import main
    from simulator.outputs.outputs import write_csv

    old = read_convergence_profile(BUILT_IN_PROFILE)
    out = tmp_path / "conv.csv"
    write_csv(old[old["run"] != "async"].drop(columns="staleness"), out)
    before = out.read_text().splitlines()
    small = ["--set", "training.rounds=2", "--set", "training.local_steps=3", "--time-scale", "0.5"]
    assert main(["convergence", "hetero-cpu", "--runs", "async", "--out", str(out), *small]) == 0
    after = out.read_text().splitlines()
    assert after[0] == before[0] + ",staleness"
    assert after[1:len(before)] == [line + ",0" for line in before[1:]]
    frame = read_convergence_profile(out)
    mine = frame[frame["run"] == "async"]
    assert len(mine) == 2 * 4 and set(mine["strategy"]) == {"async"} and mine["staleness"].gt(0).any()
    assert "update_staleness" in fit_model(frame, "calibrated").coefficients
