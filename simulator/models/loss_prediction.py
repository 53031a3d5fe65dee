"""Loss and time to a target loss, per strategy: the loss model (simulator/models/convergence.py) set up for a scenario.

`loss_setup` chooses the curve and the effects once per scenario: the convergence profile named by
`[training] convergence_profile`, else the built-in one (simulator/scenarios/, measured with
`geodt calibrate convergence hetero-cpu` on this project's 2-core VM); its fitted curve and effects
inside its span (it trained the scenario's model at its sequence length, and the scenario's tokens per
parameter are within SPAN_TOKENS_FACTOR of its runs'), else the literature:
the prior's curve and each effect's published form (simulator/models/loss_literature.py), never the
profile's tiny-model coefficients. `predict` turns one strategy's simulated rounds into its loss at the
end, its time to `target_loss`, the band the effects' fits leave, and each effect's source.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from facts.presets import PRESETS
from formats.convergence import ConvergenceProfileError, read_convergence_profile
from formats.errors import InputError
from simulator.models import loss_literature as lit
from simulator.models.convergence import (
    FEATURES,
    ConvergenceModel,
    curve_losses,
    feature_values,
    features,
    fit_model,
    prior_curve,
    replica_move,
    round_frame,
    smoothed,
    smoothed_rows,
    time_to_target,
    times_to_target,
)

BUILT_IN_PROFILE = Path(__file__).resolve().parents[1] / "scenarios" / "convergence-hetero-cpu.csv"
CLAMP_MARGIN = 0.25  # a feature may go this share of the calibrated span beyond it before it is clamped
SPAN_TOKENS_FACTOR = 4.0  # a calibrated run's tokens per parameter beyond this factor of the profile's is flagged
DATA_PARALLEL_STRATEGIES = ("sync-ddp",)  # every step all-reduced: data-parallel, no DiLoCo factor


@dataclass(frozen=True)
class LossSetup:
    model: ConvergenceModel
    target: float | None
    profile: str
    same_model: bool  # the curve is the profile's own fit (else the prior)
    corpus: str
    params: float = 0.0
    tokens_per_param: tuple[float, float] = (0.0, float("inf"))  # the profile's span of D/N
    outside: str = ""  # why the scenario lies outside the profile's span ("" inside: the calibrated effects)

    @property
    def literature(self) -> bool:
        """Outside the profile's span (another model, or D/N beyond it): the published forms, not its coefficients."""
        return bool(self.outside)

    @property
    def floor(self) -> float:
        return self.model.curve.floor


def _profile(load, path: Path, *args):
    """load(path, *args, the file's version) (`_read` or `_fitted`): a file as it is now (its size and time),
    read and fitted once per process; its errors one InputError line."""
    try:
        stat = path.stat()
        version = (stat.st_size, stat.st_mtime_ns)
    except OSError:
        version = None
    try:
        return load(str(path), *args, version)
    except (ConvergenceProfileError, ValueError) as exc:
        raise InputError(f"training.convergence_profile: {exc}") from None


@lru_cache(maxsize=8)
def _read(path: str, version) -> pd.DataFrame:
    return read_convergence_profile(path)


@lru_cache(maxsize=8)
def _fitted(path: str, shown: str, version) -> ConvergenceModel:
    return fit_model(_read(path, version), shown)


def loss_setup(scenario, target: float | None = None, nodes: int | None = None) -> LossSetup:
    """The model for this scenario and the target (an argument overrides [training] target_loss; nodes
    the scenario's node count); InputError (one line) for a profile of another model named explicitly,
    or a target below the floor."""
    named = scenario.training.convergence_profile
    path = scenario.resolve_path(named) if named else BUILT_IN_PROFILE
    shown = named or "built-in hetero-cpu profile"
    frame = _profile(_read, path)
    first = frame.iloc[0]
    params, nodes = scenario.model.param_count, nodes or len(scenario.nodes)
    claimed = claimed_params(first)
    if named and claimed is not None and abs(float(first["params"]) - claimed) > 1e-6 * claimed:
        raise InputError(f"training.convergence_profile: {named}: params: {float(first['params']):.0f} is not "
                         f"model {first['model']}'s {claimed} parameters; expected the profile's own model "
                         "(a profile edited or mixed from another)")
    # a model is its parameter count at its sequence length (a preset and its config.json are one model)
    pairs = (("params", float(first["params"]), params), ("seq_len", float(first["seq_len"]), scenario.model.seq_len))
    differs = [f"{key}: the profile's {theirs:.0f}, the scenario's {mine:.0f}" for key, theirs, mine in pairs
               if abs(theirs - mine) > 1e-6 * mine]
    same = not differs
    if named and not same:
        raise InputError(f"training.convergence_profile: {named}: {'; '.join(differs)} (measured on model "
                         f"{first['model']}, the scenario trains {scenario.model.preset or 'params'}); expected a "
                         "profile of this model (geodt calibrate convergence SCENARIO), or no key: the literature "
                         "prior with the built-in profile's effects")
    # another model: the prior, none of the profile's coefficients (so no fit: most of a small simulate's loss
    # setup); another node count: the profile's own measured effect where it has one, else the prior's factor
    model = _profile(_fitted, path, shown) if same else ConvergenceModel(prior_curve(params, nodes))
    curve = (model.curve if not same or "replicas_log2" in model.coefficients
             else replica_move(model.curve, params, model.ref_nodes, nodes))
    tpp = frame.groupby("run")["tokens"].sum() / float(first["params"])
    span = (float(tpp.min()), float(tpp.max()))
    setup = LossSetup(model.with_curve(curve), scenario.training.target_loss if target is None else target,
                      named or "built-in", same, str(first["corpus"]), params, span,
                      _outside(scenario, same, params, span, named or "built-in"))
    if setup.target is not None and not setup.target > setup.floor:
        raise InputError(f"training.target_loss = {setup.target:g}: at or below the loss floor {setup.floor:.3f} "
                         f"({curve.source}); expected a target above it")
    # the measured first round's loss (a fitted curve's ceiling), else a uniform guess's
    start = curve.ceiling if np.isfinite(curve.ceiling) else untrained_loss(scenario)
    if setup.target is not None and not setup.target < start:
        raise InputError(f"training.target_loss = {setup.target:g}: at or above the loss at the curve's start "
                         f"{start:.3f} (before any training: it would be reached at the first round); expected a "
                         f"target between the floor {setup.floor:.3f} and it")
    return setup


def _outside(scenario, same: bool, params: float, span: tuple[float, float], profile: str) -> str:
    """Why the scenario lies outside the profile's span, "" inside: another model, or its baseline's tokens per
    parameter (every node's gpus × batch × H × seq_len × rounds) beyond SPAN_TOKENS_FACTOR of the profile's runs'."""
    if not same:
        return f"N {params:.3g} is outside the {profile} convergence profile's span (its model only)"
    t = scenario.training
    tokens = sum(n.gpu_count for n in scenario.nodes) * t.batch_size * t.local_steps * scenario.model.seq_len * t.rounds
    lo, hi = span
    if lo / SPAN_TOKENS_FACTOR <= tokens / params <= hi * SPAN_TOKENS_FACTOR:
        return ""
    return (f"D/N {tokens / params:.3g} is outside the {profile} convergence profile's span ({lo:.3g}-{hi:.3g}, "
            f"×{SPAN_TOKENS_FACTOR:g})")


def claimed_params(first) -> int | None:
    """The parameter count of the preset a profile names (None: a config.json's or "params")."""
    arch = PRESETS.get(str(first["model"]))
    return None if arch is None else arch.params


def untrained_loss(scenario) -> float:
    """About the loss of the untrained model: ln(vocabulary), a uniform guess (inf when the vocabulary
    is not known: a model given by its parameter count)."""
    arch = scenario.model.arch
    return float(np.log(arch.vocab_size)) if arch is not None else float("inf")


def _clamped(setup: LossSetup, x: dict) -> tuple[dict, list[str]]:
    """x (scalars or arrays) with each calibrated feature held within the profile runs' span (plus
    CLAMP_MARGIN); the features clamped anywhere."""
    runs = setup.model.runs
    out, clamped = dict(x), []
    for k in setup.model.coefficients:
        lo, hi = runs[k].min(), runs[k].max()
        pad = CLAMP_MARGIN * (hi - lo)
        v = np.clip(x[k], lo - pad, hi + pad)
        if np.any(v != x[k]):
            clamped.append(k)
        out[k] = v
    return out, clamped


def sweep_losses(setup: LossSetup, scenario, d: dict, gpus: np.ndarray, round_s: np.ndarray,
                 strategy: str = "") -> dict:
    """loss_end and time_to_target_s of a sweep chunk's plans (simulator/sweep/sweep.py decide: batch, steps
    (S, n), rounds, dtype, fragments, delay), each round taking round_s (S,): a static plan's rounds
    train the same tokens, so its features are its one round's."""
    work = (d["steps"] * d["batch"] * gpus).astype(float)
    total = work.sum(axis=1)
    x = feature_values(cv2=work.var(axis=1) / work.mean(axis=1) ** 2,
                       log2_batch=(work * np.log2(d["batch"])).sum(axis=1) / total,
                       log2_steps=(work * np.log2(d["steps"])).sum(axis=1) / total, missed=0.0 * total,
                       base_batch=scenario.training.batch_size, base_steps=scenario.training.local_steps,
                       averaging=scenario.diloco.averaging, fragments=d.get("fragments", 1),
                       sync_delay_steps=d.get("delay", 0), payload_dtype=d["dtype"], nodes=work.shape[1],
                       ref_nodes=setup.model.ref_nodes if setup.same_model else work.shape[1])
    rounds = int(np.ravel(d["rounds"])[0])
    r = np.arange(rounds)
    tokens_per_round = total * scenario.model.seq_len
    if setup.literature:
        scale = _scale(setup, scenario, float(np.mean(gpus)), float(np.median(tokens_per_round)) * rounds,
                       work.shape[1], strategy in DATA_PARALLEL_STRATEGIES, 0.0)
        factor, eta, _ = lit.combined(lit.effects(x, scale, d.get("fragments", 1), d.get("delay", 0), d["dtype"]))
        factor, eta = factor * np.ones(len(total)), eta * np.ones(len(total))
    else:
        x, _ = _clamped(setup, x)
        eta = np.exp(-sum(c * x[k] for k, c in setup.model.coefficients.items())) * np.ones(len(total))
        factor = np.ones(len(total))
    loss = factor[:, None] * setup.model.curve.loss(eta[:, None] * tokens_per_round[:, None] * (r + 0.5))
    end = np.asarray(round_s, dtype=float)[:, None] * (r + 1)
    reach = (times_to_target(end, loss, setup.target) if setup.target is not None
             else np.full(len(total), np.nan))
    return {"loss_end": smoothed_rows(loss)[:, -1], "time_to_target_s": reach}


def _scale(setup: LossSetup, scenario, gpus_per_node: float, tokens: float, nodes: int, data_parallel: bool,
           fragment_alpha: float) -> lit.Scale:
    """The scale variables of loss_literature for a run of `tokens` (all nodes) on this scenario."""
    base_batch_tokens = scenario.training.batch_size * gpus_per_node * scenario.model.seq_len
    return lit.Scale(setup.params, tokens, nodes, scenario.training.local_steps, base_batch_tokens,
                     float(setup.model.curve.loss(tokens)), data_parallel, fragment_alpha)


def plan_rounds(plan, timeline: pd.DataFrame) -> pd.DataFrame:
    """round_frame of a plan's timeline (simulated or traced)."""
    return round_frame(timeline, {n.node: n.batch_size for n in plan.nodes}, {n.node: n.gpus for n in plan.nodes},
                       plan.seq_len)


def predict(setup: LossSetup, scenario, plan, rounds: pd.DataFrame) -> dict:
    """loss_end, time_to_target_s (inf: never), efficiency η, the loss band (a share of the loss, the effects'
    fits' residuals), each effect's source (`sources`), and what the model could not weigh, for one plan."""
    x = features(rounds, base_batch=scenario.training.batch_size, base_steps=scenario.training.local_steps,
                 averaging=scenario.diloco.averaging, fragments=plan.fragments,
                 sync_delay_steps=plan.sync_delay_steps,
                 payload_dtype=plan.settings_from(scenario).payload_dtype,
                 ref_nodes=setup.model.ref_nodes if setup.same_model else len(plan.nodes))
    if setup.literature:
        scale = _scale(setup, scenario, float(np.mean([n.gpus for n in plan.nodes])), float(rounds["tokens"].sum()),
                       len(plan.nodes), plan.strategy in DATA_PARALLEL_STRATEGIES, plan.fragment_alpha)
        found = lit.effects(x, scale, plan.fragments, plan.sync_delay_steps,
                            plan.settings_from(scenario).payload_dtype)
        factor, eta, band = lit.combined(found)
        factor, eta = float(factor), float(eta)
        sources = {k: (float(np.ravel(e.delta)[0]) * 100, float(np.ravel(e.eta)[0]), f"literature: {e.source}",
                       e.extrapolated) for k, e in found.items()}
        uncalibrated, clamped = [], []
    else:
        x, clamped = _clamped(setup, x)
        eta, factor, uncalibrated = setup.model.efficiency(x), 1.0, setup.model.uncalibrated(x)
        band, sources = _calibrated_sources(setup, x, clamped, float(rounds["tokens"].sum()))
    loss = factor * curve_losses(setup.model.curve, rounds, eta)
    end_s = rounds["end_s"].to_numpy()
    pred = {"loss_end": float(smoothed(loss)[-1]), "efficiency": eta, "band": band, "sources": sources,
            "factor": factor, "rate_tokens_per_s": float(rounds["tokens"].sum() / end_s[-1]),
            "uncalibrated": uncalibrated, "clamped": clamped,
            "curve": pd.DataFrame({"round": rounds["round"], "end_s": end_s, "loss": loss})}
    pred["loss_band"] = band * pred["loss_end"]
    # at the run's last token: comparable across strategies whose rounds differ in length (loss_end, a mean
    # over the last rounds, is not: sync-ddp's rounds are one step)
    pred["loss_last_token"] = float(factor * setup.model.curve.loss(eta * float(rounds["tokens"].sum())))
    return {**pred, **reach_of(pred, setup.target)}


def at_baseline_loss(losses: dict, curve) -> float | None:  # curve: reach_of's, the strategies' own
    """Without a target: the baseline's predicted loss at its last token (the same model quality), every
    strategy's time_to_target_s and time_band_s recomputed to it in place (reach_of); None where no baseline
    was predicted."""
    if "baseline" not in losses:
        return None
    target = losses["baseline"]["loss_last_token"]
    for pred in losses.values():
        pred.update(reach_of(pred, target, curve), target_loss=target)
    return target


def reach_of(pred: dict, target: float | None, curve=None) -> dict:
    """time_to_target_s and its band (half the spread of the times with the loss moved by ± its band): the
    smoothed round losses' first crossing; with `curve` (the implicit target, the baseline's loss at its last
    token) the strategy's own curve at its mean tokens/s, carried on past the run where it ends short
    (time_beyond_run True), so that every strategy has a time to the baseline's quality."""
    if target is None:
        return {"time_to_target_s": float("nan"), "time_band_s": float("nan"), "time_beyond_run": False}
    end_s, loss = pred["curve"]["end_s"].to_numpy(), pred["curve"]["loss"].to_numpy()
    times = [time_to_target(end_s, loss * (1 + share), target) if curve is None else
             _carried_on(curve, pred, target / (1 + share)) for share in (0.0, -pred["band"], pred["band"])]
    at, early, late = times
    return {"time_to_target_s": at, "time_band_s": (late - early) / 2 if np.isfinite(late) else float("inf"),
            "time_beyond_run": bool(np.isfinite(at) and at > end_s[-1] * (1 + 1e-9))}


def _carried_on(curve, pred: dict, target: float) -> float:
    """Seconds until factor·L(η·D) = target at the run's mean tokens/s (inf below the floor)."""
    level = target / pred["factor"]
    if not level > curve.floor:
        return float("inf")
    tokens = (curve.scale / (level - curve.floor)) ** (1 / curve.exponent) / pred["efficiency"]
    return float(tokens / pred["rate_tokens_per_s"])


def _calibrated_sources(setup: LossSetup, x: dict, clamped: list[str], tokens: float) -> tuple[float, dict]:
    """The band (the profile fit's RMS ln-η residual at the curve's slope) and each weighed feature's source."""
    runs = setup.model.runs
    resid = np.log(runs["efficiency"]) - np.log(runs["efficiency_fitted"]) if runs is not None else np.zeros(1)
    curve = setup.model.curve
    slope = float(curve.scale * curve.exponent * tokens ** -curve.exponent / curve.loss(tokens))
    lo, hi = setup.tokens_per_param
    tpp = tokens / setup.params
    span = ("" if lo / SPAN_TOKENS_FACTOR <= tpp <= hi * SPAN_TOKENS_FACTOR else
            f"D/N {tpp:.3g} beyond the profile's {lo:.3g}-{hi:.3g}")
    sources = {}  # a feature held at the edge of the profile's runs: pred["clamped"], printed on its own
    for k, c in setup.model.coefficients.items():
        if abs(x.get(k, 0.0)) > 1e-9:
            sources[k] = (0.0, float(np.exp(-c * x[k])), f"calibrated: {setup.profile} profile", span)
    return float(slope * np.sqrt(np.mean(resid ** 2))), sources


def measured(rounds: pd.DataFrame, target: float | None) -> dict:
    """The same two figures from a real run's round_frame (its `loss` column, token-weighted over nodes)."""
    loss = rounds["loss"].to_numpy(float)
    reach = time_to_target(rounds["end_s"].to_numpy(), loss, target) if target is not None else float("nan")
    return {"loss_end": float(smoothed(loss)[-1]), "time_to_target_s": reach}


def describe(setup: LossSetup) -> str:
    """One line: where the curve and the effects come from."""
    if setup.literature:
        return (f"loss model: {setup.model.curve.source}; floor {setup.floor:.3f}; effects from the literature "
                f"(simulator/models/loss_literature.py): {setup.outside}, so none of its coefficients is used")
    fitted = ", ".join(f"{k} {c:+.2f}" for k, c in setup.model.coefficients.items())
    missing = [k for k in FEATURES if k not in setup.model.coefficients]
    text = (f"loss model: {setup.model.curve.source}; floor {setup.floor:.3f}; effects (ln-token cost per unit) from "
            f"the {setup.profile} convergence profile (calibrated: the scenario trains its model): {fitted or 'none'}")
    return text + (f"; not calibrated (no effect assumed): {', '.join(missing)}" if missing else "")


def format_time(seconds: float) -> str:
    return "never" if not np.isfinite(seconds) else f"{seconds:,.1f}"
