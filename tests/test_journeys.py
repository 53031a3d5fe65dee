"""The README's first hour: its commands, in its order, into their default directories.

Each command keeps its own outputs: after every command, every file an earlier one wrote is
still there, byte for byte (README, "A first hour"; docs/DESIGN.md, "Where outputs go"). The
simulator's commands run on the core install; calibrate, run and validate need torch and run
in a second, slower test with the tiny model, one round and few steps.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from geodt.cli import main as geodt

SIMULATOR_JOURNEY = [
    (["simulate", "paper"], "out/paper/simulate", {"plan.csv", "timeline.csv", "summary.csv", "trace.json",
                                                    "scenario.toml"}),
    (["plan", "paper", "--strategy", "hybrid"], "out/paper/plan-hybrid", {"plan.csv", "scenario.toml"}),
    (["sweep", "--gpu-types", "a30,v100,t4", "--samples", "30", "--workers", "1", "--out", "out/sweep"], "out/sweep",
     {"sweep.csv", "sweep.csv.sha256", "spec.json", "scenario.toml", "idle_left.png", "winners.png", "speedup.png"}),
    (["sweep", "--table", "paper"], "out/paper/table", {"table.csv", "table.md", "plan.csv", "summary.csv",
                                                       "scenario.toml"}),
]
SMALL = ["--set", "training.rounds=1", "--set", "training.local_steps=2", "--time-scale", "0.2", "--no-progress",
         "--threads", "1"]
TORCH_JOURNEY = [
    (["calibrate", "--device", "cpu", "--model", "tiny", "--seq-len", "64", "--batch", "1,2", "--repeats", "2",
      "--warmup", "1", "--out", "profiles/cpu.csv"], "profiles", {"cpu.csv"}),
    (["profile", "check", "profiles/cpu.csv"], None, set()),
    (["run", "hetero-cpu", "--strategy", "measured-steps", "--emulate", *SMALL], "out/hetero-cpu/run-measured-steps",
     {"plan.csv", "scenario.toml", "trace.csv", "trace.json"}),
    (["validate", "hetero-cpu", "--strategy", "measured-steps", "--emulate", *SMALL],
     "out/hetero-cpu/validate-measured-steps",
     {"plan.csv", "scenario.toml", "timeline.csv", "trace.csv", "validation.csv", "validation.png", "trace.json"}),
]
PAPER = (["paper"], "results/paper", {"table3_idle.csv", "README.md", "timeline.png"})


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def walk(root: Path, journey) -> None:
    """Run each command; it writes its files where the README says, and removes or changes no earlier file."""
    before: dict[str, str] = {}
    for argv, where, expected in journey:
        assert geodt(argv) == 0, argv
        after = snapshot(root)
        lost = {path for path in before if path not in after}
        changed = {path for path in before if path in after and after[path] != before[path]}
        assert not lost and not changed, (argv, lost, changed)
        if where is not None:
            assert expected <= {p.name for p in (root / where).iterdir()}, (argv, where)
        before = after


def test_the_simulator_journey_keeps_every_output(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    walk(tmp_path, [*SIMULATOR_JOURNEY, PAPER])
    printed = capsys.readouterr().out
    assert "wrote out/paper/simulate/" in printed and "wrote out/paper/plan-hybrid/" in printed
    assert "removed" not in printed  # nothing of an earlier command was in the way


@pytest.mark.slow
def test_the_whole_journey_with_torch_keeps_every_output(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()  # as in a checkout, where calibrate's README command writes
    walk(tmp_path, [*SIMULATOR_JOURNEY, *TORCH_JOURNEY, PAPER])
