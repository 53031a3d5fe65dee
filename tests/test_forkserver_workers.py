"""A local run's workers are forked from a forkserver started once per launcher process
(real/process/launch.py `workers`), which outlives a run: a worker must still take the launcher's
folder, environment and output streams as they are when it starts, not as they were when the
server started (an earlier run in the same process, a test's captured stderr), and must end with
the launcher although its parent is the server."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from real.process.launch import take_launchers_place, worker_start, workers
from tests.proctree import launcher_env, running


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
    launcher = subprocess.Popen([sys.executable, str(script)], env=launcher_env(), stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    try:
        assert running(worker)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(worker)
    finally:
        launcher.kill()
        if running(worker):
            os.kill(worker, 9)
