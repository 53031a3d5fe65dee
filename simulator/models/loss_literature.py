"""Each strategy's effect on the loss from published results, as a function of scale (torch-free).

The loss model's curve (simulator/models/convergence.py) is Chinchilla's data term × Charles et al.
2025's DiLoCo factor for M identical replicas at H = 30 (convergence_prior.py). A strategy moves it
by effects, each a function of the scale variables (parameters N, tokens D, replicas M, inner steps
H, batch against a critical batch, overlap τ, the merge's α):

    L_strategy(D) = L(η·D) · (1 + Σ_k δ_k),     η = Π_k η_k

δ_k a share of the loss at equal tokens, η_k a token multiplier (batch acts on tokens, as McCandlish
et al. 2018 write it). Each effect names its source (paper, table or figure), the range the source
covers, and where a run lies outside it (`extrapolated`); each has a band (a share of the loss): the
RMS residual of its form against the published comparisons it rests on (facts/loss_published.csv:
replicas, H, overlap, overtraining), else half the effect itself (batch: no rows; said so).

Every effect with a share δ was measured at about D = 20N; beyond that it is read as a token multiplier
(`overtraining_scale`: δ shrinks with the curve's slope as D/N grows).

Figures read in the papers (docs/PAPERS.md) are Charles et al. 2025 Tables 4, 5, 7, Douillard et al.
2025 (Streaming DiLoCo) Tables 5-7, Kale et al. 2025 Tables 1-3 and 6, Liu et al. 2024 Tables 1-4 and
its footnote 5, and Kaplan et al. 2020 Eq. 5.3.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.models.convergence_prior import (
    BESIROGLU_2024,
    FITTED_PARAMS_MAX,
    FITTED_PARAMS_MIN,
    SYNC_CADENCE_INNER_STEPS,
    TOKENS_PER_PARAM,
    chinchilla_loss,
    diloco_factor,
)

PUBLISHED = Path(__file__).resolve().parents[2] / "facts" / "loss_published.csv"

# Kaplan et al. 2020 (arXiv 2001.08361) Eq. 5.3: B_crit(L) = B* / L^(1/α_B), B* ≈ 2e8 tokens, α_B ≈ 0.21
# (their loss in nats on WebText2; taken here at the curve's loss). McCandlish et al. 2018: tokens to a
# loss E = E_min·(1 + B/B_crit), so at equal tokens a batch B trains like η = (1 + B0/Bc)/(1 + B/Bc) of B0's.
CRITICAL_BATCH_TOKENS = 2e8
CRITICAL_BATCH_EXPONENT = 0.21
# H across runs: δ = SYNC_INTERVAL_COST · ln(H/30) · log2(2M)/3 for H > 30 (0 at H <= 30, down to
# SYNC_INTERVAL_MIN: H = 1 is worst, Charles et al. 2025 Sect. 5.1). SYNC_INTERVAL_COST fitted (least squares)
# on Douillard et al. 2025 (Streaming DiLoCo, arXiv 2501.18512) Table 6's H = 100 against H = 30 at M = 2 and 4,
# 35M-300M (8 rows: +0.31 to +1.23%); its 500M and 1B rows held out. Flat in N over 35M-1B, as the table is.
SYNC_INTERVAL_COST = 0.00875
SYNC_INTERVAL_MIN = 5
SYNC_INTERVAL_MAX = 1000
# A delayed outer step (a share f = τ/H of an outer step late): δ = a·f^DELAY_EXPONENT, a the cost of a whole
# step late at D = 20N (Kale et al. 2025, arXiv 2502.12996): applied naively (α = 0: the late global replaces the
# local steps) a = 13.1%, their Table 2 (500M: 3.01 against 2.67, +12.7% at 22 tokens per parameter, over
# overtraining_scale there: 0.971); with eager updates (α > 0: the local outer gradient stands in until the others
# arrive) a shrinks with N: DELAY_EAGER_COST · (N/1e9)^-DELAY_EAGER_EXPONENT, least squares (on the % values, a grid
# of 5e-5 and 0.0025) on their Table 6 (1-outer-step eager against DiLoCo, H = 30, 35M-1B: +2.26% to +0.40%, each
# row's form scaled to its D/N: 20-25 tokens per parameter).
# DELAY_EXPONENT 1.5: their Table 2's 2-outer-step eager costs 3.0x the 1-outer-step (log2 3 = 1.58, rounded
# down); a quadratic would give 4x, a linear form a naive τ = 1 of H = 30 at +0.42%, which Streaming DiLoCo's
# τ = 1 runs do not show (Table 5: -0.4 to 0% against DiLoCo).
DELAY_COST_NAIVE = 0.131
DELAY_EAGER_COST = 0.0099
DELAY_EAGER_EXPONENT = 0.265
DELAY_EXPONENT = 1.5
# Payload precision: Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512) exchanges fp4 outer
# gradients without a measurable loss (Table 5: streaming with overlapped fp4 against DiLoCo, -0.4 to 0% at
# 35M-1B, within the printed rounding): no cost at 4 bits or more.
PAYLOAD_MIN_BITS = 4
PAYLOAD_WIDTH_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "fp4": 4, "int4": 4}
# Liu et al. 2024 (arXiv 2401.09135v2): async Local-SGD with delayed Nesterov and dynamic local updates "matches
# the performance of synchronous Local-SGD" (abstract); its Tables 1-3 print -0.18 to +0.06% (ln ppl) against
# synchronous DiLoCo, no larger than what the paper itself calls numerical error (footnote 5: 0.05%, two runs of
# what reduces to the same method) or no significant difference (Table 4: c = 0 against 0.1, up to 0.20%). So no
# effect; its band the printed spread.
ASYNC_BAND = 0.0018
# Overtraining: the effects with a share δ (replicas, H, overlap) were measured at about D = 20N. Read as token
# multipliers η (a run trains like η·D tokens, as the batch effect is written after McCandlish et al. 2018), a share
# at equal tokens is about ln(1/η)·s(D), s(D) = −d ln L/d ln D the curve's slope: it shrinks as D/N grows. So each
# δ is scaled by s(D)/s(20N) of Besiroglu et al. 2024's Chinchilla fit, D/N held within OVERTRAIN_TPP_MIN-MAX (below
# 20 the measured level). The form fits no constant of its own (the overlap costs below were fitted under it, at
# their rows' 20-25 tokens per parameter); checked, held out, on Streaming DiLoCo Table 7 and Kale et al. Table 1
# (1B at 25, 100, 250 tokens per parameter: the effects shrink to 0.31-0.54 of their 25 level by 250, the form to
# 0.47; their level at 25 on Dolma is 1.4-5x the C4 level at 20-25 tokens per parameter, Streaming DiLoCo Table 6
# and Charles et al. Table 4, and M = 2 against data-parallel is of the other sign: no form in N, D, M gives both).
OVERTRAIN_TPP_MIN = TOKENS_PER_PARAM
OVERTRAIN_TPP_MAX = 250

SOURCES = {
    "replicas": "Charles et al. 2025 Table 7 (DiLoCo factor; checked on Tables 4-5)",
    "data_parallel": "Charles et al. 2025 Table 7 (data-parallel row: no DiLoCo factor)",
    "sync_interval": "Douillard et al. 2025 (Streaming DiLoCo) Table 6 (H = 100 vs 30, M = 2, 4; fitted to 300M)",
    "batch": "McCandlish et al. 2018 E = Emin(1+B/Bcrit); Kaplan et al. 2020 Eq. 5.3 Bcrit(L)",
    "overlap": "Kale et al. 2025 Table 2 (naive, 500M) and Table 6 (eager, 35M-1B), a whole step late at 20N; "
               "(tau/H)^1.5 (Table 2's 2-step eager)",
    "payload": "Douillard et al. 2025 (Streaming DiLoCo) Table 5 (overlapped fp4, no cost beyond rounding)",
    "async": "Liu et al. 2024 Tables 1-4 and footnote 5 (delayed Nesterov + dynamic local updates matches "
             "synchronous, within the paper's own noise)",
    "overtraining": "each effect measured at D = 20N read as a token multiplier (McCandlish et al. 2018): scaled by "
                    "the curve's slope at D against 20N (Besiroglu et al. 2024); checked on Streaming DiLoCo Table 7 "
                    "and Kale et al. Table 1 (held out)",
    "unequal_work": "no published effect: token-weighted merges as Liu et al. 2024's dynamic local updates; "
                    "assumed none",
    "missed": "no published effect beyond the tokens not trained (already absent from D); assumed none",
}
RANGES = {
    "replicas": "N 35M-2.4B (held out to 10B), M 1-8, D = 20N (scaled to 250N: overtraining), H = 30",
    "data_parallel": "N 35M-2.4B (held out to 10B), D = 20N",
    "sync_interval": f"H {SYNC_INTERVAL_MIN}-{SYNC_INTERVAL_MAX} (measured 30-100), M 1-8 (measured 2-4)",
    "batch": "any (Bcrit from L: Kaplan's corpus)",
    "overlap": "tau/H 0-2, N 35M-1B (naive: 500M only)",
    "payload": f">= {PAYLOAD_MIN_BITS} bits",
    "async": "up to 150M parameters, 4-16 workers (Liu et al. 2024)",
    "overtraining": f"D/N {OVERTRAIN_TPP_MIN}-{OVERTRAIN_TPP_MAX} (checked, not fitted; below {OVERTRAIN_TPP_MIN}: "
                    "the measured level)",
    "unequal_work": "-",
    "missed": "-",
}


@dataclass(frozen=True)
class Scale:
    """The run's scale variables: N, D (all nodes), M, the baseline's H and per-replica batch in tokens,
    the curve's loss at D (for the critical batch), data-parallel or DiLoCo, and the overlap's merge α."""

    params: float
    tokens: float
    replicas: int
    base_steps: float
    base_batch_tokens: float
    loss: float
    data_parallel: bool = False
    fragment_alpha: float = 0.0


@dataclass(frozen=True)
class Effect:
    delta: np.ndarray  # share of the loss at equal tokens (0: none)
    eta: np.ndarray    # token multiplier (1: none)
    band: float        # share of the loss the form's fit leaves (module docstring)
    source: str
    extrapolated: str = ""  # which variable beyond which range; "" inside it


def effects(x: dict, scale: Scale, fragments=1, sync_delay_steps=0, payload_dtype="fp32") -> dict[str, Effect]:
    """Every effect for a run's features x (convergence.FEATURES; scalars or arrays of runs) at its scale."""
    zero = 0.0 * np.asarray(x["batch_log2"], dtype=float)
    steps = scale.base_steps * np.exp2(np.asarray(x["steps_log2"], dtype=float))
    shrink = overtraining_scale(scale.params, scale.tokens)
    out = {"replicas": _replicas(scale, zero)}
    if scale.data_parallel:
        out["data_parallel"] = _data_parallel(scale, zero, shrink)
    else:
        if shrink != 1.0:
            out["overtraining"] = _overtraining(scale, zero, shrink)
        out["sync_interval"] = _sync_interval(steps, scale, zero, shrink)
        out["overlap"] = _overlap(np.asarray(sync_delay_steps, float) / np.maximum(steps, 1.0), scale, zero, shrink)
    # sync-ddp keeps the baseline's global batch (its rule), so data-parallel has no batch effect against it
    out["batch"] = _batch(zero if scale.data_parallel else np.asarray(x["batch_log2"], dtype=float), scale)
    out["payload"] = _payload(payload_dtype, zero)
    for name, key in (("async", "update_staleness"), ("unequal_work", "work_cv2_plain"),
                      ("unequal_work", "work_cv2_weighted"), ("missed", "missed")):
        if np.any(np.abs(np.asarray(x.get(key, 0.0))) > 1e-9):
            band = ASYNC_BAND if name == "async" else 0.0
            out[name] = Effect(zero, zero + 1.0, band, SOURCES[name], "")
    return out


def curve_slope(params, tokens) -> np.ndarray:
    """−d ln L/d ln D of Besiroglu et al.'s Chinchilla fit: β·B·D^−β / L(N, D)."""
    fit = BESIROGLU_2024
    d = np.asarray(tokens, dtype=float)
    return fit.tokens_exponent * fit.tokens_coeff * d ** -fit.tokens_exponent / chinchilla_loss(params, d)


def overtraining_scale(params: float, tokens: float) -> float:
    """s(D)/s(20N): how much of an effect measured at D = 20N is left at D (1 at D/N <= 20; D/N held at 250)."""
    tpp = min(max(tokens / params, OVERTRAIN_TPP_MIN), OVERTRAIN_TPP_MAX)
    return float(curve_slope(params, tpp * params) / curve_slope(params, OVERTRAIN_TPP_MIN * params))


def _overtraining(scale: Scale, zero, shrink: float) -> Effect:
    """The curve's DiLoCo factor f (measured at 20N) scaled to the run's D: δ = (f − 1)·(s(D)/s(20N) − 1)."""
    factor = float(diloco_factor(scale.params, max(1, scale.replicas)))
    outside = (f"D/N {scale.tokens / scale.params:.3g} > {OVERTRAIN_TPP_MAX} (held at {OVERTRAIN_TPP_MAX})"
               if scale.tokens / scale.params > OVERTRAIN_TPP_MAX else "")
    # common to every DiLoCo strategy at this M, so no band here (data-parallel, which differs by it, carries it)
    return Effect(zero + (factor - 1.0) * (shrink - 1.0), zero + 1.0, 0.0, SOURCES["overtraining"], outside)


def _replicas(scale: Scale, zero) -> Effect:
    """M's factor is in the curve (0 here); flagged where N, M or D/N lie outside Charles et al.'s runs."""
    outside = _outside_params(scale.params)
    if scale.replicas > 8:
        outside.append(f"M {scale.replicas} > 8 (held at 8)")
    tpp = scale.tokens / scale.params
    if not 0.5 * TOKENS_PER_PARAM <= tpp <= OVERTRAIN_TPP_MAX:
        outside.append(f"D/N {tpp:.3g} outside 10-{OVERTRAIN_TPP_MAX} (factor measured at 20, scaled to "
                       f"{OVERTRAIN_TPP_MAX} by the overtraining effect)")
    # no band here: the factor is common to every DiLoCo strategy at this M (only data-parallel differs by it)
    return Effect(zero, zero + 1.0, 0.0, SOURCES["replicas"], "; ".join(outside))


def _data_parallel(scale: Scale, zero, shrink: float = 1.0) -> Effect:
    """Data-parallel has no DiLoCo factor: the curve (with M's factor) divided by it. Beyond D = 20N the factor it
    lacks is the overtraining-scaled one, whose residual against its held-out rows joins the band."""
    factor = float(diloco_factor(scale.params, max(1, scale.replicas)))
    band = replica_band() if shrink == 1.0 else math.hypot(replica_band(), overtraining_band())
    return Effect(zero + (1.0 / factor - 1.0), zero + 1.0, band, SOURCES["data_parallel"],
                  "; ".join(_outside_params(scale.params)))


def _outside_params(params: float) -> list[str]:
    if FITTED_PARAMS_MIN <= params <= FITTED_PARAMS_MAX:
        return []
    return [f"N {params:.3g} outside 35M-2.4B (factor held at the edge)"]


def sync_interval_delta(steps, replicas: int) -> np.ndarray:
    """δ of H inner steps per sync against Charles et al.'s H = 30 (0 at H <= 30)."""
    h = np.maximum(np.asarray(steps, dtype=float), SYNC_CADENCE_INNER_STEPS)
    return SYNC_INTERVAL_COST * np.log(h / SYNC_CADENCE_INNER_STEPS) * math.log2(2 * max(1, replicas)) / 3


def _sync_interval(steps, scale: Scale, zero, shrink: float = 1.0) -> Effect:
    delta = shrink * sync_interval_delta(steps, scale.replicas) + zero
    base = shrink * float(sync_interval_delta(scale.base_steps, scale.replicas))
    outside = []
    if np.any(steps < SYNC_INTERVAL_MIN) or np.any(steps > SYNC_INTERVAL_MAX):
        outside.append(f"H outside {SYNC_INTERVAL_MIN}-{SYNC_INTERVAL_MAX}")
    if scale.replicas > 8:
        outside.append(f"M {scale.replicas} > 8")
    # the form's RMS residual against its table where a run's H differs from the baseline's (only the
    # difference between strategies is ranked), none where every run keeps the baseline's H
    band = form_band("sync_interval") if np.any(np.abs(delta - base) > 1e-12) else 0.0
    return Effect(delta, zero + 1.0, band, SOURCES["sync_interval"], "; ".join(outside))


def critical_batch_tokens(loss: float) -> float:
    """Kaplan et al. 2020 Eq. 5.3: B_crit(L) = B* / L^(1/α_B), in tokens."""
    return CRITICAL_BATCH_TOKENS / max(loss, 1.0) ** (1.0 / CRITICAL_BATCH_EXPONENT)


def batch_eta(batch_tokens, base_batch_tokens: float, loss: float) -> np.ndarray:
    """McCandlish et al. 2018 at equal tokens: (1 + B0/Bc) / (1 + B/Bc)."""
    bc = critical_batch_tokens(loss)
    return (1 + base_batch_tokens / bc) / (1 + np.asarray(batch_tokens, dtype=float) / bc)


def _batch(batch_log2, scale: Scale) -> Effect:
    eta = batch_eta(scale.base_batch_tokens * np.exp2(batch_log2), scale.base_batch_tokens, scale.loss)
    # band: half the token effect, as a share of the loss (the curve's local slope d ln L / d ln D ≈ 0.1-0.3)
    return Effect(0.0 * eta, eta, 0.5 * 0.3 * float(np.max(np.abs(np.log(eta)))), SOURCES["batch"], "")


def overlap_delta(delay_share, fragment_alpha: float, params: float = 1e9) -> np.ndarray:
    """δ of an outer step applied a share f = τ/H late: a·f^1.5, a naive (α = 0) or eager (α > 0, shrinking in N)."""
    if fragment_alpha > 0:
        cost = DELAY_EAGER_COST * (params / 1e9) ** -DELAY_EAGER_EXPONENT
    else:
        cost = DELAY_COST_NAIVE
    return cost * np.asarray(delay_share, dtype=float) ** DELAY_EXPONENT


def _overlap(delay_share, scale: Scale, zero, shrink: float = 1.0) -> Effect:
    delta = shrink * overlap_delta(delay_share, scale.fragment_alpha, scale.params) + zero
    outside = "tau/H > 2" if np.any(delay_share > 2) else ""
    band = form_band("overlap") if np.any(np.abs(delta) > 1e-12) else 0.0  # none without overlap
    return Effect(delta, zero + 1.0, band, SOURCES["overlap"], outside)


def _payload(payload_dtype, zero) -> Effect:
    bits = np.vectorize(lambda d: PAYLOAD_WIDTH_BITS.get(d, 32), otypes=[float])(np.asarray(payload_dtype))
    outside = f"payload below {PAYLOAD_MIN_BITS} bits" if np.any(bits < PAYLOAD_MIN_BITS) else ""
    return Effect(zero, zero + 1.0, 0.0, SOURCES["payload"], outside)


def combined(found: dict[str, Effect]) -> tuple[np.ndarray, np.ndarray, float]:
    """(1 + Σδ, Π η, band): the loss factor, the token multiplier and the bands added in quadrature."""
    factor = 1.0 + sum(e.delta for e in found.values())
    eta = np.prod([e.eta for e in found.values()], axis=0)
    return factor, eta, float(math.sqrt(sum(e.band ** 2 for e in found.values())))


@lru_cache(maxsize=1)
def published() -> pd.DataFrame:
    """facts/loss_published.csv: the published comparisons the forms rest on."""
    return pd.read_csv(PUBLISHED, comment="#")


def replica_delta_pct(params, replicas) -> np.ndarray:
    """DiLoCo's M replicas against data-parallel, in % of the loss: the factor − 1 (Table 7's laws)."""
    return 100.0 * (np.asarray(diloco_factor(params, replicas), dtype=float) - 1.0)


@lru_cache(maxsize=1)
def replica_band() -> float:
    """RMS residual of the DiLoCo factor against the Charles et al. rows of facts/loss_published.csv (share):
    DiLoCo M against data-parallel, the comparison the factor is."""
    rows = published()
    rows = rows[(rows["effect"] == "replicas") & rows["reference_run"].str.startswith("dp ")]
    predicted = replica_delta_pct(rows["params"].to_numpy(float), rows["replicas"].to_numpy(float))
    return float(np.sqrt(np.mean((predicted - rows["published_delta_pct"].to_numpy(float)) ** 2)) / 100)


def _run_value(spec: str, key: str, default: float) -> float:
    """A key of a facts/loss_published.csv run (`diloco M=2 H=30 tau=1 ...`), default where absent."""
    found = re.search(rf"\b{key}=([0-9.]+)", spec)
    return float(found.group(1)) if found else default


def _form_delta_pct(effect: str, row) -> float:
    """The form's Δloss % for one row of facts/loss_published.csv: setting's δ less the reference's, each scaled to
    the row's D/N (overtraining_scale)."""
    shrink = overtraining_scale(row.params, row.tokens)

    def one(spec: str) -> float:
        h = _run_value(spec, "H", SYNC_CADENCE_INNER_STEPS)
        if effect == "sync_interval":
            return shrink * float(sync_interval_delta(h, int(_run_value(spec, "M", 1))))
        return shrink * float(overlap_delta(_run_value(spec, "tau", 0) / h, _run_value(spec, "alpha", 0.0),
                                            row.params))
    return 100.0 * (one(row.setting_run) - one(row.reference_run))


@lru_cache(maxsize=4)
def form_band(effect: str) -> float:
    """RMS residual (a share of the loss) of the sync_interval or overlap form against every row of its
    effect in facts/loss_published.csv, fitted and held out alike."""
    rows = published()
    rows = rows[(rows["effect"] == effect) & rows["setting_run"].str.startswith("diloco")
                & rows["reference_run"].str.startswith("diloco")]
    residual = [_form_delta_pct(effect, r) - r.published_delta_pct for r in rows.itertuples()]
    return float(np.sqrt(np.mean(np.square(residual))) / 100)


def overtraining_delta_pct(row) -> float:
    """The forms' Δloss % for one overtraining row (runs `dp M=m` or `diloco M=m ...`): each DiLoCo run's factor
    less one, plus its overlap, scaled to the row's D/N."""
    shrink = overtraining_scale(row.params, row.tokens)

    def one(spec: str) -> float:
        if not spec.startswith("diloco"):
            return 0.0
        h = _run_value(spec, "H", SYNC_CADENCE_INNER_STEPS)
        m = int(_run_value(spec, "M", 1))
        own = (float(diloco_factor(row.params, m)) - 1.0 + float(sync_interval_delta(h, m))
               + float(overlap_delta(_run_value(spec, "tau", 0) / h, _run_value(spec, "alpha", 0.0), row.params)))
        return shrink * own
    return 100.0 * ((1.0 + one(row.setting_run)) / (1.0 + one(row.reference_run)) - 1.0)


@lru_cache(maxsize=1)
def overtraining_band() -> float:
    """RMS residual (a share of the loss) of the overtraining-scaled forms against the overtraining rows (Streaming
    DiLoCo Table 7, held out): what a data-parallel against DiLoCo comparison beyond 20N may be off by."""
    rows = published()
    rows = rows[rows["effect"] == "overtraining"]
    residual = [overtraining_delta_pct(r) - r.published_delta_pct for r in rows.itertuples()]
    return float(np.sqrt(np.mean(np.square(residual))) / 100)
