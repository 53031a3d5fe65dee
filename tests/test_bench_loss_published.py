"""benchmarks/bench_loss_published.py: each published comparison through the loss path, and its verdicts."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_loss_published as bench

from simulator.models import loss_literature as lit
from simulator.models.convergence_prior import diloco_factor
from simulator.models.loss_literature import published


def test_a_comparison_through_the_loss_path_is_the_diloco_factor():
    """At equal tokens (the run's last token, 20N: no overtraining) DiLoCo M = 4 over data-parallel at 35M is
    Table 7's factor."""
    row = next(r for r in published().itertuples() if r.params == 35e6 and r.replicas == 4 and r.table == "Table 4")
    assert bench.predicted_delta_pct(row) == pytest.approx(100 * (float(diloco_factor(35e6, 4)) - 1), abs=1e-9)


def test_verdicts_count_signs_beyond_rounding_and_the_papers_noise_and_errors():
    table = pd.DataFrame({"effect": ["e"] * 4, "use": ["fit"] * 4, "published_delta_pct": [1.0, -0.5, 0.01, -0.15],
                          "rounding_pct": [0.03] * 4, "noise_pct": [np.nan, np.nan, np.nan, 0.2],
                          "predicted_delta_pct": [0.8, 0.2, -0.02, 0.0]})
    table["error_pct"] = table["predicted_delta_pct"] - table["published_delta_pct"]
    v = bench.verdicts(table).set_index("effect")
    # the last row exceeds its rounding but not its paper's stated noise: its sign is not counted
    assert v.loc["all", "beyond_noise"] == 2 and v.loc["all", "sign_share"] == 0.5
    assert v.loc["all", "median_abs_error"] == pytest.approx(0.175) and v.loc["all", "worst_abs_error"] == 0.7


def test_an_eager_overlap_row_through_the_loss_path_is_the_form():
    """Kale et al. Table 6 at 1B: streaming with a whole outer step of eager overlap against DiLoCo at the same
    M and H differs only by the overlap effect (fragments and an fp32 payload cost nothing)."""
    rows = published()
    row = next(r for r in rows.itertuples() if r.table == "Table 6" and r.effect == "overlap" and r.params == 1e9)
    # at 25 tokens per parameter the overlap's cost (measured at 20N) is scaled by the curve's slope
    expected = 100 * float(lit.overlap_delta(1.0, 0.5, 1e9)) * lit.overtraining_scale(1e9, 25e9)
    # (whole rounds train within 0.01% of the row's 25B tokens, so the scale differs by less than 1e-3 points)
    assert bench.predicted_delta_pct(row) == pytest.approx(expected, abs=1e-3)
    assert expected < 100 * float(lit.overlap_delta(1.0, 0.5, 1e9)) - 0.05


def test_runs_parse_and_a_bad_one_names_the_file_and_key():
    assert bench.parse_run("diloco M=4 H=100 P=8 tau=1 alpha=0.5 dtype=fp4") == {
        "kind": "diloco", "M": 4, "H": 100, "P": 8, "tau": 1, "alpha": 0.5, "dtype": "fp4"}
    assert bench.parse_run("dp M=2")["kind"] == "dp"
    with pytest.raises(ValueError, match=r"loss_published\.csv.*'H2'"):
        bench.parse_run("diloco M=2 H2=30")


def test_liu_et_al_rows_carry_the_papers_noise_and_the_strict_reading_counts_beyond_footnote_5():
    """Liu et al. (arXiv 2401.09135v2) state their noise: Table 4's no-significant-difference spread (0.20%, 60M)
    as noise_pct on their rows, footnote 5's numerical error (41.27 against 41.35 perplexity) as the strict figure."""
    rows = published()
    liu = rows[rows["arxiv"] == "2401.09135v2"]
    assert len(liu) == 8 and set(liu["sync_steps"]) == {50}
    assert liu["noise_pct"].to_numpy() == pytest.approx([100 * (np.log(24.69) / np.log(24.53) - 1)] * 8, abs=1e-3)
    assert rows[rows["arxiv"] != "2401.09135v2"]["noise_pct"].isna().all()
    assert bench.LIU_FOOTNOTE5_PCT == pytest.approx(-liu.iloc[0]["published_delta_pct"], abs=1e-3)
    table = liu.assign(predicted_delta_pct=0.0, error_pct=-liu["published_delta_pct"])
    assert bench.verdicts(table).set_index("effect").loc["all", "beyond_noise"] == 0
    share, counted = bench.strict_sign(table)
    assert counted == 5 and share == 0.0  # moderate, very, 8 and 16 workers, 150M: beyond 0.052%, predicted 0


def test_the_shrink_check_lists_each_comparison_printed_at_25_100_250():
    rows = published()
    table = rows.assign(predicted_delta_pct=rows["published_delta_pct"] / 2)
    lines = bench.shrink_check(table)
    assert len(lines) == 4  # Streaming DiLoCo Table 7's three comparisons, Kale et al. Table 1's eager
    m4 = next(line for line in lines if "Streaming FP4 M=4 against Streaming FP4 M=2" in line)
    assert "+2.63 / +0.82" in m4 and "+1.32 / +0.41" in m4 and m4.endswith("| 0.31 | 0.31 |")
