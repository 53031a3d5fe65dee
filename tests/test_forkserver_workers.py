"""A local run's workers are forked from a forkserver started once per launcher process
(real/process/launch.py `workers`), which outlives a run: a worker must still take the launcher's
folder, environment and output streams as they are when it starts, not as they were when the
server started (an earlier run in the same process, a test's captured stderr), and must end with
the launcher although its parent is the server."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("torch")

from real.process.launch import take_launchers_place, worker_start, workers
from real.process.outdir import remove_orphan_rendezvous
from tests.proctree import launcher_env, running
from tests.test_real_runs import plan_text, scenario_text


def _report(start, queue) -> None:
    take_launchers_place(start)
    print("worker says hello", file=sys.stderr, flush=True)
    queue.put((os.getcwd(), os.environ.get("GEODT_PROBE")))


def _started(context, queue) -> tuple[str, str | None]:
    proc = context.Process(target=_report, args=(worker_start(), queue))
    proc.start()
    said = queue.get(timeout=120)
    proc.join(30)
    assert proc.exitcode == 0
    return said


def test_a_worker_takes_the_launchers_folder_environment_and_stderr_as_they_are_when_it_starts(
        tmp_path, monkeypatch, capfd):
    context = workers()
    queue = context.Queue()
    monkeypatch.setenv("GEODT_PROBE", "first")
    first = _started(context, queue)  # the server exists from here on, with this environment and folder
    monkeypatch.setenv("GEODT_PROBE", "second")
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert _started(context, queue) == (str(tmp_path), "second") != first
    assert "worker says hello" in capfd.readouterr().err


KILLED_LAUNCHER = """
import sys, time
from real.process.launch import take_launchers_place, worker_start, workers
from real.process.outdir import remove_orphan_rendezvous

def sleep(start):
    take_launchers_place(start)
    time.sleep(600)

if __name__ == "__main__":
    proc = workers().Process(target=sleep, args=(worker_start(),))
    proc.start()
    print(proc.pid, flush=True)
    time.sleep(600)
"""


def test_a_worker_ends_with_its_launcher_though_the_server_is_its_parent(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(KILLED_LAUNCHER)
    tmp = tempfile.mkdtemp(prefix="geodt-test-", dir="/tmp")  # short: the socket's folder goes here
    launcher = subprocess.Popen([sys.executable, str(script)], env={**launcher_env(), "TMPDIR": tmp},
                                stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    try:
        assert running(worker)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(worker)
        left = os.listdir(tmp)  # the killed launcher's forkserver folder: the next launch removes it
        assert [name.startswith(f"geodt-rdzv-{launcher.pid}-") for name in left] == [True]
        remove_orphan_rendezvous(tmp)
        assert os.listdir(tmp) == []
    finally:
        launcher.kill()
        if running(worker):
            os.kill(worker, 9)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_run_that_ends_with_os_exit_leaves_nothing_in_tmpdir(tmp_path):
    """`python -m real` leaves without Python's teardown, which is what removes multiprocessing's
    folder (the forkserver's socket): every run left a pymp-* folder in $TMPDIR. (torch's compile
    cache, torchinductor_<user>, stays there by design: later runs reuse it.)"""
    (tmp_path / "plan.csv").write_text(plan_text([("a", 2, 2), ("b", 2, 2)]))
    (tmp_path / "scenario.toml").write_text(scenario_text(rounds=1))
    tmp = tempfile.mkdtemp(prefix="geodt-test-", dir="/tmp")  # short: the socket's folder goes here
    try:
        done = subprocess.run([sys.executable, "-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario",
                               str(tmp_path / "scenario.toml"), "--out", str(tmp_path / "out"), "--threads", "1",
                               "--no-progress"], env={**launcher_env(), "TMPDIR": tmp}, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert [name for name in os.listdir(tmp) if name.startswith(("pymp-", "geodt-"))] == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
