"""`geodt paper`: the paper's Table 2 reproduced, the inference of step times and row C's checks, the fits,
the dtype/payload variants, B's memory band, the README rendered from the CSVs, determinism."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geodt.paper import facts, main, readme
from geodt.paper.infer import c_idle_s, c_row_checks, fit_t_max, infer, inferred_scenario
from geodt.paper.related import fit_batch_time, share_curves
from geodt.paper.tables import best_geodt_strategy, predict, table1, table2, table3
from geodt.paper.variants import memory_band, variants
from simulator.models.memory import static_memory_bytes, step_memory_bytes
from simulator.models.network import OUTER_STEP_NS_PER_PARAM, sync_s
from simulator.scenario import load_scenario

RESULTS = Path(__file__).resolve().parents[1] / "results" / "paper"


def test_table2_a_and_c_equal_the_papers():
    t = table2(load_scenario("paper"))
    assert list(t["geodt_A_batch"]) == [4, 4, 6, 5]
    assert list(t["geodt_C_local_steps"]) == [100, 104, 145, 117]
    assert t["A_match"].all() and t["C_match"].all()
    assert t["avg_match"].all() and t["normalized_match"].all()  # 117.85 prints as the paper's 117.9


def test_inferred_step_times_reproduce_the_baseline_row_exactly():
    pred = predict()
    t3 = table3(pred)
    base = t3[t3["strategy"] == "baseline"].set_index("node")
    for node, idle in facts.TABLE3_IDLE_S["baseline"].items():
        assert base.loc[node, "inferred_idle_s"] == pytest.approx(idle, abs=1e-9)


def test_t_max_is_the_least_squares_optimum_against_row_c():
    scenario = load_scenario("paper")
    inf = infer(scenario)
    gaps, h = np.array(inf.gaps_s), np.array(inf.c_local_steps, float)
    target = np.array([facts.TABLE3_IDLE_S["C"][n] for n in inf.nodes])

    def sse(t):
        return float(((c_idle_s(np.array([t]), gaps, h, 10)[0] - target) ** 2).sum())

    # Hand-worked: node2 (H = 104, gap 0) stays slowest under C, so each residual is
    # 10(104 T − H_i (T − g_i)) − paper_i = a_i T − b_i, and least squares gives T = Σ a_i b_i / Σ a_i².
    a = 10 * (104 - h)
    b = target - 10 * h * gaps
    assert inf.t_max_s == pytest.approx(float(a @ b / (a @ a)), rel=1e-12)
    assert inf.t_max_s == pytest.approx(0.0305037, abs=1e-7)
    for t in (inf.t_max_s * 0.99, inf.t_max_s * 1.01):
        assert sse(t) > inf.c_sse_s2
    # the scenario built from the inference gives every node its inferred step time
    inferred, _ = inferred_scenario()
    assert [n.step_time_s for n in inferred.nodes] == pytest.approx(list(inf.step_s), rel=1e-15)


def test_batch_time_fit_minimises_relative_error():
    fit = fit_batch_time()
    t = np.array(facts.P002_TIME_S)
    b = np.array(facts.P002_BATCH, float)
    assert np.allclose(fit.fitted_s, fit.alpha_s / b + fit.beta_s)
    assert np.allclose(fit.error_pct, (np.array(fit.fitted_s) - t) / t * 100)

    def loss(alpha, beta):
        return float((((alpha / b + beta) - t) / t) ** 2 @ np.ones_like(t))

    best = loss(fit.alpha_s, fit.beta_s)
    for da, db in ((1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)):
        assert loss(fit.alpha_s * da, fit.beta_s * db) > best
    assert max(abs(e) for e in fit.error_pct) < 10  # the affine step-time model explains the row within 10%


def test_share_curve_optimum_balances_the_two_nodes():
    c = share_curves()
    share, _ = c.best(c.separate_s)
    i = int(np.argmin(np.abs(c.share - share)))
    step = c.share[1] - c.share[0]
    # at the best split the two nodes finish within one grid step's worth of work of each other
    assert abs(c.node_a_s[i] - c.node_b_s[i]) <= (c.node_a_s[-1] + c.node_b_s[0]) * step


def test_best_strategy_is_chosen_at_equal_tokens():
    rows = [("baseline", 10.0, 100, 1.0), ("C", 5.0, 110, 1.1),
            ("more-tokens", 0.1, 800, 9.0), ("equal-a", 3.0, 102, 1.0), ("equal-b", 2.0, 99, 0.9)]
    totals = pd.DataFrame([{"source": "inferred", "strategy": s, "total_idle_s": i, "tokens_per_round": k,
                            "tokens_per_s": v, "idle_s_per_mtoken": i / k} for s, i, k, v in rows])
    assert best_geodt_strategy(totals) == "equal-b"
    assert best_geodt_strategy(totals[~totals["strategy"].str.startswith("equal")]) == "more-tokens"


def test_paper_command_rewrites_identically(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    assert main(["--out", str(first)]) == 0
    assert main(["--out", str(second)]) == 0
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"README.md", "table1_cluster.csv", "table2_allocations.csv", "table3_idle.csv", "idle_per_node.png",
            "timeline.png", "batch_time_002.png", "share_001.png"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    t2 = pd.read_csv(first / "table2_allocations.csv")
    assert t2["A_match"].all() and t2["C_match"].all()
    assert str(tmp_path) not in (first / "scenario_inferred.toml").read_text()  # nothing clone-specific


def test_out_that_is_a_file_is_an_error(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["--out", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(target) in err
    assert target.read_text() == "x"


def test_paper_modules_do_not_import_torch():
    code = ("import sys, geodt.paper.artifacts, geodt.paper.figures, geodt.paper.readme; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_table1_has_no_self_comparison_and_memory_in_gib():
    t = table1(load_scenario("paper"))
    assert not any(c.endswith("_match") for c in t.columns)  # paper_tflops IS the catalog's paper column
    assert list(t["memory_gib"]) == [11, 11, 24, 24, 24, 32]
    v100 = t[t["gpu"] == "v100-pcie"].iloc[0]
    assert (v100["paper_tflops"], v100["dense_fp16_peak_tflops"], v100["dense_bf16_peak_tflops"]) == (125.0, 112.0, 14.0)


def test_row_c_leave_one_node_out_and_anchored():
    scenario = load_scenario("paper")
    inf = infer(scenario)
    gaps, h = np.array(inf.gaps_s), np.array(inf.c_local_steps, float)
    target = np.array([facts.TABLE3_IDLE_S["C"][n] for n in inf.nodes])
    rows = c_row_checks(scenario, anchor_t_max_s=0.25)
    for k, row in enumerate(rows):
        keep = np.arange(4) != k
        # node2 (H = 104, gap 0) stays slowest: residuals a_i T − b_i, least squares over the kept nodes
        a, b = (10 * (104 - h))[keep], (target - 10 * h * gaps)[keep]
        assert row["lono_t_max_ms"] == pytest.approx(float(a @ b / (a @ a)) * 1e3, rel=1e-9)
        assert row["lono_idle_s"] == pytest.approx(c_idle_s(np.array([row["lono_t_max_ms"] / 1e3]), gaps, h, 10)[0][k])
        assert row["in_sample_t_max_ms"] == pytest.approx(inf.t_max_s * 1e3, rel=1e-12)
        assert row["anchored_idle_s"] == pytest.approx(c_idle_s(np.array([0.25]), gaps, h, 10)[0][k])
    # leaving out a node changes the fit unless it carries no weight (node2's residual is 0 for every T)
    assert fit_t_max(gaps, h, target, 10, use=np.array([True, False, True, True])) == pytest.approx(inf.t_max_s)


def test_memory_band_in_gib():
    scenario = load_scenario("paper")
    m = memory_band(scenario).set_index("node")
    assert m.loc["node3", "need_gib_at_paper_B_nominal"] == pytest.approx(step_memory_bytes(scenario, 32) / 2**30)
    cap = 24 * 2**30 * 0.95 - 1e9  # the device's memory less the reserve (1 GB + 5%)
    assert m.loc["node3", "margin_gib_nominal"] == pytest.approx((cap - step_memory_bytes(scenario, 16)) / 2**30)
    assert list(m["B_batch_nominal"]) == [4, 4, 16, 16]
    # the band: activations ±10%, static memory unchanged
    static = static_memory_bytes(scenario)
    assert m.loc["node3", "need_gib_at_paper_B_high"] == pytest.approx(
        (static + 1.1 * (step_memory_bytes(scenario, 32) - static)) / 2**30)


def test_variants_show_both_dtypes_and_payloads():
    v = variants()
    one = lambda **k: v[np.logical_and.reduce([v[c] == x for c, x in k.items()])].iloc[0]
    paper = load_scenario("paper")
    for payload in ("fp16", "fp32"):
        row = one(steps="catalog", dtype="fp16", payload_dtype=payload, strategy="baseline")
        assert row["sync_s_per_round"] == pytest.approx(sync_s(paper, payload))
    # fp32 doubles the ring's bandwidth term: 2(n-1)/n x 2 more bytes per parameter over 1 Gbit/s
    extra = one(steps="catalog", dtype="fp16", payload_dtype="fp32", strategy="baseline")["sync_s_per_round"] - \
        one(steps="catalog", dtype="fp16", payload_dtype="fp16", strategy="baseline")["sync_s_per_round"]
    assert extra == pytest.approx(1.5 * paper.model.param_count * 2 * 8 / 1e9, rel=1e-9)
    # the inferred step times are the paper's at the baseline batch, whatever the dtype: C does not move
    c16, cbf = (one(steps="inferred", dtype=d, payload_dtype="fp16", strategy="C") for d in ("fp16", "bf16"))
    assert c16["total_idle_s"] == pytest.approx(cbf["total_idle_s"])
    # the catalog's verdict on C flips with the dtype (2080 Ti, TITAN RTX, V100 to FP32 rates under bf16)
    assert one(steps="catalog", dtype="fp16", payload_dtype="fp16", strategy="C")["idle_vs_baseline"] < 1
    assert one(steps="catalog", dtype="bf16", payload_dtype="fp16", strategy="C")["idle_vs_baseline"] > 1


def _committed_frames() -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_csv(p) for p in sorted(RESULTS.glob("*.csv"))}


def test_committed_readme_is_rendered_from_the_committed_csvs():
    frames = _committed_frames()
    names = sorted(p.name for p in RESULTS.iterdir())
    assert readme.render(frames, names) == (RESULTS / "README.md").read_text()


def test_readme_numbers_follow_the_csvs():
    frames = _committed_frames()
    names = sorted(p.name for p in RESULTS.iterdir())
    before = readme.render(frames, names)
    checks = frames["c_row_checks.csv"].copy()
    checks.loc[checks["node"] == "node3", "lono_idle_s"] = 123.456
    after = readme.render({**frames, "c_row_checks.csv": checks}, names)
    assert "Worst error 114.86 s (node3)" in after and "Worst error 114.86 s" not in before


def test_repository_readme_paper_findings_match_the_csvs():
    """Every number of the paper findings (docs/MODELS.md), recomputed from results/paper and results/beyond-paper."""
    text = " ".join((RESULTS.parents[1] / "docs" / "MODELS.md").read_text().split())
    f = _committed_frames()
    c, st, v = f["c_row_checks.csv"], f["inferred_step_times.csv"], f["variants.csv"]
    totals = f["table3_strategies.csv"]
    var = lambda steps, dtype, payload, strategy, col: v[(v["steps"] == steps) & (v["dtype"] == dtype) & (
        v["payload_dtype"] == payload) & (v["strategy"] == strategy)][col].iloc[0]
    inf = lambda name, col: totals[(totals["source"] == "inferred") & (totals["strategy"] == name)][col].iloc[0]
    m = f["memory_b.csv"].set_index("node")
    beyond = pd.read_csv(RESULTS.parent / "beyond-paper" / "table.csv").set_index("strategy")["idle_left"] * 100
    expected = [
        f"(t_max = {c['in_sample_t_max_ms'].iloc[0]:.2f} ms)",
        f"misses by {(c['lono_idle_s'] - c['paper_C_idle_s']).abs().max():.2f} s at most",
        f"for node2 ({c['anchored_t_max_ms'].iloc[0]:.0f} ms), predicts {c['anchored_idle_s'].sum():.0f} s",
        f"{st['inferred_step_s'].min() * 1e3:.0f}-{st['inferred_step_s'].max() * 1e3:.0f} ms per step",
        f"needs {st.loc[st['node'] == 'node1', 'implied_tflops_per_gpu'].iloc[0]:.0f} TFLOPS per RTX 2080 Ti",
        f"idle by {(1 - var('catalog', 'fp16', 'fp16', 'C', 'idle_vs_baseline')) * 100:.0f}%; in bf16",
        f"C adds {(var('catalog', 'bf16', 'fp16', 'C', 'idle_vs_baseline') - 1) * 100:.0f}%",
        (f"from a {(1 - var('catalog', 'fp16', 'fp16', 'C-slowest', 'idle_vs_baseline')) * 100:.0f}% cut into a "
        f"{(var('catalog', 'bf16', 'fp16', 'C-slowest', 'idle_vs_baseline') - 1) * 100:.0f}% increase"),
        (f"{var('inferred', 'fp16', 'fp16', 'baseline', 'sync_s_per_round'):.2f} s per round with fp16 pseudo-gradients, "
        f"{var('inferred', 'fp16', 'fp16', 'baseline', 'sync_share_of_round') * 100:.0f}% of a baseline round"),
        (f"({var('inferred', 'fp16', 'fp32', 'baseline', 'sync_s_per_round'):.2f} s and "
        f"{var('inferred', 'fp16', 'fp32', 'baseline', 'sync_share_of_round') * 100:.0f}% with fp32)"),
        f"`{readme.best_strategy(totals)}` idles {inf(readme.best_strategy(totals), 'total_idle_s'):.2f} s in 10 rounds",
        f"at {inf(readme.best_strategy(totals), 'tokens_per_s') / inf('baseline', 'tokens_per_s'):.2f}× its throughput",
        f"`measured-steps` leaves **{beyond['measured-steps']:.1f}%**",
        f"`network-aware` {beyond['network-aware']:.1f}% and `hybrid` {beyond['hybrid']:.1f}%",
        f"the paper's C leaves {beyond['C']:.1f}% by this model",
        (f"takes {var('catalog', 'fp16', 'fp16', 'baseline', 'sync_s_per_round'):.2f} s with fp16 pseudo-gradients "
        f"({var('catalog', 'fp16', 'fp32', 'baseline', 'sync_s_per_round'):.2f} s with fp32)"),
        (f"batch 32 needs {m.loc['node3', 'need_gib_at_paper_B_nominal']:.1f} GiB, "
        f"{m.loc['node3', 'need_gib_at_paper_B_low']:.1f}-{m.loc['node3', 'need_gib_at_paper_B_high']:.1f}"),
        f"{OUTER_STEP_NS_PER_PARAM:.2f} ns per parameter",
        f"{OUTER_STEP_NS_PER_PARAM * 1e-9 * load_scenario('paper').model.param_count:.2f} s for 215M parameters",
    ]
    for phrase in expected:
        assert phrase in text, phrase
