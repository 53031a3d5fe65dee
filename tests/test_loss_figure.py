"""loss.png's axes (issue 58): the loss from the lowest point shown up to ln(vocabulary) at most
(the untrained model's first rounds at 35-40 nats/token flattened every curve), and time up to
the runs the strategies share (sync-ddp's run, ~15x the others', squeezed them), said on the figure."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd

from simulator.outputs.loss_figure import loss_figure_axes, loss_limits


def _pred(end_s, loss) -> dict:
    return {"curve": pd.DataFrame({"end_s": np.asarray(end_s, float), "loss": np.asarray(loss, float)}),
            "time_to_target_s": float("inf")}


LOSSES = {"baseline": _pred([50, 100, 150, 200], [35.0, 9.0, 7.0, 6.0]),
          "streaming": _pred([40, 80, 120, 160], [12.0, 8.5, 6.5, 5.5]),
          "sync-ddp": _pred(np.linspace(5, 3000, 600), np.linspace(40.0, 5.0, 600))}
VOCAB = 32_000


def test_the_loss_axis_stops_at_ln_vocab_and_starts_at_the_lowest_point_shown():
    (bottom, top), right = loss_limits(LOSSES, floor=2.5, target=None, ceiling=float("inf"), vocab_size=VOCAB)
    cap = math.log(VOCAB)  # 10.37
    assert right == 200.0  # sync-ddp (3,000 s) beyond 3x the median end (200 s): cut at the longest other
    shown_low = 40.0 - 35.0 * (200 - 5) / (3000 - 5)  # sync-ddp's lowest point within 200 s, above 5.5
    assert shown_low > 5.5
    sync = np.linspace(40.0, 5.0, 600)
    first_below = float(sync[sync <= cap][0])  # the highest first point below ln V (baseline's is 9.0)
    assert 10.3 < first_below <= cap
    pad = 0.04 * (first_below - 5.5)
    assert (bottom, top) == (5.5 - pad, first_below + pad)


def test_curves_that_all_start_below_ln_vocab_set_the_top_and_a_lower_target_the_bottom():
    low = {"a": _pred([10, 20], [7.0, 6.0]), "b": _pred([10, 21], [8.0, 6.5])}
    (bottom, top), right = loss_limits(low, floor=2.5, target=4.0, ceiling=float("inf"), vocab_size=VOCAB)
    assert right is None  # runs that end alike are shown whole
    assert (bottom, top) == (4.0 - 0.16, 8.0 + 0.16)


def test_the_figure_applies_the_limits_and_names_what_it_cuts():
    setup = SimpleNamespace(target=None, floor=2.5, model=SimpleNamespace(curve=SimpleNamespace(
        ceiling=float("inf"), source="test curve")))
    ax = loss_figure_axes(LOSSES, setup, VOCAB).axes[0]
    assert ax.get_ylim()[1] < math.log(VOCAB) * 1.05 and ax.get_ylim()[0] > 5.0
    assert ax.get_xlim() == (0.0, 200.0)
    assert "ln 32,000 = 10.37" in ax.get_title() and "cut: sync-ddp to 3,000 s" in ax.get_title()
