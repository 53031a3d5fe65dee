"""Test helper: a command's spawned child processes, from /proc (Linux), and whether they
outlive it when it is killed."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def launcher_env() -> dict[str, str]:
    """This process's environment for a `python -m real` that launches its own workers: no
    torchrun variables (they would make it a worker), the repository on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_KEYS}
    return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def ctrl_c_reaches_it() -> None:
    """preexec_fn for a child a test sends SIGINT: the default disposition, so Python installs
    its KeyboardInterrupt handler even where the test itself was started with SIGINT ignored
    (a shell's `cmd &` without job control does that, and the child inherits it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name, None when the process is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[tuple[int, bytes]]:
    """`pid`'s child processes and their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        try:
            if fields and int(fields[1]) == pid:
                found.append((int(entry.name), (entry / "cmdline").read_bytes()))
        except OSError:
            continue
    return found


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing-started children of `pid` (not its resource tracker): spawned ones, and those
    its forkserver forked for it (a local run's workers, real/process/launch.py), not the server itself."""
    found = []
    for child, cmdline in _children(pid):
        if b"spawn_main" in cmdline:
            found.append(child)
        elif b"multiprocessing.forkserver" in cmdline:
            found += [worker for worker, _ in _children(child)]
    return found


def running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def cpu_s(pid: int) -> float:
    """Seconds of CPU the process has used (user + system), 0 when it is gone."""
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kill_parent_once_ready(parent: subprocess.Popen, children: int, ready, start_s: float = 120.0,
                           end_s: float = 10.0) -> list[int]:
    """Wait until `parent` has `children` spawned children and ready(their pids) holds, SIGKILL
    it, and return the children still running `end_s` later (killing them after)."""
    found: list[int] = []
    try:
        deadline = time.monotonic() + start_s
        while len(found) < children or not ready(found):
            assert time.monotonic() < deadline and parent.poll() is None, \
                f"not ready in {start_s:g} s ({len(found)} of {children} children; exit {parent.poll()})"
            time.sleep(0.2)
            found = spawned_children(parent.pid) if len(found) < children else found
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + end_s
        while any(running(c) for c in found) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [c for c in found if running(c)]
    finally:
        parent.kill()
        for c in found:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
