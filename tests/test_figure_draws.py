"""idle.png and loss.png are drawn once each, without pyplot (simulator/outputs/outputs.py laid_out_png), and
their bytes are those of the figure saved after tight_layout as before (a second, unrendered draw for the
placeholder layout engine tight_layout leaves, about a third of a figure's time: issue 58's speed goal)."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simulator.outputs.outputs import figure_bytes
from simulator.outputs.run_figure import idle_figure, idle_figure_axes


def _runs(nodes: int = 2):
    if nodes > 2:  # a fleet: the bars of its edges and a box plot of every node (run_figure.SHOWN_NODES_MAX)
        names = [f"n{k}" for k in range(nodes)]
        timeline = pd.DataFrame({"node": names, "round": 0, "compute_s": np.arange(1.0, nodes + 1), "idle_s": 0.0,
                                 "comm_s": 0.5, "round_start_s": 0.0})
        return [("baseline", names, np.arange(nodes, dtype=float), timeline)]
    timeline = pd.DataFrame({"node": ["a", "b"] * 4, "round": np.repeat(range(4), 2),
                             "compute_s": [1.0, 2.0] * 4, "idle_s": [1.0, 0.0] * 4, "comm_s": [0.5] * 8,
                             "round_start_s": np.repeat(np.arange(4) * 2.5, 2)})
    return [("baseline", ["a", "b"], np.array([4.0, 0.0]), timeline),
            ("C", ["a", "b"], np.array([1.0, 0.5]), timeline)]


def test_idle_figure_is_drawn_once(monkeypatch):
    draws = []
    real = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: draws.append(1) or real(self, renderer))
    idle_figure(_runs())
    assert len(draws) == 1


def test_idle_figure_bytes_are_those_saved_after_tight_layout():
    laid_out = idle_figure_axes(_runs())  # tight_layout applied, its placeholder engine left: two draws
    assert idle_figure(_runs()) == figure_bytes(laid_out)


def test_figures_are_written_without_pyplot(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # importing it now raises ImportError
    assert idle_figure(_runs())[:4] == b"\x89PNG"
    assert idle_figure(_runs(40))[:4] == b"\x89PNG"  # the box plot reads every rcParam, the backend's too
