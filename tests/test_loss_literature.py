"""The literature loss effects (simulator/models/loss_literature.py) and where they apply (issue 55)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simulator.engines.engine import simulate
from simulator.models import loss_literature as lit
from simulator.models import loss_prediction
from simulator.models.convergence_prior import diloco_factor
from simulator.models.loss_prediction import describe, loss_setup, plan_rounds, predict
from simulator.outputs.report import recommend_by_target
from simulator.scenario import load_scenario
from simulator.strategies import make_plan


def test_sync_interval_form_exact():
    # 0.00875 · ln(100/30) · log2(8)/3 at M = 4 (Streaming DiLoCo Table 6's fit); nothing at H <= 30
    assert float(lit.sync_interval_delta(100, 4)) == pytest.approx(0.00875 * math.log(100 / 30), rel=1e-12)
    assert float(lit.sync_interval_delta(1000, 8)) == pytest.approx(0.00875 * math.log(1000 / 30) * 4 / 3, rel=1e-12)
    assert float(lit.sync_interval_delta(10, 4)) == 0.0


def test_critical_batch_and_batch_eta_exact():
    assert lit.critical_batch_tokens(3.0) == pytest.approx(2e8 / 3.0 ** (1 / 0.21), rel=1e-12)
    bc = lit.critical_batch_tokens(3.0)
    assert float(lit.batch_eta(2 * 16384, 16384, 3.0)) == pytest.approx((1 + 16384 / bc) / (1 + 32768 / bc))
    assert float(lit.batch_eta(16384, 16384, 3.0)) == 1.0


def test_overlap_naive_and_eager_exact():
    # at 20N: naive, Kale et al. Table 2's whole step late (12.7% at 22 tokens per parameter, 13.1% at 20) at any N;
    # eager: 0.99% at 1B, growing as N^-0.265
    assert float(lit.overlap_delta(1.0, 0.0)) == pytest.approx(0.131)
    assert float(lit.overlap_delta(1.0, 0.0, 35e6)) == pytest.approx(0.131)
    assert 100 * 0.131 * lit.overtraining_scale(5e8, 11e9) == pytest.approx(100 * (3.01 / 2.67 - 1), abs=0.05)
    assert float(lit.overlap_delta(1.0, 0.5)) == pytest.approx(0.0099)
    assert float(lit.overlap_delta(1.0, 0.5, 35e6)) == pytest.approx(0.0099 * 0.035 ** -0.265)
    assert float(lit.overlap_delta(2.0, 0.5, 5e8)) == pytest.approx(0.0099 * 0.5 ** -0.265 * 2 ** 1.5)
    assert float(lit.overlap_delta(1 / 30, 0.0)) == pytest.approx(0.131 * 30 ** -1.5)


def test_h_and_eager_forms_against_the_rows_they_were_fitted_on():
    """The fitted constants reproduce their tables: Streaming DiLoCo Table 6 (H = 100 vs 30, fit rows:
    |error| <= 0.4 points, the worst its 100M M = 2 row, +0.31% printed to a 0.31% rounding) and Kale et al.
    Table 6 (eager, |error| <= 0.55 points, the worst its 1B row, +0.40% printed to a 0.40% rounding)."""
    rows = lit.published()
    h = rows[(rows["effect"] == "sync_interval") & (rows["use"] == "fit")]
    pred = [100 * float(lit.sync_interval_delta(100, int(m))) for m in h["replicas"]]
    assert np.max(np.abs(np.array(pred) - h["published_delta_pct"].to_numpy())) < 0.4
    eager = rows[(rows["table"] == "Table 6") & (rows["effect"] == "overlap")]
    pred = [100 * float(lit.overlap_delta(1.0, 0.5, n)) * lit.overtraining_scale(n, d)
            for n, d in zip(eager["params"], eager["tokens"], strict=True)]
    assert len(eager) == 6 and np.max(np.abs(np.array(pred) - eager["published_delta_pct"].to_numpy())) < 0.55


def test_published_rows_are_the_tables_and_the_band_is_their_residual():
    everything = lit.published()
    assert len(everything) == 96 and set(everything["arxiv"]) == {"2503.09799v1", "2501.18512v1", "2502.12996v1",
                                                                  "2401.09135v2"}
    rows = everything[everything["arxiv"] == "2503.09799v1"]
    assert len(rows) == 34 and set(rows["table"]) == {"Table 4", "Table 5"}
    naive = everything[(everything["table"] == "Table 2") & (everything["setting"].str.contains("naive"))].iloc[0]
    assert naive["published_delta_pct"] == pytest.approx(100 * (3.01 / 2.67 - 1), abs=1e-3)
    # Liu et al. print perplexity: the loss is its log (Table 3, 150M: 17.26 against 17.23)
    liu = everything[(everything["arxiv"] == "2401.09135v2") & (everything["params"] == 1.5e8)].iloc[0]
    assert liu["published_delta_pct"] == pytest.approx(100 * (math.log(17.26) / math.log(17.23) - 1), abs=1e-3)
    r = rows[(rows["params"] == 35e6) & (rows["replicas"] == 8)].iloc[0]
    assert r["published_delta_pct"] == pytest.approx(100 * (3.621 / 3.485 - 1), abs=1e-3)
    predicted = 100 * (diloco_factor(rows["params"].to_numpy(), rows["replicas"].to_numpy()) - 1)
    rms = np.sqrt(np.mean((predicted - rows["published_delta_pct"].to_numpy()) ** 2)) / 100
    assert lit.replica_band() == pytest.approx(rms, rel=1e-9) and 0 < lit.replica_band() < 0.005


def _predict(scenario, name):
    setup = loss_setup(scenario)
    plan = make_plan(scenario, name)
    return predict(setup, scenario, plan, plan_rounds(plan, simulate(scenario, plan, "auto")))


def test_paper_uses_the_literature_and_data_parallel_has_no_diloco_factor():
    scenario = load_scenario("paper", ["training.rounds=4"])
    setup = loss_setup(scenario)
    assert setup.literature and "from the literature" in describe(setup)
    ddp, base = _predict(scenario, "sync-ddp"), _predict(scenario, "baseline")
    factor = float(diloco_factor(scenario.model.param_count, 4))
    assert ddp["sources"]["data_parallel"][0] == pytest.approx(100 * (1 / factor - 1), rel=1e-9)
    assert "Charles et al. 2025 Table 7" in ddp["sources"]["data_parallel"][2]
    assert "sync_interval" not in ddp["sources"] and "sync_interval" in base["sources"]
    # no tiny-profile coefficient reaches a 150M model: nothing calibrated, nothing held at an edge
    assert base["uncalibrated"] == [] and base["clamped"] == []
    assert all(src.startswith("literature") for _, _, src, _ in base["sources"].values())


def test_one_node_scenario_gives_losses():
    scenario = load_scenario("paper", ["training.rounds=3"])
    from dataclasses import replace
    one = replace(scenario, nodes=scenario.nodes[:1])
    for name in ("baseline", "sync-ddp"):
        got = _predict(one, name)
        assert np.isfinite(got["loss_end"]) and got["loss_end"] > loss_setup(one).floor


def test_the_tiny_model_stays_calibrated():
    scenario = load_scenario("hetero-cpu", ["training.rounds=4"])
    setup = loss_setup(scenario)
    assert not setup.literature
    got = _predict(scenario, "measured-batch")
    assert all(src.startswith("calibrated") for _, _, src, _ in got["sources"].values())


def test_the_tiny_model_far_beyond_its_profile_tokens_takes_the_literature():
    """The built-in profile ran 0.18-0.45 tokens per parameter: at 460 rounds (17.9) its coefficients do not apply."""
    scenario = load_scenario("hetero-cpu", ["training.rounds=460"])
    setup = loss_setup(scenario)
    assert setup.literature and "D/N 17.9 is outside the built-in convergence profile's span" in describe(setup)
    assert not loss_setup(load_scenario("hetero-cpu", ["training.rounds=40"])).literature  # 1.56: inside ×4


def _table(times, bands, strategies):
    return pd.DataFrame({"strategy": strategies, "time_to_target_s": times, "time_band_s": bands,
                         "loss_end": [3.0] * len(times), "tokens_per_s": [1.0] * len(times),
                         "speedup": [1.0] * len(times), "idle_s": [0.0] * len(times),
                         "uncalibrated": [""] * len(times), "time_beyond_run": [False] * len(times)})


def test_a_tie_within_the_band_is_named_and_an_exact_tie_goes_to_the_first_listed():
    got = recommend_by_target(_table([10.0, 10.0, 30.0], [0.0, 0.0, 0.0], ["rebalance", "quorum", "baseline"]),
                              {}, 3.0, implicit=True)
    assert got.strategy == "rebalance" and "rebalance ≈ quorum" in got.reason
    got = recommend_by_target(_table([10.0, 10.0, 30.0], [0.0, 0.0, 0.0], ["quorum", "rebalance", "baseline"]),
                              {}, 3.0, implicit=True)
    assert got.strategy == "rebalance"  # the simpler, whatever the order asked
    assert "ranked by the predicted time to the baseline's predicted loss" in got.reason
    got = recommend_by_target(_table([10.0, 10.5, 30.0], [1.0, 0.2, 0.0], ["a", "b", "baseline"]), {}, 3.0)
    assert got.strategy == "a" and "a ≈ b" in got.reason and "baseline" not in got.reason.split("tie")[1][:30]
    got = recommend_by_target(_table([10.0, 12.0, 30.0], [1.0, 0.5, 0.0], ["a", "b", "baseline"]), {}, 3.0)
    assert "tie" not in got.reason


def test_the_answer_ranks_by_the_baseline_loss_even_unasked_and_an_exact_tie_goes_to_rebalance(tmp_path, capsys):
    from simulator.cli import simulate_main

    assert simulate_main(["paper", "--strategy", "quorum", "rebalance", "--out", str(tmp_path / "s")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("recommended: rebalance — ranked by the predicted time to the baseline's predicted loss")
    assert "quorum ≈ rebalance; equal times: rebalance, the simpler" in line
    per = pd.read_csv(tmp_path / "s" / "summary.csv").groupby("strategy")["time_to_target_s"].first()
    assert per["quorum"] == per["rebalance"] and np.isfinite(per).all()


def test_h_and_overlap_bands_are_their_forms_residuals_and_apply_only_where_the_effect_does():
    rows = lit.published()
    h = rows[rows["effect"] == "sync_interval"]
    residual = [100 * float(lit.sync_interval_delta(100, int(m))) * lit.overtraining_scale(n, d) - p
                for m, n, d, p in zip(h["replicas"], h["params"], h["tokens"], h["published_delta_pct"], strict=True)]
    assert len(h) == 12 and lit.form_band("sync_interval") == pytest.approx(np.sqrt(np.mean(np.square(residual))) / 100)
    assert 0 < lit.form_band("sync_interval") < lit.form_band("overlap") < 0.01
    scale = lit.Scale(1.5e8, 3e9, 4, 30, 65536, 3.0, fragment_alpha=0.5)
    x = {"batch_log2": 0.0, "steps_log2": 0.0}
    same = lit.effects(x, scale)
    assert same["sync_interval"].band == 0.0 and same["overlap"].band == 0.0
    moved = lit.effects({"batch_log2": 0.0, "steps_log2": 1.0}, scale, 4, 3)
    assert moved["sync_interval"].band == lit.form_band("sync_interval")
    assert moved["overlap"].band == lit.form_band("overlap")


def test_overtraining_scale_is_the_curves_slope_against_20n_held_to_20_250():
    """s(D)/s(20N) of Besiroglu et al.'s Chinchilla fit, s = β·B·D^−β / L: 1 up to 20 tokens per parameter, held at 250."""
    from simulator.models.convergence_prior import BESIROGLU_2024 as fit
    from simulator.models.convergence_prior import chinchilla_loss

    def slope(n, d):
        return fit.tokens_exponent * fit.tokens_coeff * d ** -fit.tokens_exponent / float(chinchilla_loss(n, d))

    assert lit.overtraining_scale(1e9, 100e9) == pytest.approx(slope(1e9, 100e9) / slope(1e9, 20e9), rel=1e-12)
    assert lit.overtraining_scale(1e9, 5e9) == 1.0 and lit.overtraining_scale(1e9, 20e9) == 1.0
    assert lit.overtraining_scale(1e9, 1e13) == lit.overtraining_scale(1e9, 250e9) < lit.overtraining_scale(1e9, 1e11)
    assert 0.4 < lit.overtraining_scale(1e9, 250e9) < 0.5  # the curve is about half as steep at 250 as at 20


def test_overtrained_diloco_carries_its_factor_scaled_and_data_parallel_the_residual_band():
    """At 100 tokens per parameter a DiLoCo run's M factor (in the curve, measured at 20N) is scaled down by the
    overtraining effect, H and overlap with it; data-parallel has none of it but its band widens by the residual
    against Streaming DiLoCo Table 7; within 20N nothing changes."""
    x = {"batch_log2": 0.0, "steps_log2": 1.0}
    shrink = lit.overtraining_scale(1e9, 1e11)
    got = lit.effects(x, lit.Scale(1e9, 1e11, 4, 30, 65536, 2.4, fragment_alpha=0.5), 4, 3)
    factor = float(diloco_factor(1e9, 4))
    assert float(got["overtraining"].delta) == pytest.approx((factor - 1) * (shrink - 1), rel=1e-12)
    assert float(got["sync_interval"].delta) == pytest.approx(shrink * float(lit.sync_interval_delta(60, 4)))
    assert float(got["overlap"].delta) == pytest.approx(shrink * float(lit.overlap_delta(3 / 60, 0.5, 1e9)))
    assert got["overtraining"].extrapolated == "" and "Table 7" in got["overtraining"].source
    at20 = lit.effects(x, lit.Scale(1e9, 2e10, 4, 30, 65536, 2.5), 4, 3)
    assert "overtraining" not in at20 and float(at20["sync_interval"].delta) == float(lit.sync_interval_delta(60, 4))
    dp = lit.effects(x, lit.Scale(1e9, 1e11, 4, 30, 65536, 2.4, data_parallel=True))
    assert "overtraining" not in dp and dp["data_parallel"].band > lit.replica_band()
    assert dp["data_parallel"].band == pytest.approx(math.hypot(lit.replica_band(), lit.overtraining_band()))
    far = lit.effects(x, lit.Scale(1e9, 1e12, 4, 30, 65536, 2.3), 4, 3)
    assert "1e+03 > 250" in far["overtraining"].extrapolated and "outside 10-250" in far["replicas"].extrapolated


def test_the_overtraining_band_is_the_forms_residual_on_table_7():
    rows = lit.published()
    rows = rows[rows["effect"] == "overtraining"]
    assert len(rows) == 9 and set(rows["table"]) == {"Table 7"}
    # 1B at 100B tokens, M = 4 against data-parallel: the streaming run's factor and naive τ = 1 overlap, scaled
    row = rows[(rows["tokens"] == 1e11) & (rows["reference_run"] == "dp M=4")].iloc[0]
    own = float(diloco_factor(1e9, 4)) - 1 + float(lit.overlap_delta(1 / 30, 0.0, 1e9))
    assert lit.overtraining_delta_pct(row) == pytest.approx(100 * own * lit.overtraining_scale(1e9, 1e11))
    residual = [lit.overtraining_delta_pct(r) - r.published_delta_pct for r in rows.itertuples()]
    assert lit.overtraining_band() == pytest.approx(np.sqrt(np.mean(np.square(residual))) / 100)
    assert 0.005 < lit.overtraining_band() < 0.015


def test_an_effect_too_small_to_print_is_left_out_of_the_notes():
    """`simulate paper --set training.rounds=460` printed "measured-batch: overtraining -0.00%": an effect
    under the printed precision (0.01%) is not named as one."""
    from simulator.cli import _effect_text, _shown

    assert not _shown(-0.004, 1.0) and _shown(-0.005, 1.0) and _shown(0.0, 0.999) and not _shown(0.0, 0.9999)
    assert _effect_text("overtraining", -0.18, 1.0) == "overtraining -0.18%"
    assert _effect_text("batch", 0.001, 0.962) == "batch η 0.962"


def test_a_scenario_of_another_model_never_fits_the_profile(monkeypatch):
    """The literature path uses none of the built-in profile's coefficients, so its fit (most of a small simulate's
    loss setup) is not made; the profile's own model still fits it (and gets its coefficients)."""
    fitted = []
    real_fit = loss_prediction.fit_model
    monkeypatch.setattr(loss_prediction, "fit_model", lambda *a: fitted.append(a) or real_fit(*a))
    loss_prediction._fitted.cache_clear()
    setup = loss_setup(load_scenario("paper"))
    assert setup.literature and not setup.model.coefficients and fitted == []
    tiny = loss_setup(load_scenario("hetero-cpu"))
    assert not tiny.literature and tiny.model.coefficients and len(fitted) == 1
