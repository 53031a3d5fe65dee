"""The SimPy engine: one process per node, a barrier made of SimPy events, then the outer sync.

Each node process runs its inner steps (one timeout per round, of the round's compute time),
arrives at the barrier, waits for the round's release event, then spends the sync time. The
last node to arrive releases everyone. The barrier records its release times; the timeline is
made from them (run_simpy's docstring) once at the end, or, given `emit`, every `chunk_rounds`
rounds as the run goes (rounds every node has finished are handed on and dropped: memory
bounded by chunk × nodes, not the run). The fragment-sync engine's recorder appends plain
floats per node and sync, handed on the same way.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

import numpy as np
import simpy

from simulator.engines.engine_analytic import per_round


@contextmanager
def collector_paused():
    """The cyclic garbage collector off while the events run. SimPy makes an event per timeout;
    the collector's passes over millions of young objects that reference counting frees anyway
    cost about 40% of the loop (py-spy, 4096 nodes; issue 32), and an event's cycle with its
    process is cut when it is processed (its callbacks dropped), so garbage does not pile up
    meanwhile (1024 x 200: 129 MB peak either way). Back on, as it was, after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Barrier:
    """Releases all `parties` waiting processes when the last one arrives; reusable per round."""

    def __init__(self, env: simpy.Environment, parties: int, on_release=None):
        self.env, self.parties = env, parties
        self._arrived = 0
        self._release = env.event()
        self.releases = 0  # rounds released so far
        self.on_release = on_release  # called with the round released, before anyone moves on

    def wait(self) -> simpy.Event:
        release = self._release
        self._arrived += 1
        if self._arrived == self.parties:
            self._arrived = 0
            self._release = self.env.event()
            if self.on_release is not None:
                self.on_release(self.releases)
            self.releases += 1
            release.succeed()
        return release


class Recorder:
    """Plain records: per node, its (begin, sync point, merge point, resume) clock times of every
    fragment sync, one flat list of floats in order (no index or sort needed)."""

    def __init__(self, nodes: int) -> None:
        self.per_node: list[list[float]] = [[] for _ in range(nodes)]


def node_process(env, compute_s: np.ndarray, comm_s: float, barrier: Barrier, ckpt_s: list):
    timeout, wait = env.timeout, barrier.wait
    for busy_s, after_s in zip(compute_s.tolist(), ckpt_s):
        yield timeout(busy_s)
        yield wait()
        yield timeout(comm_s)
        if after_s:  # the round's checkpoint, after its sync, before the next round starts
            yield timeout(after_s)


def run_simpy(compute: np.ndarray, comm_s, ckpt_s=0.0, emit=None,
              chunk_rounds: int = 0) -> dict[str, np.ndarray] | None:
    """Simulate rounds × nodes; arrays (rounds × nodes) of the timeline columns. comm_s: one
    number, or one per node (each node's own sync time; it starts its next round when it ends).
    ckpt_s: the checkpoint after a round's sync, one number or one per round.
    emit(arrays, first_round): called with every chunk_rounds rounds as they finish (the last
    chunk shorter); then nothing is returned.

    What is recorded is the one time the events decide, each round's barrier release (the same
    for every node). A node's other times are the sums SimPy's clock made on the way, and are
    made again from it (_replay): a timeout of d from t fires at exactly t + d."""
    env = simpy.Environment()
    rounds, n = compute.shape
    comm = np.broadcast_to(np.asarray(comm_s, dtype=float), (n,))
    ckpt = per_round(ckpt_s, rounds)
    released: list[float] = []  # per round, the barrier's release time
    state = {"flushed": 0, "start": np.zeros(n), "out": []}

    def flush(upto: int) -> None:  # rounds < upto have ended on every node
        first = state["flushed"]
        if upto > first:
            arrays = _replay(compute[first:upto], np.array(released[:upto - first]), comm, ckpt[first:upto],
                             state["start"])
            del released[:upto - first]
            state["flushed"], state["start"] = upto, arrays.pop("next_start_s")
            (emit or (lambda a, _: state["out"].append(a)))(arrays, first)

    def on_release(r: int) -> None:
        released.append(env.now)  # and with it every time of rounds up to r
        if emit is not None and r + 1 - state["flushed"] >= chunk_rounds:
            flush(r + 1)

    barrier = Barrier(env, n, on_release)
    for i in range(n):
        env.process(node_process(env, compute[:, i], float(comm[i]), barrier, ckpt.tolist()))
    with collector_paused():
        env.run()
    flush(rounds)
    if emit is not None:
        return None
    out = state["out"]
    return out[0] if len(out) == 1 else {k: np.concatenate([a[k] for a in out]) for k in out[0]}


def _replay(compute: np.ndarray, released: np.ndarray, comm: np.ndarray, ckpt_s: np.ndarray,
            start_s: np.ndarray) -> dict[str, np.ndarray]:
    """The timeline arrays of rounds whose barrier released at `released`, from each node's start
    of the first (start_s): per round, done = start + compute, end = released + comm, the next
    start = end (+ the round's ckpt_s): the additions SimPy's clock made, so the same numbers bit for bit."""
    end = released[:, None] + comm
    after = end + ckpt_s[:, None]
    start = np.vstack([start_s[None, :], after[:-1]])
    done = start + compute
    return {"compute_s": done - start, "idle_s": released[:, None] - done, "comm_s": end - released[:, None],
            "round_start_s": start, "round_end_s": end, "next_start_s": after[-1]}


# --- Streaming DiLoCo -------------------------------------------------------------------

class FragmentSync:
    """The fragment syncs of one process group: an all-reduce starts when the last node reaches
    the fragment's sync point and the group's previous all-reduce has ended (a group runs its
    collectives in issue order: FIFO, never two at once on the nodes' links), and lasts
    allreduce_s; node i's own end is offsets[i] (≤ 0) from it, where nodes were measured to end it
    apart. `arrive(i)` is non-blocking: it returns the event of node i's end of the all-reduce,
    which the node waits for at the merge point."""

    def __init__(self, env: simpy.Environment, parties: int, allreduce_s: float, offsets=None, on_arrived=None):
        self.env, self.parties, self.allreduce_s = env, parties, allreduce_s
        self.on_arrived, self.arrivals = on_arrived, 0  # called with the sync every node has reached
        self.offsets = None if offsets is None else [float(o) for o in offsets]
        self._arrived, self._done = 0, self._events()
        self.link_free = -np.inf
        self.spans: list[tuple[float, float]] = []  # (start, end) per sync, in order
        self.node_ends: list[list[float]] = []  # per sync, each node's own end (with offsets)

    def _events(self):
        """The next sync's end: one event for all nodes, or one per node where they end apart."""
        if self.offsets is None:
            return self.env.event()
        return [self.env.event() for _ in range(self.parties)]

    def arrive(self, node: int) -> simpy.Event:
        done = self._done
        self._arrived += 1
        if self._arrived == self.parties:
            self._arrived, self._done = 0, self._events()
            if self.on_arrived is not None:
                self.on_arrived(self.arrivals)
            self.arrivals += 1
            if self.env.now >= self.link_free:
                self._start(done)
            else:  # the previous all-reduce still holds the links: queue behind it
                wait = self.env.timeout(self.link_free - self.env.now)
                wait.callbacks.append(lambda _: self._start(done))
        return done if self.offsets is None else done[node]

    def _start(self, done) -> None:
        start = self.env.now
        end = start + self.allreduce_s
        self.link_free = end  # the time the timeout below fires at
        at_end = [done]  # the events that fire when the all-reduce ends
        if self.offsets is not None:
            ends = [max(end + o, start) for o in self.offsets]
            self.node_ends.append(ends)
            at_end = [event for event, own in zip(done, ends) if own >= end]
            for event, own in zip(done, ends):  # nodes that end it early
                if own < end:
                    self.env.timeout(own - start).callbacks.append(lambda _, e=event: e.succeed())

        def finish(_event) -> None:
            self.spans.append((start, self.env.now))
            for event in at_end:
                event.succeed()
        self.env.timeout(self.allreduce_s).callbacks.append(finish)


def stream_node_process(env, node: int, pre: list, delay: list, outer_s: float, sync: FragmentSync, record,
                        fragments: int, ckpt_s: list):
    """One node: per fragment sync, compute to the sync point, start the all-reduce, compute the τ
    steps to the merge point, wait there for its end of the all-reduce, apply the outer step."""
    timeout, arrive = env.timeout, sync.arrive
    for k, (busy_s, window_s) in enumerate(zip(pre, delay)):
        begin = env.now
        if busy_s:
            yield timeout(busy_s)
        sync_point = env.now
        done = arrive(node)
        if window_s:
            yield timeout(window_s)
        merge_point = env.now
        if not done.triggered:
            yield done
        if outer_s:
            yield timeout(outer_s)
        record((begin, sync_point, merge_point, env.now))
        if (k + 1) % fragments == 0 and ckpt_s[k // fragments]:
            yield timeout(ckpt_s[k // fragments])


def run_streaming_simpy(pre: np.ndarray, delay: np.ndarray, allreduce_s: float, outer_s: float, fragments: int,
                        ckpt_s=0.0, node_offsets_s=None, emit=None,
                        chunk_syncs: int = 0) -> dict[str, np.ndarray] | None:
    """pre, delay (K × nodes): the fragment syncs' compute segments; the arrays of
    engine_analytic.run_streaming_analytic(record=True). emit(arrays, first_sync): called with
    chunks of whole rounds (at least chunk_syncs syncs, a multiple of fragments) as they finish;
    then nothing is returned."""
    env = simpy.Environment()
    k_total, n = pre.shape
    recorder = Recorder(n)
    ckpt = per_round(ckpt_s, -(-k_total // fragments)).tolist()
    state = {"flushed": 0}  # syncs handed on (and dropped from the records)

    def flush(upto: int) -> None:
        # each node's records hold syncs < upto, the group's spans those whose all-reduce ended
        done = min(upto, state["flushed"] + len(sync.spans))
        done -= done % fragments
        count = done - state["flushed"]
        if count > 0:
            emit(_stream_arrays(recorder, sync, count, node_offsets_s is not None), state["flushed"])
            state["flushed"] = done

    # When all have reached sync k, every node has recorded syncs < k (a node records one before
    # it computes towards the next).
    on_arrived = (lambda k: flush(k) if k - state["flushed"] >= chunk_syncs else None) if emit else None
    sync = FragmentSync(env, n, float(allreduce_s), node_offsets_s, on_arrived)
    for i in range(n):  # each node extends one flat list of floats
        env.process(stream_node_process(env, i, pre[:, i].tolist(), delay[:, i].tolist(), float(outer_s), sync,
                                        recorder.per_node[i].extend, fragments, ckpt))
    with collector_paused():
        env.run()
    if emit is None:
        return _stream_arrays(recorder, sync, k_total, node_offsets_s is not None)
    flush(k_total)
    return None


def _stream_arrays(recorder: Recorder, sync: FragmentSync, count: int, own_ends: bool) -> dict[str, np.ndarray]:
    """The first `count` fragment syncs' arrays (K × nodes), dropped from the records."""
    n = len(recorder.per_node)
    table = np.array([records[:4 * count] for records in recorder.per_node], dtype=float).reshape(n, count, 4)
    for records in recorder.per_node:
        del records[:4 * count]
    spans = np.array(sync.spans[:count], dtype=float).reshape(count, 2)
    del sync.spans[:count]
    out = {name: table[:, :, f].T for f, name in enumerate(("compute_start_s", "sync_point_s", "merge_point_s",
                                                              "resume_s"))}
    ends = spans[:, 1:] if not own_ends else np.array(sync.node_ends[:count], dtype=float).reshape(count, n)
    if own_ends:
        del sync.node_ends[:count]
    return {**out, "start_s": spans[:, 0], "end_s": spans[:, 1],
            "node_end_s": np.broadcast_to(ends, (count, n)).copy()}
