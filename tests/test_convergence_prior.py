"""The identical-replica loss prior reproduces Charles et al. 2025's published losses within their fit error.

Every number written out below is the paper's own (arXiv 2503.09799v1; Besiroglu et al. 2024,
arXiv 2404.10102 for the data term), typed here again rather than read from the module, so a
wrong constant in simulator/models/convergence_prior.py fails a test instead of agreeing with itself.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.models import convergence_prior as cp

SWEPT_SIZES = (35e6, 90e6, 180e6, 335e6, 550e6, 1.3e9, 2.4e9)  # Table 4's rows
DP = cp.DATA_PARALLEL

# Table 4's printed "% difference w.r.t. Data-Parallel", M = 1, 2, 4, 8, per row.
TABLE_4_PERCENT = {
    35e6: (-0.1, 0.7, 2.0, 3.9), 90e6: (-0.1, 0.5, 1.5, 3.1), 180e6: (-0.2, 0.3, 1.1, 2.3),
    335e6: (-0.3, 0.1, 0.9, 2.0), 550e6: (-0.3, 0.2, 0.7, 1.7), 1.3e9: (-0.4, 0.2, 0.5, 1.3),
    2.4e9: (-0.4, -0.1, 0.3, 1.1),
}
# Table 11: leave-2.4B-out residuals |log L − log L̂| of the loss laws, per M; average 0.012.
LOO_INDEPENDENT = {1: 0.011, 2: 0.0099, 4: 0.012, 8: 0.014}
LOO_JOINT = {1: 0.019, 2: 0.013, 4: 0.0082, 8: 0.0076}
LOO_AVERAGE = 0.012
# Table 7 (independent power laws A · N^α).
TABLE_7 = {DP: (18.129, -0.0953), 1: (18.363, -0.0961), 2: (18.768, -0.0969),
           4: (19.762, -0.0992), 8: (21.051, -0.1018)}


def _records(source_table: str):
    return [r for r in cp.published_losses() if r.source.endswith(source_table)]


def _dp_loss(params: float) -> float:
    return next(r.loss_nats for r in cp.published_losses() if r.params == params and r.replicas == DP)


def test_published_losses_are_table_4_and_table_5_as_printed():
    table_4, table_5 = _records("Table 4"), _records("Table 5")
    assert len(table_4) == 7 * 5 and len(table_5) == 2 * 4
    assert all(r.tokens == 20 * r.params for r in cp.published_losses())  # Section 3.1: D = 20 N
    # The transcription against the table's own % column: losses are printed to 3 decimals, so a
    # recomputed % may differ from the printed (1-decimal) one by 0.05 + 0.0005/2.3 ≈ 0.07 points.
    for r in table_4:
        if r.replicas != DP:
            printed = TABLE_4_PERCENT[r.params][cp.FITTED_REPLICAS.index(r.replicas)]
            assert 100 * (r.loss_nats / _dp_loss(r.params) - 1) == pytest.approx(printed, abs=0.07), r


@pytest.mark.parametrize("record", _records("Table 4"), ids=lambda r: f"N={r.params:.3g},M={r.replicas}")
def test_the_independent_fit_reproduces_each_table_4_loss_within_the_reported_residual(record):
    # Tolerance: Table 11's leave-one-out residual of the independent loss law for this M (the
    # paper's only per-M fit error); data-parallel, which Table 11 omits, gets the 0.012 average.
    tolerance = LOO_INDEPENDENT.get(record.replicas, LOO_AVERAGE)
    fitted = cp.diloco_power_law_loss(record.params, record.replicas)
    assert abs(math.log(fitted) - math.log(record.loss_nats)) <= tolerance


@pytest.mark.parametrize("record", [r for r in _records("Table 4") if r.replicas != DP],
                         ids=lambda r: f"N={r.params:.3g},M={r.replicas}")
def test_the_joint_fit_reproduces_each_table_4_loss_within_its_largest_reported_residual(record):
    # Tolerance: the largest joint-fit residual in Table 11 (0.019, M = 1). The per-M values are
    # out-of-sample at 2.4B only; in-sample the joint law misses small models by more (35M, M = 8:
    # 0.017), so the per-M figure would be a claim the paper does not make.
    fitted = cp.joint_power_law_loss(record.params, record.replicas)
    assert abs(math.log(fitted) - math.log(record.loss_nats)) <= max(LOO_JOINT.values())


@pytest.mark.parametrize("record", _records("Table 5"), ids=lambda r: f"N={r.params:.3g},M={r.replicas}")
def test_the_fit_extrapolates_to_4b_and_10b_within_a_few_percent_and_low(record):
    # Section 6.4: the 4B and 10B losses are "within a few percentage points of the loss predicted
    # by the scaling laws" (no number given); read here as 5%. The misses are 0.8–4.0%, all with
    # the law below the measured loss: a pure power law has no floor and undershoots.
    fitted = float(cp.diloco_power_law_loss(record.params, record.replicas))
    assert abs(math.log(fitted / record.loss_nats)) <= 0.05
    assert fitted < record.loss_nats


def test_a_refit_of_table_4_recovers_table_7():
    # Least squares on log L vs log N is how Section 6.1 fits; the nominal sizes (e.g. 335M) stand in
    # for the exact parameter counts, which the paper does not print, hence the slack.
    for m, (coeff, exponent) in TABLE_7.items():
        rows = [r for r in _records("Table 4") if r.replicas == m]
        log_params, log_losses = np.log([r.params for r in rows]), np.log([r.loss_nats for r in rows])
        slope, intercept = np.polyfit(log_params, log_losses, 1)
        assert slope == pytest.approx(exponent, abs=5e-4)
        assert intercept == pytest.approx(math.log(coeff), abs=5e-3)
        assert cp.POWER_LAW_BY_REPLICAS[m] == (coeff, exponent)


@pytest.mark.parametrize("params", (4e9, 10e9))
@pytest.mark.parametrize("replicas", (1, 2, 4))
def test_the_clipped_factor_matches_the_4b_and_10b_loss_ratios(params, replicas):
    # Tolerance: Table 11's average residual of the loss law (0.012), both fit types.
    measured = next(r.loss_nats for r in _records("Table 5") if r.params == params and r.replicas == replicas)
    ratio = measured / _dp_loss(params)
    assert abs(math.log(cp.diloco_factor(params, replicas) / ratio)) <= LOO_AVERAGE


def test_the_closed_form_at_two_points():
    # 1B parameters on 20B tokens, M = 4: both Table 7 rows apply directly.
    chinchilla = 1.8172 + 482.01 / 1e9 ** 0.3478 + 2085.43 / 2e10 ** 0.3658
    factor = (19.762 / 18.129) * 1e9 ** (-0.0992 - -0.0953)
    assert cp.chinchilla_loss(1e9, 2e10) == pytest.approx(chinchilla, rel=1e-12)
    assert cp.diloco_factor(1e9, 4) == pytest.approx(factor, rel=1e-12)
    assert cp.prior_loss(1e9, 2e10, 4) == pytest.approx(chinchilla * factor, rel=1e-12)
    assert cp.diloco_power_law_loss(1e9, 4) == pytest.approx(19.762 * 1e9 ** -0.0992, rel=1e-12)
    assert cp.joint_power_law_loss(1e9, 4) == pytest.approx(19.226 * 1e9 ** -0.0985 * 4 ** 0.0116, rel=1e-12)
    # Chinchilla itself (70B, 1.4T tokens), M = 3: N clipped to 2.4B, M between the M = 2 and M = 4
    # rows at weight log2(3/2) in ln M.
    w = math.log2(1.5)
    log_coeff = (1 - w) * math.log(18.768) + w * math.log(19.762)
    exponent = (1 - w) * -0.0969 + w * -0.0992
    factor = math.exp(log_coeff - math.log(18.129) + (exponent + 0.0953) * math.log(2.4e9))
    chinchilla = 1.8172 + 482.01 / 7e10 ** 0.3478 + 2085.43 / 1.4e12 ** 0.3658
    assert cp.prior_loss(7e10, 1.4e12, 3) == pytest.approx(chinchilla * factor, rel=1e-12)


def test_more_tokens_lower_the_loss():
    tokens = np.geomspace(1e8, 1e13, 60)
    for replicas in (DP, 1, 2, 4, 8):
        assert np.all(np.diff(cp.prior_loss(1e9, tokens, replicas)) < 0)
    assert np.all(np.diff(cp.chinchilla_loss(1e9, tokens)) < 0)


def test_a_bigger_model_at_20_tokens_per_param_has_a_lower_loss():
    params = np.geomspace(1e7, 1e12, 80)  # beyond both ends of the swept range
    for replicas in (DP, 1, 2, 3, 4, 8, 16):
        assert np.all(np.diff(cp.prior_loss(params, 20 * params, replicas)) < 0), replicas


def test_the_factor_behaves_as_the_paper_reports():
    sizes = np.array(SWEPT_SIZES)
    assert np.all(cp.diloco_factor(sizes, DP) == 1.0)
    # Finding 2 / Section 6.1: DiLoCo with M = 1 beats data-parallel at every swept size.
    assert np.all(cp.diloco_factor(sizes, 1) < 1)
    # Table 4: at every size, loss rises with M (1 < 2 < 4 < 8), and M = 8 costs most.
    by_m = np.array([cp.diloco_factor(sizes, m) for m in (1, 2, 3, 4, 5, 6, 7, 8)])
    assert np.all(np.diff(by_m, axis=0) > 0)
    assert np.all(cp.diloco_factor(sizes, 8) > 1)
    # Finding 1: DiLoCo's loss relative to data-parallel falls as N grows, for every M.
    for m in cp.FITTED_REPLICAS:
        assert np.all(np.diff(cp.diloco_factor(sizes, m)) < 0), m
    # The fit's own figure at 35M, M = 8 (Table 4 measured +3.9%).
    assert cp.diloco_factor(35e6, 8) == pytest.approx(1.039, abs=0.01)


def test_the_factor_is_held_at_the_edges_of_what_was_fitted():
    assert cp.diloco_factor(1e12, 4) == cp.diloco_factor(2.4e9, 4)
    assert cp.diloco_factor(1e6, 4) == cp.diloco_factor(35e6, 4)
    assert cp.diloco_factor(1e9, 64) == cp.diloco_factor(1e9, 8)
    # …while the published curve itself is not clipped.
    assert cp.diloco_power_law_loss(1e12, 4) < cp.diloco_power_law_loss(2.4e9, 4)


def test_it_is_vectorised_and_refuses_what_it_cannot_mean():
    params = np.array([[1e8], [1e9]])
    replicas = np.array([DP, 1, 2, 8])
    assert cp.prior_loss(params, 20 * params, replicas).shape == (2, 4)
    assert cp.prior_loss(1e9, 2e10, 2).shape == ()
    for bad in (0.5, -1, np.nan):
        with pytest.raises(ValueError):
            cp.diloco_factor(1e9, bad)
    with pytest.raises(ValueError):
        cp.joint_power_law_loss(1e9, DP)
    with pytest.raises(ValueError):
        cp.chinchilla_loss(0, 1e9)
    with pytest.raises(ValueError):
        cp.prior_loss(1e9, -1, 2)
