"""A convergence profile is checked for what it claims (issue 59), and a target loss above the
curve's start is refused as one below its floor is.

Was: a profile whose loss rises with tokens was fitted and predicted loss 1.0 (recommending
sync-ddp); a profile naming another model than its parameter count was accepted; all-zero tokens
gave "SVD did not converge"; a target of 100 or 1000 nats was "reached" at every first round; a
profile refused for its params named the model, not the field."""
from __future__ import annotations

import pandas as pd
import pytest

from formats.convergence import ConvergenceProfileError, read_convergence_profile
from formats.errors import InputError
from simulator.models.loss_prediction import BUILT_IN_PROFILE, loss_setup
from simulator.scenario import load_scenario


def _edited(tmp_path, change):
    frame = pd.read_csv(BUILT_IN_PROFILE, keep_default_na=False)
    path = tmp_path / "convergence.csv"
    change(frame).to_csv(path, index=False)
    return path


def _rising(frame):
    base = frame["run"] == "baseline"
    frame.loc[base, "loss"] = frame.loc[base, "loss"].to_numpy()[::-1]  # the same losses, last round first
    return frame


def test_a_profile_whose_loss_rises_with_tokens_is_refused(tmp_path):
    with pytest.raises(ConvergenceProfileError, match=r"run baseline: loss: .* at round 0, .* at round \d+; expected "
                                                      r"a loss that falls with tokens"):
        read_convergence_profile(_edited(tmp_path, _rising))


def test_a_run_without_tokens_is_refused_naming_it(tmp_path):
    def no_tokens(frame):
        frame.loc[frame["run"] == "unequal-steps", "tokens"] = 0
        return frame

    with pytest.raises(ConvergenceProfileError, match="run unequal-steps: tokens: 0 on every row; expected the tokens"):
        read_convergence_profile(_edited(tmp_path, no_tokens))


def test_negative_tokens_are_refused_naming_the_row(tmp_path):
    def negative(frame):
        frame.loc[3, "tokens"] = -5
        return frame

    with pytest.raises(ConvergenceProfileError, match=r"row 4: tokens = -5; expected a number >= 0"):
        read_convergence_profile(_edited(tmp_path, negative))


def test_a_profile_naming_another_model_than_its_params_is_refused(tmp_path):
    path = _edited(tmp_path, lambda frame: frame.assign(model="llama-60m"))
    scenario = load_scenario("hetero-cpu", [f"training.convergence_profile={path}"])
    with pytest.raises(InputError, match=r"^training.convergence_profile: .*: params: \d+ is not model llama-60m's \d+ "
                                         r"parameters; expected the profile's own model"):
        loss_setup(scenario)


def test_a_profile_of_another_model_names_the_field_that_differs():
    scenario = load_scenario("paper", [f"training.convergence_profile={BUILT_IN_PROFILE}"])
    with pytest.raises(InputError, match=r": params: the profile's 262464, the scenario's \d+; seq_len: the "
                                         r"profile's 64, the scenario's 1024 \(measured on model tiny"):
        loss_setup(scenario)


@pytest.mark.parametrize("target", [100.0, 1000.0])
def test_a_target_above_the_curves_start_is_refused_like_the_floor(target):
    scenario = load_scenario("hetero-cpu", [f"training.target_loss={target}"])
    with pytest.raises(InputError, match=rf"^training.target_loss = {target:g}: at or above the loss at the curve's "
                                         r"start \d+\.\d+ \(before any training"):
        loss_setup(scenario)
    start = loss_setup(scenario, target=4.0).model.curve.ceiling
    assert loss_setup(scenario, target=start * 0.999).target == pytest.approx(start * 0.999)


def test_a_target_above_an_untrained_models_loss_is_refused_on_the_prior():
    """Without a fitted curve (the prior), the start is a uniform guess's loss, ln(vocabulary): 32,000 words."""
    scenario = load_scenario("paper", ["training.target_loss=20"])
    with pytest.raises(InputError, match=r"at or above the loss at the curve's start 10\.373 "):
        loss_setup(scenario)
