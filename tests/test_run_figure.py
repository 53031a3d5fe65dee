"""idle.png of `geodt simulate` and `geodt plan` (issue 42): written whole beside the other outputs,
a PNG, named in the command's listing of what it wrote, and an owned output (removed as stale)."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd

from simulator.cli import plan_main, simulate_main
from simulator.outputs.outputs import OWNED
from simulator.outputs.run_figure import idle_figure

SMALL = ["hetero-cpu", "--set", "training.rounds=3"]


def _wrote(printed: str) -> list[str]:
    line = next(line for line in printed.splitlines() if line.startswith("wrote "))
    return line.split(": ", 1)[1].split(" (removed")[0].split(", ")


def test_simulate_writes_idle_png_and_lists_it(tmp_path, capsys):
    out = tmp_path / "o"
    assert simulate_main([*SMALL, "--strategy", "baseline", "C", "--out", str(out)]) == 0
    written = _wrote(capsys.readouterr().out)
    assert "idle.png" in written and sorted(written) == sorted(p.name for p in out.iterdir())
    assert (out / "idle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_writes_idle_png_for_its_plan(tmp_path, capsys):
    out = tmp_path / "p"
    assert plan_main([*SMALL, "--strategy", "C", "--out", str(out)]) == 0
    written = _wrote(capsys.readouterr().out)
    assert sorted(written) == ["idle.png", "plan.csv", "scenario.toml"] == sorted(p.name for p in out.iterdir())
    assert (out / "idle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "idle.png" in OWNED


def test_idle_figure_draws_the_given_numbers():
    """A readable PNG, and the same inputs give the same bytes (no timestamp)."""
    import matplotlib

    matplotlib.use("Agg")
    timeline = pd.DataFrame({"node": ["a", "b"] * 4, "round": np.repeat(range(4), 2),
                             "compute_s": [1.0, 2.0] * 4, "idle_s": [1.0, 0.0] * 4, "comm_s": [0.5] * 8,
                             "round_start_s": np.repeat(np.arange(4) * 2.5, 2)})
    runs = [("baseline", ["a", "b"], np.array([4.0, 0.0]), timeline),
            ("C", ["a", "b"], np.array([1.0, 0.5]), timeline)]
    first = idle_figure(runs)
    assert first == idle_figure(runs) and first[:4] == b"\x89PNG"
    import matplotlib.image as mpimg

    assert mpimg.imread(io.BytesIO(first)).shape[2] in (3, 4)
