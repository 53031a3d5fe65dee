"""The loss model (simulator/models/convergence.py, loss_prediction.py): fits, features, time to a target, ranking."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from formats.convergence import COLUMNS, ConvergenceProfileError, read_convergence_profile
from formats.errors import InputError
from simulator.models.convergence import (
    LossCurve,
    features,
    fit_curve,
    fit_model,
    prior_curve,
    round_frame,
    time_to_target,
)
from simulator.models.convergence_prior import prior_loss
from simulator.models.loss_prediction import BUILT_IN_PROFILE, loss_setup, plan_rounds, predict
from simulator.scenario import load_scenario

CURVE = LossCurve(2.0, 50.0, 0.5, "test")


def test_fit_curve_recovers_a_power_law_exactly():
    tokens = np.geomspace(1e3, 1e6, 30)
    fit = fit_curve(tokens, CURVE.loss(tokens), "synthetic")
    # the exponent grid is geometric (400 points over 0.02..3): the nearest point to 0.5 is within 0.7%
    assert fit.exponent == pytest.approx(0.5, rel=0.007)
    assert np.abs(fit.loss(tokens) - CURVE.loss(tokens)).max() < 0.01


def test_ceiling_caps_the_curve_before_training():
    capped = LossCurve(2.0, 50.0, 0.5, "test", ceiling=6.0)
    assert capped.loss(1.0) == 6.0 and capped.loss(1e6) == pytest.approx(2.05)


def test_prior_curve_is_the_prior():
    curve = prior_curve(1.5e8, 4)
    tokens = np.array([1e6, 1e9])  # the two points it is laid through
    assert curve.loss(tokens) == pytest.approx(prior_loss(1.5e8, tokens, 4), rel=1e-9)
    assert curve.floor == pytest.approx(float(prior_loss(1.5e8, 1e30, 4)), rel=1e-9)


def test_time_to_target_interpolates_the_smoothed_loss():
    end = np.array([1.0, 2.0, 3.0, 4.0])
    loss = np.array([6.0, 4.0, 2.0, 2.0])  # trailing means over 3: 6, 5, 4, 8/3
    assert time_to_target(end, loss, 5.0) == 2.0
    assert time_to_target(end, loss, 3.0) == pytest.approx(3.0 + (4.0 - 3.0) / (4.0 - 8 / 3))
    assert math.isinf(time_to_target(end, loss, 1.0))


def _rows(tokens_by_node: dict[str, list[int]], batch: dict[str, int], seq_len: int = 8) -> pd.DataFrame:
    rows = []
    for node, per_round in tokens_by_node.items():
        for r, t in enumerate(per_round):
            rows.append({"node": node, "round": r, "tokens": t, "round_end_s": float(r + 1)})
    return pd.DataFrame(rows)


def test_features_of_unequal_work_and_a_missed_round():
    batch, gpus = {"a": 2, "b": 4}, {"a": 1, "b": 1}
    t = _rows({"a": [2 * 8 * 10, 2 * 8 * 10], "b": [4 * 8 * 10, 0]}, batch)
    rounds = round_frame(t, batch, gpus, 8)
    x = features(rounds, base_batch=2, base_steps=10, averaging="uniform", fragments=1, sync_delay_steps=0,
                 payload_dtype="fp16", ref_nodes=4)
    # round 0: tokens 160 and 320, CV = 80/240 = 1/3; round 1: one node present, CV 0
    assert x["work_cv2_plain"] == pytest.approx((1 / 9 + 0) / 2)
    assert x["work_cv2_weighted"] == 0
    assert x["batch_log2"] == pytest.approx(320 / 640 * 1.0)  # b's 320 tokens at log2(4/2) = 1, of 640
    assert x["steps_log2"] == pytest.approx(0.0)
    assert x["missed"] == pytest.approx(0.25) and x["payload_bits"] == 1.0
    assert x["replicas_log2"] == -1.0  # two nodes against the profile baseline's four
    stale = features(rounds, base_batch=2, base_steps=10, averaging="tokens", fragments=2, sync_delay_steps=1,
                     payload_dtype="fp32", ref_nodes=2)
    assert stale["staleness"] == pytest.approx(1 / 5) and stale["work_cv2_weighted"] == pytest.approx(1 / 18)


def _profile(efficiency_of_batch: float) -> pd.DataFrame:
    """A profile of two runs laid on CURVE: the baseline, and one with twice the batch whose tokens are
    worth `efficiency_of_batch` of the baseline's."""
    rows = []
    for run, batch, eta in (("baseline", 2, 1.0), ("big-batch", 4, efficiency_of_batch)):
        done = 0
        for r in range(12):
            for node in ("a", "b"):
                tokens = batch * 8 * 10
                rows.append({"run": run, "strategy": "baseline" if run == "baseline" else "B", "model": "tiny",
                             "params": 1e5, "seq_len": 8, "corpus": "markov", "seed": 0, "nodes": 2, "rounds": 12,
                             "base_local_steps": 10, "base_batch_size": 2, "averaging": "uniform",
                             "payload_dtype": "fp32", "fragments": 1, "sync_delay_steps": 0, "fragment_alpha": 0.0,
                             "inner_lr": 1e-3, "host": "h", "torch_version": "t", "measured_at": "now",
                             "node": node, "round": r, "gpus": 1, "batch_size": batch, "local_steps": 10,
                             "tokens": tokens, "round_end_s": float(r + 1), "staleness": 0})
            middle = done + 2 * tokens / 2
            for row in rows[-2:]:
                row["loss"] = float(CURVE.loss(eta * middle))
            done += 2 * tokens
    return pd.DataFrame(rows)[list(COLUMNS)]


def test_fit_model_measures_the_effect_a_run_shows():
    model = fit_model(_profile(0.6), "synthetic")
    run = model.runs.set_index("run")
    assert run.loc["baseline", "efficiency"] == pytest.approx(1.0, abs=0.01)
    assert run.loc["big-batch", "efficiency"] == pytest.approx(0.6, rel=0.01)  # a log grid of step 0.005
    # only batch_log2 was varied (by 1.0): c = -ln(0.6) / 1, less the ridge's pull
    assert set(model.coefficients) == {"work_cv2_plain", "batch_log2"} - {"work_cv2_plain"}
    assert model.coefficients["batch_log2"] == pytest.approx(-math.log(0.6), rel=0.01)


def test_profile_reader_refuses_a_profile_without_a_baseline(tmp_path):
    frame = _profile(0.6)
    frame = frame[frame["run"] != "baseline"]
    path = tmp_path / "c.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(ConvergenceProfileError, match="no baseline run"):
        read_convergence_profile(path)


def test_built_in_profile_reads_and_fits():
    model = fit_model(read_convergence_profile(BUILT_IN_PROFILE), "built-in")
    assert model.curve.floor > 0 and model.coefficients
    assert set(model.runs["run"]) >= {"baseline", "unequal-steps", "unequal-batch"}


def test_target_below_the_floor_is_one_line():
    scenario = load_scenario("hetero-cpu", ["training.target_loss=0.5"])
    with pytest.raises(InputError, match="below the loss floor"):
        loss_setup(scenario)


def test_a_profile_of_another_model_named_explicitly_is_refused():
    scenario = load_scenario("paper", [f"training.convergence_profile={BUILT_IN_PROFILE}"])
    with pytest.raises(InputError, match="expected a profile of this model"):
        loss_setup(scenario)


def test_prediction_ranks_and_reaches(tmp_path):
    from simulator.engines.engine import simulate
    from simulator.strategies import make_plan

    scenario = load_scenario("hetero-cpu", ["training.target_loss=4.0"])
    setup = loss_setup(scenario)
    got = {}
    for name in ("baseline", "rebalance"):
        plan = make_plan(scenario, name)
        got[name] = predict(setup, scenario, plan, plan_rounds(plan, simulate(scenario, plan, "auto")))
    # rebalance trains the baseline's tokens per round without the idle: the same loss, sooner
    assert got["rebalance"]["loss_end"] == pytest.approx(got["baseline"]["loss_end"], rel=0.05)
    assert got["rebalance"]["time_to_target_s"] < got["baseline"]["time_to_target_s"]
