"""benchmarks/bench_loss_published.py: each published comparison through the loss path, and its verdicts."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_loss_published as bench

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
