"""A killed command takes its children with it, and leaves no temporary folder outside --out
that nothing removes (issue 59: `geodt calibrate convergence` killed with SIGKILL left its child
run and that run's 4 workers training to the end, and an 18 MB folder in $TMPDIR)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from formats.owners import remove_orphan_temps
from tests.proctree import _stat, cpu_s, launcher_env, running


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc's parent links)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def kill_once_training(cmd: list[str], workers: int, start_s: float = 240.0, end_s: float = 30.0,
                       worker_cpu_s: float = 4.0, env: dict | None = None):
    """Start `cmd`, wait until it has at least `workers` + 1 descendants (its run and the run's
    workers) and the newest `workers` have each used `worker_cpu_s` of CPU (past their imports:
    a worker still importing torch leaves only when it gets to train/children.py's check),
    SIGKILL it alone, and return (its descendants then, those still running `end_s` later)."""
    proc = subprocess.Popen(cmd, env=env or launcher_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    found: list[int] = []
    try:
        deadline = time.monotonic() + start_s
        while len([p for p in found if running(p)]) < workers + 1:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, f"no run with {workers} workers in {start_s:g} s"
            time.sleep(0.5)
            found = descendants(proc.pid)
        while min(cpu_s(p) for p in sorted(found)[-workers:]) < worker_cpu_s:
            assert proc.poll() is None and time.monotonic() < deadline, "the workers did not start training"
            time.sleep(0.5)
        found = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + end_s
        while any(running(p) for p in found) and time.monotonic() < deadline:
            time.sleep(0.2)
        return found, [p for p in found if running(p)]
    finally:
        for p in [proc.pid, *found]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


@pytest.mark.slow
def test_a_killed_convergence_calibration_takes_its_run_and_workers_and_its_folder_is_removable(tmp_path):
    out = tmp_path / "conv.csv"
    before_tmp = set(Path(tempfile.gettempdir()).glob("geodt-convergence-*"))
    cmd = [sys.executable, "-m", "geodt", "calibrate", "convergence", "hetero-cpu", "--runs", "baseline",
           "--out", str(out), "--set", "training.rounds=400", "--set", "training.local_steps=3", "--time-scale", "0.5"]
    found, left = kill_once_training(cmd, workers=4)
    assert len(found) >= 5 and left == [], f"still running after the parent's SIGKILL: {left} of {found}"
    assert set(Path(tempfile.gettempdir()).glob("geodt-convergence-*")) == before_tmp  # nothing outside --out
    temps = [p for p in tmp_path.iterdir() if p.name != "conv.csv"]
    assert [p.name.startswith(".conv.csv.geodt") and p.name.endswith(".tmp") for p in temps] == [True]
    assert remove_orphan_temps(tmp_path, only="conv.csv") == temps  # what the next calibration does first
    assert not out.exists()


@pytest.mark.slow
def test_a_killed_network_calibration_takes_its_processes_and_leaves_only_removable_folders(tmp_path):
    """Its processes already died with it; its checkpoint folder (beside --out) and rendezvous folder
    ($TMPDIR) were named so that nothing removed them (`.geodt-netcal-*`, `geodt-netcal-*`); now the
    one is geodt's temporary name, the other a launcher's rendezvous (real/process/outdir.py), both
    removed once their process is gone."""
    before_tmp = set(Path(tempfile.gettempdir()).glob("geodt-netcal-*"))
    cmd = [sys.executable, "-m", "geodt", "calibrate", "network", "--out", str(tmp_path / "net.csv"),
           "--max-mib", "256", "--repeats", "200", "--processes", "2"]
    found, left = kill_once_training(cmd, workers=2)
    assert left == [], f"still running after the parent's SIGKILL: {left} of {found}"
    assert set(Path(tempfile.gettempdir()).glob("geodt-netcal-*")) == before_tmp
    temps = list(tmp_path.iterdir())
    assert [p.name.startswith(".net.csv.geodt") and p.name.endswith(".tmp") for p in temps] == [True]
    assert remove_orphan_temps(tmp_path, only="net.csv") == temps  # what the next calibration does first
