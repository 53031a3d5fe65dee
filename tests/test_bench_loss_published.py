"""benchmarks/bench_loss_published.py: each published comparison through the loss path, and its verdicts."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_loss_published as bench

from simulator.models import loss_literature as lit
from simulator.models.convergence_prior import diloco_factor
from simulator.models.loss_literature import published


def test_a_comparison_through_the_loss_path_is_the_diloco_factor():
    """At equal tokens (the run's last token) DiLoCo M = 8 over data-parallel at 35M is Table 7's factor."""
    row = next(r for r in published().itertuples() if r.params == 35e6 and r.replicas == 8)
    assert bench.predicted_delta_pct(row) == pytest.approx(100 * (float(diloco_factor(35e6, 8)) - 1), abs=1e-9)


def test_verdicts_count_signs_beyond_rounding_and_errors():
    table = pd.DataFrame({"effect": ["e"] * 3, "use": ["fit"] * 3, "published_delta_pct": [1.0, -0.5, 0.01],
                          "rounding_pct": [0.03] * 3, "predicted_delta_pct": [0.8, 0.2, -0.02]})
    table["error_pct"] = table["predicted_delta_pct"] - table["published_delta_pct"]
    v = bench.verdicts(table).set_index("effect")
    assert v.loc["all", "beyond_rounding"] == 2 and v.loc["all", "sign_share"] == 0.5
    assert v.loc["all", "median_abs_error"] == pytest.approx(0.2) and v.loc["all", "worst_abs_error"] == 0.7


def test_an_eager_overlap_row_through_the_loss_path_is_the_form():
    """Kale et al. Table 6 at 1B: streaming with a whole outer step of eager overlap against DiLoCo at the same
    M and H differs only by the overlap effect (fragments and an fp32 payload cost nothing)."""
    rows = published()
    row = next(r for r in rows.itertuples() if r.table == "Table 6" and r.effect == "overlap" and r.params == 1e9)
    assert bench.predicted_delta_pct(row) == pytest.approx(100 * float(lit.overlap_delta(1.0, 0.5, 1e9)), abs=1e-9)


def test_runs_parse_and_a_bad_one_names_the_file_and_key():
    assert bench.parse_run("diloco M=4 H=100 P=8 tau=1 alpha=0.5 dtype=fp4") == {
        "kind": "diloco", "M": 4, "H": 100, "P": 8, "tau": 1, "alpha": 0.5, "dtype": "fp4"}
    assert bench.parse_run("dp M=2")["kind"] == "dp"
    with pytest.raises(ValueError, match=r"loss_published\.csv.*'H2'"):
        bench.parse_run("diloco M=2 H2=30")
