"""The SimPy engine: one process per node, a barrier made of SimPy events, then the outer sync.

Each node process runs its inner steps (one timeout per round, of the round's compute time),
arrives at the barrier, waits for the round's release event, then spends the sync time. The
last node to arrive releases everyone. A recorder appends plain tuples; the timeline
DataFrame is built once at the end.
"""
from __future__ import annotations

import numpy as np
import simpy


class Barrier:
    """Releases all `parties` waiting processes when the last one arrives; reusable per round."""

    def __init__(self, env: simpy.Environment, parties: int):
        self.env, self.parties = env, parties
        self._arrived = 0
        self._release = env.event()

    def wait(self) -> simpy.Event:
        release = self._release
        self._arrived += 1
        if self._arrived == self.parties:
            self._arrived = 0
            self._release = self.env.event()
            release.succeed()
        return release


class Recorder:
    """Plain records (node, round, compute_s, idle_s, comm_s, round_start_s, round_end_s)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def record(self, *row) -> None:
        self.rows.append(row)


def node_process(env, index: int, compute_s: np.ndarray, comm_s: float, barrier: Barrier, recorder: Recorder):
    for r, busy_s in enumerate(compute_s.tolist()):
        start = env.now
        yield env.timeout(busy_s)
        done = env.now
        yield barrier.wait()
        released = env.now
        yield env.timeout(comm_s)
        recorder.record(index, r, busy_s, released - done, comm_s, start, env.now)


def run_simpy(compute: np.ndarray, comm_s: float) -> list[tuple]:
    """Simulate rounds × nodes; returns the recorder's rows."""
    env = simpy.Environment()
    rounds, n = compute.shape
    barrier, recorder = Barrier(env, n), Recorder()
    for i in range(n):
        env.process(node_process(env, i, compute[:, i], comm_s, barrier, recorder))
    env.run()
    return recorder.rows
