"""benchmarks/bench_fidelity.py's calibration right before each run: what it asks `geodt calibrate
scenario` for (the runs of results/predict-the-run/ differ only in it), without running it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_fidelity


@pytest.mark.parametrize("passes", [1, 3])
def test_each_run_is_calibrated_with_the_passes_asked_for(passes, tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(bench_fidelity, "_run", lambda cmd, **_: commands.append(cmd))
    path = bench_fidelity.fresh_profiles("three-node", tmp_path, passes)
    (cmd,) = commands
    assert cmd[1:5] == ["-m", "geodt", "calibrate", "scenario"]
    assert cmd[cmd.index("--passes") + 1] == str(passes)
    # the scenario's own batch (4) measured last, closest to the run
    assert cmd[cmd.index("--batch") + 1] == "64,32,16,8,2,1,4"
    # the scenario the run uses reads the profiles this calibration writes
    assert f"{tmp_path / 'profiles'}/" in path.read_text()
