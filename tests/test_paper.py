"""`geodt paper`: the paper's Table 2 reproduced, the inference of step times, the fits, determinism."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from geodt.paper import facts, main
from geodt.paper.infer import c_idle_s, infer, inferred_scenario
from geodt.paper.related import fit_batch_time, share_curves
from geodt.paper.tables import best_geodt_strategy, predict, table2, table3
from simulator.scenario import load_scenario


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
