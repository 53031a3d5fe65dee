"""Spawned processes that end with the process that started them (Linux).

`geodt calibrate scenario --scenario` keeps every device stepping until the last one is done and waits
at barriers without a timeout, `geodt calibrate network` waits in collectives, and a local
run's workers (real/process/launch.py) ignore SIGINT so that the launcher alone handles Ctrl-C. torch's
start_processes asks the kernel for SIGINT to each child when its parent goes, but a command
started with SIGINT ignored (a background job of a script, nohup) hands that on to its
children, and they then ignore it: killed (SIGKILL, or SIGTERM, which Python does not turn into
an exception), the parent left them running, the device processes spinning for good, the
workers training until their collectives timed out. Each of them calls
`die_with_parent(parent_pid)` first: the kernel then sends it SIGKILL when its parent goes
(prctl PR_SET_PDEATHSIG), and it exits at once if the parent is already gone. A local run's
workers are forked by a forkserver, their parent, so they call `die_with(launcher_pid)`: the
same end, watched through a pidfd of the launcher. A CPU cgroup or
network namespace left behind that way is removed the next time one is made
(train/cpulimit.py, real/wan/wan.py). Elsewhere than Linux this does nothing. Standard library
only.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have this process killed when `parent_pid` (the process that spawned it) exits."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    if os.getppid() != parent_pid:  # it went before the request was made
        os._exit(1)


def die_with(pid: int) -> None:
    """Have this process killed when process `pid` exits, whether or not it is this one's parent: a
    forkserver's child (real/process/launch.py) has the server for its parent, and the server outlives
    a killed launcher while its children hold its pipe. A daemon thread waits on a pidfd of `pid`
    (Linux 5.3+; readable once `pid` has exited, reaped or not); `pid` already gone: exit at once."""
    if not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-launcher", daemon=True).start()


def leave(status: int, queue=None) -> None:
    """End this spawned process now, without the interpreter's teardown: there gloo's and
    TCPStore's threads can still be joinable and abort the process ("terminate called without an
    active exception", SIGABRT) after its work was done and sent (a `geodt calibrate network`
    child in CI, 2026-11-30). A multiprocessing queue's feeder thread is flushed first."""
    if queue is not None:
        queue.close()
        queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
