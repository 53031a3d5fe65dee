"""winners.png and speedup.png (issue 58): a winner that does other work carries the findings' *,
and the log axis of speedup.png is labelled between its powers of ten."""
from __future__ import annotations

import pandas as pd
import pytest

from simulator.sweep import sweep_figures
from simulator.sweep.sweep_cli import main as sweep


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    """Three nodes of a30 and t4 at 0.1 and 10 Gbit/s: A and network-aware do other work in some
    scenarios (network-aware wins at 0.1 Gbit/s), hybrid and streaming do not."""
    out = tmp_path_factory.mktemp("sweep") / "a"
    assert sweep(["--nodes", "3", "--gpus-per-node", "2", "--gpu-types", "a30,t4", "--bandwidth-gbps", "0.1,10",
                  "--samples", "8", "--workers", "1", "--no-figures", "--strategy", "baseline", "A", "hybrid",
                  "network-aware", "streaming", "--out", str(out)]) == 0
    return pd.read_parquet(out / "sweep")


def _figure(monkeypatch, draw, frame, tmp_path):
    figures = []
    monkeypatch.setattr(sweep_figures, "_save", lambda fig, path: figures.append(fig) or path)
    draw(frame, tmp_path / "x.png")
    figures[0].canvas.draw()
    return figures[0]


def test_winners_marks_a_winner_that_does_other_work(frame, monkeypatch, tmp_path):
    other = ~frame.groupby("strategy", observed=True)["comparable"].all()
    fig = _figure(monkeypatch, sweep_figures.winners_figure, frame, tmp_path)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() if t.get_text()]
    assert labels, "no strategy row labelled"
    for label in labels:
        name = label.rstrip("*")
        assert label.endswith("*") == bool(other[name]), label
    assert any(label.endswith("*") for label in labels)  # the case issue 58 found: network-aware wins
    assert "*: other work" in fig._suptitle.get_text()


def test_speedup_labels_its_log_axis_between_the_powers_of_ten(frame, monkeypatch, tmp_path):
    fig = _figure(monkeypatch, sweep_figures.speedup_figure, frame, tmp_path)
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    minor = [t.get_text() for t in ax.get_yticklabels(minor=True) if low <= t.get_position()[1] <= high]
    major = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
    assert "1" in major and not any("10^" in t or "$" in t for t in major + minor)
    assert {"2", "0.5"} & set(minor) and len(minor) >= 2, (low, high, minor)
