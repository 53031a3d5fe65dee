"""A signed error of a predicted 0 (issue 58): a quorum validate printed `+nan%`; now a reason, and a
figure's label a dash."""
from __future__ import annotations

import pandas as pd

from geodt.validation import _pct_label, _pct_text, staleness_line


def _table(predicted: float, measured: float) -> pd.DataFrame:
    return pd.DataFrame({"node": ["a", "b"], "predicted_staleness_mean": [0.0, 0.0],
                         "measured_staleness_mean": [0.5, 0.25], "predicted_run_staleness_mean": predicted,
                         "measured_run_staleness_mean": measured, "predicted_run_staleness_p90": 0.0,
                         "measured_run_staleness_p90": 1.0})


def test_a_predicted_zero_staleness_prints_a_reason_not_nan():
    line = staleness_line(_table(0.0, 0.375))
    assert "nan" not in line
    assert line.endswith("the run 0.00/0.38 (no % of a predicted 0), p90 0.0/1.0")
    assert staleness_line(_table(0.5, 0.375)).endswith("the run 0.50/0.38 (-25.0%), p90 0.0/1.0")


def test_error_texts_and_labels():
    assert _pct_text(1.0, 4.0) == "+25.0%" and _pct_text(1.0, 0.0) == "no % of a predicted 0"
    assert _pct_label(float("nan")) == "–" and _pct_label(-2.5) == "-2.5%"
