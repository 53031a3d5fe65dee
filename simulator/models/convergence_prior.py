"""The identical-replica loss prior: DiLoCo's scaling laws (Charles 2025) on a Chinchilla data term (Besiroglu 2024).

What a DiLoCo run of M identical replicas should reach, before any measurement of ours:

    prior_loss(N, D, M) = chinchilla_loss(N, D) × diloco_factor(N, M)        (nats/token)

- chinchilla_loss: L(N, D) = E + A/N^α + B/D^β, Hoffmann et al. 2022's form with the
  constants of Besiroglu et al. 2024's refit (arXiv 2404.10102), which replaces Hoffmann's own
  rounded, under-converged estimates. It carries the loss's dependence on tokens D.
- diloco_factor: L_DiLoCo(N, M) / L_DataParallel(N) from the per-M power laws
  L_M(N) = A_M · N^α_M of Charles et al. 2025 (arXiv 2503.09799v1, Table 7), fitted on C4 at
  D = 20 N tokens and H = 30 inner steps per sync, over N = 35M … 2.4B and M ∈ {1, 2, 4, 8}.

The two halves come from different corpora (MassiveText vs C4, different tokenisers), so only
the ratio is taken from Charles et al.; its absolute loss level is theirs alone
(`diloco_power_law_loss`) and is not comparable with `chinchilla_loss`. Outside the fitted
ranges the factor is held at the edge value (see `diloco_factor`). Not covered: H ≠ 30, token
budgets other than 20 N for the factor, heterogeneous or unequally loaded replicas, M > 8.
Sources and figures: docs/convergence_prior_PAPERS.md. numpy and the standard library only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# ---------------------------------------------------------------- Chinchilla data term
# Page numbers are not given: the copies read (arXiv HTML / text) carry no page breaks.


@dataclass(frozen=True)
class ChinchillaFit:
    """L(N, D) = E + A / N^alpha + B / D^beta, in nats/token; N parameters, D training tokens."""
    irreducible_nats: float  # E
    params_coeff: float      # A
    tokens_coeff: float      # B
    params_exponent: float   # alpha
    tokens_exponent: float   # beta


# Besiroglu, Erdil, Barnett, You 2024, "Chinchilla Scaling: A replication attempt",
# arXiv 2404.10102, Section 3 / Table 1 (the refit excluding 5 outliers, 240 points).
# A, B, alpha, beta checked against the authors' own notebook output
# (github.com/epoch-research/analyzing-chinchilla, data_analysis.ipynb: A 482.006 (SE 124.5),
# B 2085.434 (SE 1293.3), alpha 0.34781, beta 0.36585, E 1.81686). E = 1.8172 is the value the
# paper reports (its equation rounds it to 1.82); the two differ by 3e-4 nats.
BESIROGLU_2024 = ChinchillaFit(1.8172, 482.01, 2085.43, 0.3478, 0.3658)
# Hoffmann et al. 2022, arXiv 2203.15556, Eq. 10 (Approach 3), as printed (rounded). Kept for
# comparison only: Besiroglu et al. show these rounded values fit the data badly.
HOFFMANN_2022 = ChinchillaFit(1.69, 406.4, 410.7, 0.34, 0.28)

# ------------------------------------------------------------------- DiLoCo factor
# Charles et al. 2025, arXiv 2503.09799v1.
DATA_PARALLEL = 0  # the replicas value that means plain data-parallel training (factor 1)
# Section 3.1: "we assume that the optimal token budget is given by D = 20N" for every run.
TOKENS_PER_PARAM = 20
# Section 3 ("Unless otherwise specified, we set H = 30") and footnote 1: the scaling laws are
# all at H = 30. Section 5.1 / Figure 9 give H's effect only as curves (no fitted law).
SYNC_CADENCE_INNER_STEPS = 30
# Table 3 / Table 4: the swept (fitted) model sizes run from 35M to 2.4B parameters.
FITTED_PARAMS_MIN = 35e6
FITTED_PARAMS_MAX = 2.4e9
# Table 7: "Power law approximations for loss L(N) ≈ A N^α", one independent fit per M.
# replicas -> (A, alpha); DATA_PARALLEL is the first row.
POWER_LAW_BY_REPLICAS = {
    DATA_PARALLEL: (18.129, -0.0953),
    1: (18.363, -0.0961),
    2: (18.768, -0.0969),
    4: (19.762, -0.0992),
    8: (21.051, -0.1018),
}
FITTED_REPLICAS = (1, 2, 4, 8)
# Table 10: joint power law L(N, M) = A N^α M^β for DiLoCo (M >= 1; not data-parallel).
JOINT_LOSS_COEFF = 19.226
JOINT_LOSS_PARAMS_EXPONENT = -0.0985
JOINT_LOSS_REPLICAS_EXPONENT = 0.0116
# Table 11: leave-2.4B-out residuals |log L - log L_pred| of the loss fits, per M, and their
# average over M (0.012 for both). These are the fit errors the paper reports.
LOO_RESIDUAL_INDEPENDENT = {1: 0.011, 2: 0.0099, 4: 0.012, 8: 0.014}
LOO_RESIDUAL_JOINT = {1: 0.019, 2: 0.013, 4: 0.0082, 8: 0.0076}
LOO_RESIDUAL_AVERAGE = 0.012


def chinchilla_loss(params, tokens, fit: ChinchillaFit = BESIROGLU_2024) -> np.ndarray:
    """E + A/N^α + B/D^β (nats/token) for N = params and D = tokens; numpy-broadcast."""
    n = _positive("params", params)
    d = _positive("tokens", tokens)
    return (fit.irreducible_nats + fit.params_coeff / n ** fit.params_exponent
            + fit.tokens_coeff / d ** fit.tokens_exponent)


def diloco_power_law_loss(params, replicas) -> np.ndarray:
    """Charles et al.'s independent fit A_M · N^α_M (Table 7): C4 eval loss at D = 20 N, H = 30.

    replicas = DATA_PARALLEL gives the data-parallel row. M between fitted values takes
    ln A and α interpolated linearly in ln M (a power law in M between neighbours, the form of
    the paper's joint fit); M > 8 is held at M = 8. N is not clipped here: this is the paper's
    curve as published, extrapolation and all.
    """
    n = _positive("params", params)
    log_coeff, exponent = _power_law_coefficients(replicas)
    return np.exp(log_coeff + exponent * np.log(n))


def joint_power_law_loss(params, replicas) -> np.ndarray:
    """Charles et al.'s joint fit 19.226 · N^-0.0985 · M^0.0116 (Table 10), DiLoCo only (M >= 1)."""
    n = _positive("params", params)
    m = np.asarray(replicas, dtype=float)
    if np.any(m < 1):
        raise ValueError(f"the joint fit covers DiLoCo with replicas >= 1, got {replicas!r}")
    return JOINT_LOSS_COEFF * n ** JOINT_LOSS_PARAMS_EXPONENT * m ** JOINT_LOSS_REPLICAS_EXPONENT


def diloco_factor(params, replicas) -> np.ndarray:
    """L_DiLoCo(N, M) / L_DataParallel(N) from Table 7's fits; 1.0 for DATA_PARALLEL.

    Held at the edge outside what was fitted, because each fit's ratio is a power law
    (A_M/A_DP) · N^(α_M − α_DP) that tends to 0 as N grows, i.e. DiLoCo "infinitely better":
    - N is clipped to [35M, 2.4B]. At the paper's 4B and 10B runs (Table 5) the clipped
      ratio is within 0.003 in log of the measured one, the unclipped within 0.007 (it puts
      M = 4 below DP at 10B, measured +0.29%); by 1T parameters the unclipped law has M = 8
      3% *better* than DP, which nothing measured supports.
    - M > 8 is treated as M = 8, an optimistic bound: loss rises with M at every fitted N
      (Table 4), so more than 8 replicas should cost at least this much.
    - 1 < M < 8 between fitted values is interpolated as in `diloco_power_law_loss`.
    """
    n = np.clip(_positive("params", params), FITTED_PARAMS_MIN, FITTED_PARAMS_MAX)
    log_coeff, exponent = _power_law_coefficients(replicas)
    dp_coeff, dp_exponent = POWER_LAW_BY_REPLICAS[DATA_PARALLEL]
    return np.exp(log_coeff - math.log(dp_coeff) + (exponent - dp_exponent) * np.log(n))


def prior_loss(params, tokens, replicas) -> np.ndarray:
    """The identical-replica prior: chinchilla_loss(N, D) × diloco_factor(N, M), in nats/token.

    The factor was measured at D = 20 N only; applying it at other D assumes it does not
    depend on D, which the paper's overtraining ablation (Section 5.2, Figure 11: loss-vs-FLOPs
    lines "essentially parallel" for 1×, 4×, 16× tokens) supports qualitatively, not in numbers.
    """
    return chinchilla_loss(params, tokens) * diloco_factor(params, replicas)


class PublishedLoss(NamedTuple):
    """One evaluation loss Charles et al. measured (C4 validation, best hyperparameters)."""
    params: float     # model size N, the paper's nominal label (e.g. 335M)
    replicas: int     # DiLoCo replicas M; DATA_PARALLEL for data-parallel
    loss_nats: float  # evaluation loss as printed (3 decimals)
    tokens: float     # training tokens D = 20 N (Section 3.1)
    source: str       # table it is printed in


# Table 4 (swept sizes; the fits' data). Columns: DP, M = 1, 2, 4, 8.
_TABLE_4 = {
    35e6: (3.485, 3.482, 3.508, 3.554, 3.621),
    90e6: (3.167, 3.162, 3.182, 3.213, 3.265),
    180e6: (2.950, 2.943, 2.957, 2.981, 3.019),
    335e6: (2.784, 2.777, 2.788, 2.808, 2.841),
    550e6: (2.653, 2.645, 2.657, 2.673, 2.698),
    1.3e9: (2.460, 2.451, 2.464, 2.472, 2.493),
    2.4e9: (2.326, 2.317, 2.323, 2.332, 2.351),
}
# Table 5 (extrapolation runs with joint-fit hyperparameters; Table 12 repeats them with
# independent-fit ones). Columns: DP, M = 1, 2, 4 (no M = 8 run at these sizes).
_TABLE_5 = {
    4e9: (2.224, 2.219, 2.220, 2.230),
    10e9: (2.090, 2.086, 2.086, 2.096),
}


def published_losses() -> list[PublishedLoss]:
    """The paper's measured losses: Table 4 (35M…2.4B, fitted) then Table 5 (4B, 10B, held out)."""
    records = []
    for source, table in (("Charles et al. 2025, Table 4", _TABLE_4),
                          ("Charles et al. 2025, Table 5", _TABLE_5)):
        for n, losses in table.items():
            for m, loss in zip((DATA_PARALLEL, *FITTED_REPLICAS), losses):
                records.append(PublishedLoss(n, m, loss, TOKENS_PER_PARAM * n, source))
    return records


def _power_law_coefficients(replicas) -> tuple[np.ndarray, np.ndarray]:
    """(ln A, α) of Table 7 for each replicas value; interpolated in ln M, held at M = 8 above."""
    m = np.asarray(replicas, dtype=float)
    if np.any((m < 1) & (m != DATA_PARALLEL)) or np.any(~np.isfinite(m)):
        raise ValueError(f"replicas must be DATA_PARALLEL (0) or a count >= 1, got {replicas!r}")
    fitted = np.log(np.array(FITTED_REPLICAS, dtype=float))
    log_coeffs = np.array([math.log(POWER_LAW_BY_REPLICAS[k][0]) for k in FITTED_REPLICAS])
    exponents = np.array([POWER_LAW_BY_REPLICAS[k][1] for k in FITTED_REPLICAS])
    # np.interp holds the end values outside [ln 1, ln 8]: that is the clip at M = 8.
    log_m = np.log(np.where(m == DATA_PARALLEL, 1.0, m))
    log_coeff = np.interp(log_m, fitted, log_coeffs)
    exponent = np.interp(log_m, fitted, exponents)
    dp_coeff, dp_exponent = POWER_LAW_BY_REPLICAS[DATA_PARALLEL]
    is_dp = m == DATA_PARALLEL
    return (np.where(is_dp, math.log(dp_coeff), log_coeff),
            np.where(is_dp, dp_exponent, exponent))


def _positive(name: str, value) -> np.ndarray:
    """value as a float array, refusing zero, negative or non-finite entries (a power law's log)."""
    array = np.asarray(value, dtype=float)
    if np.any(~np.isfinite(array)) or np.any(array <= 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return array
