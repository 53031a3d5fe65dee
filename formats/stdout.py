"""A reader of stdout that goes away (`geodt simulate paper` piped into `head -3`) ends a command quietly, as it ends a
Unix tool: no traceback, exit status 141 (128 + SIGPIPE, what a shell reports for a tool that SIGPIPE ended;
130 is Ctrl-C's likewise). Python's recommended handling (its signal module's docs, "Note on SIGPIPE"):
stdout is pointed at /dev/null, so that the interpreter's flush at exit does not fail again. The commands
write their --out folder before they print, so what they write is whole.
"""
from __future__ import annotations

import os
import select
import sys

SIGPIPE_STATUS = 141  # 128 + SIGPIPE (13)


def stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no fileno (a StringIO), or no poll on this platform
        return False


def closed_stdout_status(exc: BrokenPipeError) -> int:
    """After a BrokenPipeError: where stdout's reader went away, stdout onto /dev/null and SIGPIPE_STATUS;
    else the error raised again (another pipe broke, a child process's or a socket's: a fault to report)."""
    if not stdout_gone():
        raise exc
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_STATUS
