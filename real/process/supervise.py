"""The local launcher watching its workers: how a run ends when one of them does not finish.

A worker's exit status says what happened (real/process/process.py): 0 done, 1 it lost contact with
its peers (a collective timed out after --timeout-s, or a peer's socket closed), 2 bad input and
3 a failure it has named (a full disk), both already said in one line; a negative status is
a signal, named as such (SIGKILL may be the out-of-memory killer, a user, or a scheduler: the
launcher does not guess).

A hung peer (stopped by SIGSTOP, spinning, or unreachable) does not exit: its peers time out
in their collectives after --timeout-s and exit with 1. The launcher then gives the others
`grace_s` to exit on their own (less when all those left are stopped: they cannot); the
processes still running after that are the ones that stopped answering: they are named (with their
state from /proc: stopped, running, sleeping), killed (SIGKILL, which also ends a stopped process),
and the run ends within --timeout-s plus the grace. This is the launcher watching its children
rather than heartbeats through the store: it needs no extra traffic, and a spinning process, whose
threads would go on beating, is caught the same way. (Under torchrun the elastic agent watches the
processes instead.)

SIGTERM to the launcher ends the run as Ctrl-C does: the workers (which ignore SIGINT and
SIGTERM: the launcher alone decides) are killed, one line is printed, and the status is 143
(130 for Ctrl-C).
"""
from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import sys
import time

INTERRUPTED = "real: interrupted; outputs of completed rounds are in the checkpoints (--resume continues)"
SIGNALLED = 128  # exit status of a run ended by signal N: 128 + N


class Terminated(KeyboardInterrupt):
    """SIGTERM to the launcher: handled as Ctrl-C."""


def on_sigterm(signum, frame) -> None:
    raise Terminated()


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def process_state(pid: int) -> str:
    """What /proc says the process is doing: stopped, running, sleeping, ... ("gone" when it is not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            code = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return {"T": "stopped (SIGSTOP or SIGTSTP)", "t": "stopped by a debugger", "R": "running",
            "S": "sleeping", "D": "in uninterruptible I/O", "Z": "exited"}.get(code, f"in state {code}")


def supervise(context, plan, grace_s: float, timeout_s: float, settle_on_death: bool = False) -> int:
    """Wait for every worker; the run's exit status (module docstring), with one line when a
    worker failed and had not said why itself. settle_on_death: after a worker died of a
    signal, the others get grace_s to stop on their own (on the shaped WAN they name whom they
    lost, real/wan/wan.py) before they are killed."""
    procs = context.processes
    while True:
        running = {p.sentinel: i for i, p in enumerate(procs) if p.exitcode is None}
        if not running:
            return 0
        for sentinel in multiprocessing.connection.wait(list(running)):
            procs[running[sentinel]].join()
        failed = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed:
            return _failure(context, plan, failed[0], grace_s, timeout_s, settle_on_death)


def _node(plan, index: int) -> str:
    return plan.nodes[plan.node_of_rank(index)].node


def _failure(context, plan, first: int, grace_s: float, timeout_s: float, settle_on_death: bool) -> int:
    procs = context.processes
    code = procs[first].exitcode
    if code == 130:
        stop(procs)
        print(INTERRUPTED, file=sys.stderr)
        return 130
    if code < 0:
        if settle_on_death:
            _settle(procs, grace_s)
        stop(procs)
        print(f"real: node {_node(plan, first)} (rank {first}) was killed by {signal_name(-code)}; the other "
              f"processes were stopped", file=sys.stderr)
        return 1
    raised = _raised(context, first)
    if raised is not None:
        stop(procs)
        print(f"real: node {_node(plan, first)} failed: {raised}", file=sys.stderr)
        return 1
    if code in (2, 3):  # the worker has said why in one line
        stop(procs)
        return 2 if code == 2 else 1
    if code == 1:
        return _lost(procs, plan, first, grace_s, timeout_s)
    stop(procs)
    print(f"real: node {_node(plan, first)} (rank {first}) exited with status {code}; the other processes were "
          f"stopped", file=sys.stderr)
    return 1


def _lost(procs, plan, first: int, grace_s: float, timeout_s: float) -> int:
    """A worker lost contact: those still running after `grace_s` stopped answering; name them."""
    _settle(procs, grace_s, until_stopped=True)
    hung = [i for i, p in enumerate(procs) if p.exitcode is None]
    states = {i: process_state(procs[i].pid) for i in hung}
    stop(procs)
    killed = [i for i, p in enumerate(procs) if p.exitcode is not None and p.exitcode < 0 and i not in hung]
    if hung:
        who = ", ".join(f"node {_node(plan, i)} (rank {i}, {states[i]})" for i in hung)
        print(f"real: {who} stopped answering: its peers waited --timeout-s {timeout_s:g} s for it and gave up; "
              f"it was stopped", file=sys.stderr)
    elif killed:
        i = killed[0]
        print(f"real: node {_node(plan, i)} (rank {i}) was killed by {signal_name(-procs[i].exitcode)}; the other "
              f"processes were stopped", file=sys.stderr)
    return 1


def _settle(procs, grace_s: float, until_stopped: bool = False) -> None:
    """Wait up to grace_s for every process to exit on its own (until_stopped: no longer than
    until every one left is stopped, SIGSTOP: those cannot exit)."""
    deadline = time.monotonic() + grace_s
    while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
        left = [p for p in procs if p.exitcode is None]
        if until_stopped and all(process_state(p.pid).startswith("stopped") for p in left):
            return
        for sentinel in multiprocessing.connection.wait([p.sentinel for p in left],
                                                        timeout=min(0.2, max(0.0, deadline - time.monotonic()))):
            next(p for p in procs if p.sentinel == sentinel).join()


def _raised(context, index: int) -> str | None:
    """The last line of the exception a worker raised (torch's spawn wrapper writes it), or None."""
    path = context.error_files[index]
    if not os.access(path, os.R_OK):
        return None
    try:
        with open(path, "rb") as handle:
            text = pickle.load(handle)  # written by torch.multiprocessing's own wrapper in our child
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    return str(text).strip().splitlines()[-1] if str(text).strip() else None


def stop(processes) -> None:
    """Kill the processes still running (they ignore SIGINT and SIGTERM; SIGKILL ends a stopped one
    too) and wait for each."""
    for proc in processes:
        if proc.exitcode is None:
            try:
                proc.kill()
            except (OSError, ValueError):
                pass
    for proc in processes:
        proc.join(timeout=10)
