"""Faults injected into an `--on-node-loss continue` run at exact points, for the tests and
benchmarks/bench_faults.py: a node's process SIGKILLs itself where an outside kill could land only
by luck (while a membership epoch forms, while a restarted process joins).

GEODT_TEST_FAULTS, in the launcher's environment (the node processes inherit it), holds entries
"NODE:POINT:N[:MS]" separated by commas; node NODE's process, at POINT:
- round:N    the original process, MS ms after round N's start (it sleeps; the others are in
             their inner steps);
- epoch:N    the original process, as it enters membership epoch N (before the epoch forms);
- asked:0    the restarted process, MS ms after it asked to join (before it is admitted);
- admitted:0 the restarted process, once admitted, before it enters its epoch;
- finish:0   the original process, after its last round, before the members' final barrier;
- skew:0     not a kill: the node's final global weights are nudged, so that its digest
             differs from the others' (the launcher's check of final weights, real/process/respawn.py).
A node that is not named runs as always. The variable is read by node processes only; a run
without it is not touched.
"""
from __future__ import annotations

import os
import signal
import time

ENV = "GEODT_TEST_FAULTS"
POINTS = ("round", "epoch", "asked", "admitted", "finish", "skew")
JOINER_POINTS = ("asked", "admitted")  # the rest are the original process's


def parse(text: str) -> list[tuple[str, str, int, float]]:
    """(node, point, N, delay s) per entry; ValueError naming the entry that does not parse."""
    faults = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        fields = entry.split(":")
        if len(fields) not in (3, 4) or fields[1] not in POINTS:
            raise ValueError(f"{ENV}: expected NODE:POINT:N[:MS] with POINT one of {', '.join(POINTS)}, got {entry!r}")
        delay_ms = float(fields[3]) if len(fields) == 4 else 0.0
        faults.append((fields[0], fields[1], int(fields[2]), delay_ms / 1000))
    return faults


class Faults:
    """This process's injected faults (the module doc); none unless GEODT_TEST_FAULTS names its node."""

    def __init__(self, node: str, joining: bool, text: str | None = None):
        text = os.environ.get(ENV, "") if text is None else text
        self.points = {(point, n): delay for name, point, n, delay in parse(text)
                       if name == node and (point in JOINER_POINTS) == joining}

    def at(self, point: str, n: int = 0) -> None:
        """SIGKILL this process if a fault is injected here (after its delay)."""
        if (point, n) in self.points:
            time.sleep(self.points[point, n])
            os.kill(os.getpid(), signal.SIGKILL)

    @property
    def skew(self) -> bool:
        return ("skew", 0) in self.points
