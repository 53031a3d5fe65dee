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
    """Plain records: per node, one (start, done, released, end) tuple of clock times per round.

    Each node appends to its own list in round order, so no index or sort is needed; the
    arrays are built once, at the end.
    """

    FIELDS = ("round_start_s", "done_s", "released_s", "round_end_s")

    def __init__(self, nodes: int) -> None:
        self.per_node: list[list[tuple]] = [[] for _ in range(nodes)]

    def arrays(self) -> dict[str, np.ndarray]:
        """Columns as rounds × nodes arrays."""
        table = np.array(self.per_node, dtype=float)  # nodes × rounds × fields
        return {name: table[:, :, k].T for k, name in enumerate(self.FIELDS)}


def node_process(env, compute_s: np.ndarray, comm_s: float, barrier: Barrier, record, ckpt_s: float = 0.0):
    timeout, wait = env.timeout, barrier.wait
    for busy_s in compute_s.tolist():
        start = env.now
        yield timeout(busy_s)
        done = env.now
        yield wait()
        released = env.now
        yield timeout(comm_s)
        record((start, done, released, env.now))
        if ckpt_s:  # the checkpoint after each sync, before the next round starts
            yield timeout(ckpt_s)


def run_simpy(compute: np.ndarray, comm_s: float, ckpt_s: float = 0.0) -> dict[str, np.ndarray]:
    """Simulate rounds × nodes; arrays (rounds × nodes) of the timeline columns."""
    env = simpy.Environment()
    rounds, n = compute.shape
    barrier, recorder = Barrier(env, n), Recorder(n)
    for i in range(n):
        env.process(node_process(env, compute[:, i], comm_s, barrier, recorder.per_node[i].append, ckpt_s))
    env.run()
    rec = recorder.arrays()
    return {"compute_s": rec["done_s"] - rec["round_start_s"], "idle_s": rec["released_s"] - rec["done_s"],
            "comm_s": rec["round_end_s"] - rec["released_s"], "round_start_s": rec["round_start_s"],
            "round_end_s": rec["round_end_s"]}
