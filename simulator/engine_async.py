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

quorum: a round closes when `need` of the nodes still training wait at their sync point, after
a grace window of grace_s more (or at once when every node still training waits); the nodes
waiting then are that round's: their pseudo-gradients are averaged by an all-reduce among them
(comm_s, the group's all-reduces in issue order as engine_simpy.FragmentSync's) and they pull
the new model. A node still computing at the close is late: it merges its pseudo-gradient, made
from an older model, into the next round it waits for (late work merged next round, never
dropped). idle_s: its wait from its sync point to its all-reduce's start; comm_s the all-reduce.

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

from simulator.engine_simpy import collector_paused

WEIGHT_BYTES_PER_PARAM = 4  # the fp32 global weights a node pulls after its push
STALE_FIELDS = ["staleness", "stale_work"]
FIELDS = ["compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s", *STALE_FIELDS]


def push_pull_raw(links_gbps, latency_ms: float, payload_bytes: float, weight_bytes: float, outer_s):
    """service_i of the module docstring for links (..., n) and the outer step (..., 1 or scalar)."""
    links = np.asarray(links_gbps, dtype=float)
    return 2 * latency_ms / 1e3 + (payload_bytes + weight_bytes) * 8 / (links * 1e9) + outer_s


def service_s(scenario, plan) -> np.ndarray:
    """Each plan node's async service (push, outer step, pull) on the scenario's typed links (nodes,)."""
    from simulator.network import link_gbps, outer_step_s, payload_bytes

    links = dict(zip((n.name for n in scenario.nodes), link_gbps(scenario)))
    weights = WEIGHT_BYTES_PER_PARAM * scenario.model.param_count
    return push_pull_raw([links[p.node] for p in plan.nodes], scenario.network.latency_ms,
                         payload_bytes(scenario, plan.payload_dtype), weights, outer_step_s(scenario))


def quorum_need(share: float, nodes: int) -> int:
    """Nodes whose arrival closes a quorum round: ⌈share·n⌉, at least 1."""
    return max(1, math.ceil(share * nodes - 1e-9))


def _arrays(rounds: int, n: int) -> dict[str, np.ndarray]:
    return {name: np.zeros((rounds, n)) for name in FIELDS}


def _record(out: dict, r: int, i: int, start: float, arrive: float, begin: float, end: float,
            stale: float, work: float) -> None:
    """One node-round into the arrays: its compute, its wait, its sync, and its pseudo-gradient's staleness."""
    for name, value in zip(FIELDS, (arrive - start, begin - arrive, end - begin, start, end, stale, work)):
        out[name][r, i] = value


class Versions:
    """The global model's versions: updates applied and pseudo-gradients merged, and what each node pulled."""

    def __init__(self, n: int) -> None:
        self.updates, self.merged = 0, 0
        self.pulled_update, self.pulled_merged = [0] * n, [0] * n

    def merge(self, nodes: list[int]) -> list[tuple[int, int]]:
        """One global update of these nodes' pseudo-gradients: each one's (staleness, stale work); they pull it."""
        stale = [(self.updates - self.pulled_update[i], self.merged - self.pulled_merged[i]) for i in nodes]
        self.updates += 1
        self.merged += len(nodes)
        for i in nodes:
            self.pulled_update[i], self.pulled_merged[i] = self.updates, self.merged
        return stale


# --- async ---------------------------------------------------------------------------------

def _async_node(env, i: int, compute: list, service_s: float, server: simpy.Resource, versions: Versions, out):
    for r, busy_s in enumerate(compute):
        start = env.now
        yield env.timeout(busy_s)
        arrive = env.now
        with server.request() as turn:
            yield turn
            begin = env.now
            (stale, work), = versions.merge([i])
            yield env.timeout(service_s)
        _record(out, r, i, start, arrive, begin, env.now, stale, work)


def run_async_simpy(compute: np.ndarray, service_s) -> dict[str, np.ndarray]:
    """compute (rounds × nodes), service_s (nodes,): the arrays of FIELDS (rounds × nodes)."""
    env = simpy.Environment()
    rounds, n = compute.shape
    service = np.broadcast_to(np.asarray(service_s, dtype=float), (n,))
    server = simpy.Resource(env, capacity=1)
    versions, out = Versions(n), _arrays(rounds, n)
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
    versions, out = Versions(n), _arrays(rounds, n)
    queue = [(busy[0][i], i, i, 0.0) for i in range(n)]  # (arrival, scheduled order, node, round start)
    heapq.heapify(queue)
    done, order, free = [0] * n, n, -math.inf
    while queue:
        arrive, _, i, start = heapq.heappop(queue)
        begin = arrive if arrive >= free else free
        (stale, work), = versions.merge([i])
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
    """The quorum rounds of one group: arrivals wait; `need` of the nodes still training (all of
    them when fewer remain) start the grace window; its end, or every remaining node waiting,
    closes the round: an all-reduce among the waiting nodes, after the group's previous one."""

    def __init__(self, env: simpy.Environment, n: int, rounds: int, need: int, grace_s: float, comm_s: float):
        self.env, self.need, self.grace_s, self.comm_s = env, need, grace_s, comm_s
        self.remaining = n  # nodes with a round still to merge
        self.left = [rounds] * n
        self.waiting: list[tuple[int, simpy.Event]] = []
        self.window = 0  # the grace window open (its number), 0: none
        self.windows = 0
        self.link_free = -math.inf
        self.versions = Versions(n)

    def arrive(self, node: int) -> simpy.Event:
        """Node waits at its sync point; the event fires with (begin, end, staleness, stale work) of its merge."""
        done = self.env.event()
        self.waiting.append((node, done))
        if len(self.waiting) == self.remaining:
            self._close()
        elif len(self.waiting) >= min(self.need, self.remaining) and not self.window:
            self.windows += 1
            self.window = number = self.windows
            self.env.timeout(self.grace_s).callbacks.append(lambda _: self._close() if self.window == number else None)
        return done

    def _close(self) -> None:
        self.window = 0
        members, self.waiting = self.waiting, []
        stale = self.versions.merge([i for i, _ in members])
        for i, _ in members:
            self.left[i] -= 1
        self.remaining -= sum(1 for i, _ in members if self.left[i] == 0)
        begin = max(self.env.now, self.link_free)
        end = begin + self.comm_s
        self.link_free = end

        def finish(_event) -> None:
            for (_, done), (s, w) in zip(members, stale):
                done.succeed((begin, self.env.now, s, w))
        self.env.timeout(end - self.env.now).callbacks.append(finish)


def _quorum_node(env, i: int, compute: list, quorum: Quorum, out):
    for r, busy_s in enumerate(compute):
        start = env.now
        yield env.timeout(busy_s)
        arrive = env.now
        begin, end, stale, work = yield quorum.arrive(i)
        _record(out, r, i, start, arrive, begin, end, stale, work)


def run_quorum_simpy(compute: np.ndarray, need: int, grace_s: float, comm_s: float) -> dict[str, np.ndarray]:
    """compute (rounds × nodes): the arrays of FIELDS (rounds × nodes) of quorum rounds."""
    env = simpy.Environment()
    rounds, n = compute.shape
    quorum = Quorum(env, n, rounds, need, float(grace_s), float(comm_s))
    out = _arrays(rounds, n)
    for i in range(n):
        env.process(_quorum_node(env, i, compute[:, i].tolist(), quorum, out))
    with collector_paused():
        env.run()
    return out
