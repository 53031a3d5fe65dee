"""Rounds without a barrier (issue 40): the `async` server and the `quorum` round, in SimPy and analytically.

async (Liu et al. 2024, arXiv 2401.09135; docs/PAPERS.md): a parameter server holds the global
model. Node i computes its H_i inner steps, then pushes its pseudo-gradient to the server, the
server applies it at once (one outer step per arrival) and the node pulls the new global weights
and starts its next round; nobody waits for anybody else. The server is one shared SimPy
Resource of capacity 1: it serves one node's push, outer step and pull at a time, first come
first served, each transfer at the node's own link (the server's is [network] bandwidth_gbps,
never slower than a node's), so the node's sync competes with the others' for the server's link.
A node's service time is

    service_i = 2·latency + payload·8 / link_i + outer_step + weights·8 / link_i

(payload: the pseudo-gradient in the payload dtype; weights: WEIGHT_BYTES_PER_PARAM per
parameter, the fp32 global model pulled back; the typed links, not a network profile's
all-reduce fits; no encode/decode priced). Per node and round: compute_s its inner steps, idle_s
its wait in the server's queue (the others' syncs ahead of it), comm_s its own service.

quorum: a round closes when `need` nodes (fewer where fewer can still come) wait at their sync
point with pseudo-gradients made from the model standing, after a grace window of grace_s more (or at once when no
node can still come); every pseudo-gradient in is averaged by an all-reduce (comm_s, the group's
all-reduces in issue order as engine_simpy.FragmentSync's) and the nodes that waited for it pull
the new model. A node whose round closed without it (a close happened since its pull) is late:
it does not wait for the next quorum; its pseudo-gradient, made from the older model, goes into
the next close (late work merged next round, never dropped; its communication thread takes part
while it computes), and it pulls the latest model (once that close's all-reduce ended, then
comm_s) and computes on. idle_s: the wait from the sync point to its all-reduce's start (late:
to the latest all-reduce's end); comm_s the all-reduce (late: the pull).

Staleness of a merged pseudo-gradient: the global updates applied between the node's pull and
its merge (`staleness`; 0 for every barrier strategy), and the pseudo-gradients merged by them
(`stale_work`; async: the same number, one per update); both per node and round.

Every node runs the plan's rounds; the run ends with the last merge. The async path has an
analytic twin (`run_async_analytic`, a first-come-first-served queue recurrence making the SimPy
clock's additions in its order; tests/test_async.py holds them equal); quorum's grace timers are
SimPy's only.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import simpy

from simulator.engines.engine_simpy import collector_paused
from simulator.models.network import link_gbps, outer_step_s, payload_bytes
from simulator.models.timing import node_timings

WEIGHT_BYTES_PER_PARAM = 4  # the fp32 global weights a node pulls after its push
STALE_FIELDS = ["staleness", "stale_work"]
FIELDS = ["compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s", *STALE_FIELDS]


def push_pull_raw(links_gbps, latency_ms: float, payload_bytes: float, weight_bytes: float, outer_s):
    """service_i of the module docstring for links (..., n) and the outer step (..., 1 or scalar)."""
    links = np.asarray(links_gbps, dtype=float)
    return 2 * latency_ms / 1e3 + (payload_bytes + weight_bytes) * 8 / (links * 1e9) + outer_s


def service_s(scenario, plan) -> np.ndarray:
    """Each plan node's async service (push, outer step, pull) on the scenario's typed links (nodes,); the
    server's outer step priced as the scenario's sync prices it (network.outer_step_s: the slowest node's)."""
    links = dict(zip((n.name for n in scenario.nodes), link_gbps(scenario)))
    weights = WEIGHT_BYTES_PER_PARAM * scenario.model.param_count
    outer = outer_step_s(scenario, [t.layout for t in node_timings(scenario)])
    return push_pull_raw([links[p.node] for p in plan.nodes], scenario.network.latency_ms,
                         payload_bytes(scenario, plan.payload_dtype), weights, outer)


def _arrays(rounds: int, n: int) -> dict[str, np.ndarray]:
    """The FIELDS, NaN until a node-round is recorded (a pseudo-gradient never merged would stay NaN)."""
    return {name: np.full((rounds, n), np.nan) for name in FIELDS}


def _record(out: dict, r: int, i: int, start: float, arrive: float, begin: float, end: float,
            stale: float, work: float) -> None:
    """One node-round into the arrays: its compute, its wait, its sync, and its pseudo-gradient's staleness."""
    for name, value in zip(FIELDS, (arrive - start, begin - arrive, end - begin, start, end, stale, work)):
        out[name][r, i] = value


class Versions:
    """The global model's versions: updates applied and pseudo-gradients merged so far."""

    def __init__(self) -> None:
        self.updates, self.merged = 0, 0

    def now(self) -> tuple[int, int]:
        """What a node pulls: (updates, pseudo-gradients merged) of the model as it stands."""
        return self.updates, self.merged

    def merge(self, pulls: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """One global update of pseudo-gradients made from the models `pulls`: each one's (staleness, stale work)."""
        stale = [(self.updates - u, self.merged - m) for u, m in pulls]
        self.updates += 1
        self.merged += len(pulls)
        return stale


# --- async ---------------------------------------------------------------------------------

def _async_node(env, i: int, compute: list, service_s: float, server: simpy.Resource, versions: Versions, out):
    pulled = versions.now()
    for r, busy_s in enumerate(compute):
        start = env.now
        yield env.timeout(busy_s)
        arrive = env.now
        with server.request() as turn:
            yield turn
            begin = env.now
            (stale, work), = versions.merge([pulled])
            pulled = versions.now()
            yield env.timeout(service_s)
        _record(out, r, i, start, arrive, begin, env.now, stale, work)


def run_async_simpy(compute: np.ndarray, service_s) -> dict[str, np.ndarray]:
    """compute (rounds × nodes), service_s (nodes,): the arrays of FIELDS (rounds × nodes)."""
    env = simpy.Environment()
    rounds, n = compute.shape
    service = np.broadcast_to(np.asarray(service_s, dtype=float), (n,))
    server = simpy.Resource(env, capacity=1)
    versions, out = Versions(), _arrays(rounds, n)
    for i in range(n):
        env.process(_async_node(env, i, compute[:, i].tolist(), float(service[i]), server, versions, out))
    with collector_paused():
        env.run()
    return out


def run_async_analytic(compute: np.ndarray, service_s) -> dict[str, np.ndarray]:
    """run_async_simpy without events: the server takes arrivals first come first served, ties in
    the order the nodes' compute was scheduled (SimPy's), and serves each from max(arrival, free)."""
    rounds, n = compute.shape
    service = np.broadcast_to(np.asarray(service_s, dtype=float), (n,)).tolist()
    busy = compute.tolist()
    versions, out = Versions(), _arrays(rounds, n)
    pulled = [versions.now()] * n
    queue = [(busy[0][i], i, i, 0.0) for i in range(n)]  # (arrival, scheduled order, node, round start)
    heapq.heapify(queue)
    done, order, free = [0] * n, n, -math.inf
    while queue:
        arrive, _, i, start = heapq.heappop(queue)
        begin = arrive if arrive >= free else free
        (stale, work), = versions.merge([pulled[i]])
        pulled[i] = versions.now()
        end = begin + service[i]
        free = end
        r = done[i]
        _record(out, r, i, start, arrive, begin, end, stale, work)
        done[i] = r + 1
        if r + 1 < rounds:
            heapq.heappush(queue, (end + busy[r + 1][i], order, i, end))
            order += 1
    return out


# --- quorum --------------------------------------------------------------------------------

class Quorum:
    """The quorum rounds of one group. A node that reaches its sync point before the round it pulled
    from closed waits (blocked); once `need` nodes (fewer where fewer can still come) wait, the
    grace window opens; its end, or nobody left to come, closes the round: an
    all-reduce of every pseudo-gradient in, after the group's previous one. A node whose round closed
    without it (late) does not wait for the next: its pseudo-gradient goes into the next close (its
    communication thread takes part while it computes) and it pulls the latest model (after that
    close's all-reduce ends, then comm_s) and computes on."""

    def __init__(self, env: simpy.Environment, n: int, rounds: int, need: int, grace_s: float, comm_s: float, out):
        self.env, self.rounds, self.need, self.grace_s, self.comm_s, self.out = env, rounds, need, grace_s, comm_s, out
        self.arrived = [0] * n  # rounds each node has brought to its sync point
        self.blocked: set[int] = set()
        self.entries: list[tuple] = []  # (node, round, its pull, its event or None) of the pseudo-gradients in
        self.window = self.windows = 0  # the grace window open (its number; 0: none), windows opened so far
        self.link_free = -math.inf
        self.versions = Versions()
        self.pulled = [self.versions.now()] * n

    def arrive(self, node: int, r: int) -> simpy.Event | None:
        """Node's round r at its sync point: the event of its merge ((begin, end) of the all-reduce), or None
        when it is late (its pseudo-gradient waits for the next close without it)."""
        self.arrived[node] += 1
        late = self.pulled[node][0] < self.versions.updates
        done = None if late else self.env.event()
        self.entries.append((node, r, self.pulled[node], done))
        if late:
            self.pulled[node] = self.versions.now()
        else:
            self.blocked.add(node)
        # The quorum counts the nodes that wait: a late pseudo-gradient rides on the next close but
        # does not make one (else late work alone would close rounds nobody waits for, every
        # node late from then on).
        coming = sum(1 for i, a in enumerate(self.arrived) if a < self.rounds and i not in self.blocked)
        waiting = len(self.blocked)
        if not coming:
            self._close()
        elif waiting >= min(self.need, waiting + coming) and not self.window:
            self.windows += 1
            self.window = number = self.windows
            self.env.timeout(self.grace_s).callbacks.append(lambda _: self._close() if self.window == number else None)
        return done

    def _close(self) -> None:
        self.window = 0
        entries, self.entries = self.entries, []
        for (node, r, _, _), (stale, work) in zip(entries, self.versions.merge([e[2] for e in entries])):
            self.out["staleness"][r, node], self.out["stale_work"][r, node] = stale, work
        members = [(node, done) for node, _, _, done in entries if done is not None]
        for node, _ in members:
            self.blocked.discard(node)
            self.pulled[node] = self.versions.now()
        behind = self.link_free - self.env.now  # > 0: the group's previous all-reduce still runs
        self.link_free = max(self.env.now, self.link_free) + self.comm_s

        def finish(begin: float) -> None:
            for _, done in members:
                done.succeed((begin, self.env.now))

        def start(_event) -> None:
            begin = self.env.now
            self.env.timeout(self.comm_s).callbacks.append(lambda _: finish(begin))
        if behind > 0:
            self.env.timeout(behind).callbacks.append(start)
        else:
            start(None)


def _quorum_node(env, i: int, compute: list, quorum: Quorum, out):
    for r, busy_s in enumerate(compute):
        start = env.now
        yield env.timeout(busy_s)
        arrive = env.now
        merged = quorum.arrive(i, r)
        if merged is not None:
            begin, end = yield merged
        else:  # late: the latest close's model, once its all-reduce ended, then the pull
            if quorum.link_free > env.now:
                yield env.timeout(quorum.link_free - env.now)
            begin = env.now
            yield env.timeout(quorum.comm_s)
            end = env.now
        for name, value in zip(FIELDS, (arrive - start, begin - arrive, end - begin, start, end)):
            out[name][r, i] = value


def run_quorum_simpy(compute: np.ndarray, need: int, grace_s: float, comm_s: float) -> dict[str, np.ndarray]:
    """compute (rounds × nodes): the arrays of FIELDS (rounds × nodes) of quorum rounds."""
    env = simpy.Environment()
    rounds, n = compute.shape
    out = _arrays(rounds, n)
    quorum = Quorum(env, n, rounds, need, float(grace_s), float(comm_s), out)
    for i in range(n):
        env.process(_quorum_node(env, i, compute[:, i].tolist(), quorum, out))
    with collector_paused():
        env.run()
    return out
