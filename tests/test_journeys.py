"""The README's first hour: its commands, in its order, into their default directories.

Each command keeps its own outputs: after every command, every file an earlier one wrote is
still there, byte for byte (README, "A first hour"; docs/DESIGN.md, "Where outputs go"). The
simulator's commands run on the core install; calibrate, run and validate need torch and run
in a second, slower test with the tiny model, one round and few steps.
"""
from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest

from geodt.cli import main as geodt

ROOT = Path(__file__).resolve().parents[1]
NEEDS_TORCH = {"calibrate", "profile", "run", "validate"}
# What each command of the README's list writes (directory, some of its files), in the list's order.
WRITES = [
    ("out/paper/simulate", {"plan.csv", "timeline.parquet", "summary.csv", "syncs.parquet", "trace.json",
                            "scenario.toml"}),
    ("out/paper/plan-hybrid", {"plan.csv", "scenario.toml"}),
    ("out/sweep", {"sweep", "sweep.sha256", "spec.json", "scenario.toml", "idle_left.png", "winners.png",
                   "speedup.png"}),
    ("out/paper/table", {"table.csv", "table.md", "plan.csv", "summary.csv", "scenario.toml"}),
    ("profiles", {"cpu.csv"}),
    (None, set()),
    ("out/hetero-cpu/run-measured-steps", {"plan.csv", "scenario.toml", "trace.csv", "trace.json"}),
    ("out/hetero-cpu/validate-measured-steps", {"plan.csv", "scenario.toml", "timeline.csv", "trace.csv",
                                                "validation.csv", "validation.png", "trace.json"}),
    ("results/paper", {"table3_idle.csv", "README.md", "timeline.png"}),
]
# Appended to the README's commands to keep the test quick; none changes where outputs go.
SMALL = ["--set", "training.rounds=1", "--set", "training.local_steps=2", "--time-scale", "0.2", "--no-progress",
         "--threads", "1"]
QUICKER = {"sweep": ["--workers", "1"], "calibrate": ["--repeats", "2", "--warmup", "1"], "run": SMALL,
           "validate": SMALL}


def readme_first_hour() -> list[list[str]]:
    """The commands of the README's "A first hour" block, as argv lists without `geodt`."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## A first hour"):]
    block = block[block.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    return [shlex.split(line, comments=True)[1:] for line in block.strip().splitlines()]


def journey(with_torch: bool):
    commands = readme_first_hour()
    assert [argv[0] for argv in commands] == ["simulate", "plan", "sweep", "sweep", "calibrate", "profile", "run",
                                              "validate", "paper"] and len(commands) == len(WRITES)
    return [(argv + QUICKER.get(argv[0], []), where, files) for argv, (where, files) in zip(commands, WRITES)
            if with_torch or argv[0] not in NEEDS_TORCH]


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
    walk(tmp_path, journey(with_torch=False))
    printed = capsys.readouterr().out
    assert "wrote out/paper/simulate/" in printed and "wrote out/paper/plan-hybrid/" in printed
    assert "removed" not in printed  # nothing of an earlier command was in the way


@pytest.mark.slow
def test_the_whole_journey_with_torch_keeps_every_output(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()  # as in a checkout, where calibrate's README command writes
    walk(tmp_path, journey(with_torch=True))
