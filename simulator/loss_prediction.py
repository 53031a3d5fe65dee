"""Loss and time to a target loss, per strategy: the loss model (simulator/convergence.py) set up for a scenario.

`loss_setup` chooses the curve and the effects once per scenario: the convergence profile named by
`[training] convergence_profile`, else the built-in one (simulator/scenarios/, measured with
`geodt calibrate convergence hetero-cpu` on this project's 2-core VM); its fitted curve where it
trained the scenario's model at its sequence length, else the literature prior. `predict` turns
one strategy's simulated rounds into its loss at the end and its time to `target_loss`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from formats.errors import InputError
from simulator.convergence import (FEATURES, ConvergenceModel, curve_losses, features, fit_model, prior_curve,
                                   replica_move, round_frame, smoothed, time_to_target)

BUILT_IN_PROFILE = Path(__file__).resolve().parent / "scenarios" / "convergence-hetero-cpu.csv"
CLAMP_MARGIN = 0.25  # a feature may go this share of the calibrated span beyond it before it is clamped


@dataclass(frozen=True)
class LossSetup:
    model: ConvergenceModel
    target: float | None
    profile: str
    same_model: bool  # the curve is the profile's own fit (else the prior)
    corpus: str

    @property
    def floor(self) -> float:
        return self.model.curve.floor


def _profile_model(path: Path, shown: str) -> tuple[ConvergenceModel, pd.DataFrame]:
    from formats.convergence import ConvergenceProfileError, read_convergence_profile

    try:
        frame = read_convergence_profile(path)
        return fit_model(frame, shown), frame
    except (ConvergenceProfileError, ValueError) as exc:
        raise InputError(f"training.convergence_profile: {exc}") from None


def loss_setup(scenario, target: float | None = None) -> LossSetup:
    """The model for this scenario and the target (an argument overrides [training] target_loss);
    InputError (one line) for a profile of another model named explicitly, or a target below the floor."""
    named = scenario.training.convergence_profile
    path = scenario.resolve_path(named) if named else BUILT_IN_PROFILE
    model, frame = _profile_model(path, named or "built-in hetero-cpu profile")
    first = frame.iloc[0]
    params, nodes = scenario.model.param_count, len(scenario.nodes)
    same = (str(first["model"]) == str(scenario.model.preset or "params") and int(first["seq_len"]) == scenario.model.seq_len
            and abs(float(first["params"]) - params) <= 1e-6 * params)
    if named and not same:
        raise InputError(f"training.convergence_profile: {named} was measured on model {first['model']} at seq_len "
                         f"{int(first['seq_len'])}; the scenario trains {scenario.model.preset or 'params'} at "
                         f"{scenario.model.seq_len}; expected a profile of this model (geodt calibrate convergence "
                         "SCENARIO), or no key: the literature prior with the built-in profile's effects")
    curve = (replica_move(model.curve, params, int(first["nodes"]), nodes) if same else prior_curve(params, nodes))
    setup = LossSetup(model.with_curve(curve), scenario.training.target_loss if target is None else target,
                      named or "built-in", same, str(first["corpus"]))
    if setup.target is not None and not setup.target > setup.floor:
        raise InputError(f"training.target_loss = {setup.target:g}: at or below the loss floor {setup.floor:.3f} "
                         f"({curve.source}); expected a target above it")
    return setup


def _clamped(setup: LossSetup, x: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """x with each calibrated feature held within the profile runs' span (plus CLAMP_MARGIN); the clamped ones."""
    runs = setup.model.runs
    out, clamped = dict(x), []
    for k in setup.model.coefficients:
        lo, hi = runs[k].min(), runs[k].max()
        pad = CLAMP_MARGIN * (hi - lo)
        v = min(max(x[k], lo - pad), hi + pad)
        if v != x[k]:
            clamped.append(k)
        out[k] = v
    return out, clamped


def plan_rounds(plan, timeline: pd.DataFrame) -> pd.DataFrame:
    """round_frame of a plan's timeline (simulated or traced)."""
    return round_frame(timeline, {n.node: n.batch_size for n in plan.nodes}, {n.node: n.gpus for n in plan.nodes},
                       plan.seq_len)


def predict(setup: LossSetup, scenario, plan, rounds: pd.DataFrame) -> dict:
    """loss_end, time_to_target_s (inf: never), efficiency η and what the model could not weigh, for one plan."""
    x = features(rounds, base_batch=scenario.training.batch_size, base_steps=scenario.training.local_steps,
                 averaging=scenario.diloco.averaging, fragments=plan.fragments,
                 sync_delay_steps=plan.sync_delay_steps,
                 payload_dtype=plan.payload_dtype or scenario.network.payload_dtype)
    x, clamped = _clamped(setup, x)
    eta = setup.model.efficiency(x)
    loss = curve_losses(setup.model.curve, rounds, eta)
    reach = (time_to_target(rounds["end_s"].to_numpy(), loss, setup.target) if setup.target is not None
             else float("nan"))
    return {"loss_end": float(smoothed(loss)[-1]), "time_to_target_s": reach, "efficiency": eta,
            "uncalibrated": setup.model.uncalibrated(x), "clamped": clamped,
            "curve": pd.DataFrame({"round": rounds["round"], "end_s": rounds["end_s"], "loss": loss})}


def measured(rounds: pd.DataFrame, target: float | None) -> dict:
    """The same two figures from a real run's round_frame (its `loss` column, token-weighted over nodes)."""
    loss = rounds["loss"].to_numpy(float)
    reach = time_to_target(rounds["end_s"].to_numpy(), loss, target) if target is not None else float("nan")
    return {"loss_end": float(smoothed(loss)[-1]), "time_to_target_s": reach}


def describe(setup: LossSetup) -> str:
    """One line: where the curve and the effects come from."""
    fitted = ", ".join(f"{k} {c:+.2f}" for k, c in setup.model.coefficients.items())
    missing = [k for k in FEATURES if k not in setup.model.coefficients]
    text = (f"loss model: {setup.model.curve.source}; floor {setup.floor:.3f}; effects (ln-token cost per unit) from "
            f"the {setup.profile} convergence profile: {fitted or 'none'}")
    return text + (f"; not calibrated (no effect assumed): {', '.join(missing)}" if missing else "")


def format_time(seconds: float) -> str:
    return "never" if not np.isfinite(seconds) else f"{seconds:,.1f}"
