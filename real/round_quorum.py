"""Quorum rounds (strategy `quorum`, issue 40): a round closes on a quorum of nodes plus a grace
window, not on everyone; a parameter server on rank 0 holds the global model.

The rule is simulator/engine_async.py's Quorum, run for real. Node i runs its H_i inner steps and
pushes its pseudo-gradient. A node that pulled the model now standing is on time: it waits for the
round's close. Once `need` nodes (fewer where fewer can still come) have pushes in, the grace window
opens (plan.grace_s); its end, or nobody left to come, closes the round: the server averages every
push in (each weighted as the synchronous average weighs it, renormalised over the nodes in),
applies DiLoCo's outer step (Nesterov SGD, real/diloco.py OuterState) and sends the new weights to
the nodes that waited. A node whose round closed without it is late: it does not wait; its push goes
into the next close and it pulls the model now standing (after the close's transfer) and computes
on. With need = n every close holds every node, which is DiLoCo (tests/test_quorum_real.py).

Rank 0 runs two threads beside node 0's training: a receiver takes the other leaders' pushes off
the wire (a receive from any source on a gloo group of its own), and a coordinator takes them and
node 0's own, in arrival order, opens and closes rounds on their arrivals and its grace timer, and
sends each reply when it is due. Under --emulate a close holds the server's link for the plan's
comm_s × time_scale (a later close and a late pull begin after it, as the simulator's all-reduces
queue), each node pads its sync after the wait to comm_s × time_scale (the transfers inside it, as
every emulated sync is padded), and the grace window is plan.grace_s × time_scale.

The wire on the server group, per push of node j: a header (the round, j), j's pseudo-gradient in
the plan's payload dtype (real/sync.py encode), then from the server the fp32 global weights and two
figures: the push's staleness (closes between j's pull and the close that merges it; 0 on time)
and the wait from its arrival to the start of its reply (the round's close, or the end of the link's
last close for a late node).

Per round, on the leader's clock (trace.csv plus `staleness`): compute_s the inner steps; idle_s that
wait; comm_s the rest of the sync (the close's transfer, or the pull). What a quorum run does not do
(sharded nodes, checkpoints, --on-node-loss continue) is refused by real/launch.py check_async.
"""
from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from formats.plan import quorum_need
from formats.wire import encoded_bytes
from real.diloco import OuterState
from real.options import run_collective, sleep_until
from real.rounds import NodeParts, Origin, Round, compute_phase, round_row
from real.sync import decode, encode

HEADER, PAYLOAD, WEIGHTS, STATS = 0, 1, 2, 3  # message tags on the server group


@dataclass
class Push:
    """One node's pseudo-gradient at the server: decoded, weighted c_i/D; `at` when the server had
    it; `done` node 0's reply (set in-process), None for a node across the wire."""

    node: int
    delta: torch.Tensor
    at: float
    done: threading.Event | None = None
    reply: tuple = field(default=())


def node_shares(plan, averaging: str) -> list[float]:
    """Each node's share of the synchronous average (Σ = 1): what a close divides the pushes in by,
    so that a close of every node is DiLoCo's average (real/diloco.py averaging_weights)."""
    n = len(plan.nodes)
    if averaging == "uniform":
        return [1.0 / n] * n
    tokens = [node.tokens_per_round(1) for node in plan.nodes]
    return [t / sum(tokens) for t in tokens]


class QuorumServer:
    """The global model, its outer momentum, the open round and the replies due, on rank 0."""

    def __init__(self, parts: NodeParts, rounds: int, group, grace_s: float, pad_s: float):
        plan = parts.plan
        self.parts, self.rounds, self.group, self.grace_s, self.pad_s = parts, rounds, group, grace_s, pad_s
        self.n = len(plan.nodes)
        self.need = quorum_need(plan.quorum, self.n)
        self.shares = node_shares(plan, parts.diloco.averaging)
        self.state = OuterState([parts.outer.global_flat.detach().to("cpu", copy=True)])
        self.standing = self.state.global_flat.clone()  # the model a pull gets
        self.version, self.pulled, self.arrived = 0, [0] * self.n, [0] * self.n
        self.waiting: dict[int, Push] = {}  # on-time nodes waiting for the close
        self.entries: list[Push] = []  # the pushes the next close merges
        self.deadline: float | None = None  # the grace window's end
        self.link_free = -math.inf  # the end of the last close's transfer
        self.due: list[tuple] = []  # heap of replies: (time, order, push, weights, stats)
        self.order = itertools.count()
        self.inbox: queue.Queue[Push] = queue.Queue()
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._guard, args=(self._coordinate,), name="geodt-quorum",
                                         daemon=True)]
        if self.n > 1:
            self.threads.append(threading.Thread(target=self._guard, args=(self._receive,),
                                                 name="geodt-quorum-recv", daemon=True))
        for thread in self.threads:
            thread.start()

    def hand_in(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Node 0's push; returns (weights, stats) once its reply is due."""
        push = Push(0, delta, time.perf_counter(), done=threading.Event())
        self.inbox.put(push)
        while not push.done.wait(0.5):
            if self.error is not None:
                raise RuntimeError(f"the quorum server failed: {self.error}") from self.error
        return push.reply

    def join(self) -> torch.Tensor:
        """Wait for the last close and reply; the final global weights (a thread's failure raised here)."""
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise self.error
        return self.state.global_flat

    def _guard(self, body) -> None:
        try:
            body()
        except BaseException as exc:  # raised again in the main thread by join() or hand_in()
            self.error = exc

    def _receive(self) -> None:
        plan = self.parts.plan
        params = self.state.global_flat.numel()
        for _ in range(self.rounds * (self.n - 1)):
            header = torch.zeros(2, dtype=torch.int64)
            run_collective(dist.recv, header, group=self.group, tag=HEADER)  # from any node
            node = int(header[1])
            wire = torch.empty(encoded_bytes(params, plan.payload_dtype), dtype=torch.uint8)
            run_collective(dist.recv, wire, src=plan.first_rank(node), group=self.group, tag=PAYLOAD)
            self.inbox.put(Push(node, decode(wire, params, plan.payload_dtype), time.perf_counter()))

    def _coordinate(self) -> None:
        pushes = self.rounds * self.n
        while (pushes or self.due) and self.error is None:  # the receiver's failure ends the serving
            wake = min([t for t in (self.deadline, self.due[0][0] if self.due else None) if t is not None],
                       default=None)
            timeout = 0.5 if wake is None else min(0.5, max(0.0, wake - time.perf_counter()))
            if pushes:
                try:
                    push = self.inbox.get(timeout=timeout)
                except queue.Empty:
                    pass
                else:
                    pushes -= 1
                    self._arrive(push)
            elif timeout:
                time.sleep(timeout)
            if self.deadline is not None and time.perf_counter() >= self.deadline:
                self._close()
            self._send_due()

    def _arrive(self, push: Push) -> None:
        node = push.node
        self.arrived[node] += 1
        self.entries.append(push)
        if self.pulled[node] < self.version:  # late: the model standing, after the link's last close
            staleness = self.version - self.pulled[node]
            self.pulled[node] = self.version
            self._reply(push, max(push.at, self.link_free), staleness)
        else:
            self.waiting[node] = push
        # The quorum counts the nodes that wait (simulator/engine_async.py Quorum: late work rides on a close)
        coming = sum(1 for i in range(self.n) if self.arrived[i] < self.rounds and i not in self.waiting)
        waiting = len(self.waiting)
        if not coming:
            self._close()
        elif waiting >= min(self.need, waiting + coming) and self.deadline is None:
            self.deadline = push.at + self.grace_s

    def _close(self) -> None:
        """Merge every push in, the outer step, and the replies to the nodes that waited."""
        self.deadline = None
        entries, self.entries = self.entries, []
        grad = torch.stack([push.delta for push in entries]).sum(0)
        grad.div_(sum(self.shares[push.node] for push in entries))
        self.state.outer_step(grad, self.parts.diloco.outer_lr, self.parts.diloco.outer_momentum)
        self.version += 1
        self.standing = self.state.global_flat.clone()
        begin = max(time.perf_counter(), self.link_free)
        self.link_free = begin + self.pad_s
        for node, push in self.waiting.items():
            self.pulled[node] = self.version
            self._reply(push, begin, 0)
        self.waiting.clear()

    def _reply(self, push: Push, begin: float, staleness: int) -> None:
        stats = torch.tensor([float(staleness), begin - push.at], dtype=torch.float64)
        heapq.heappush(self.due, (begin, next(self.order), push, self.standing, stats))

    def _send_due(self) -> None:
        while self.due and self.due[0][0] <= time.perf_counter():
            _, _, push, weights, stats = heapq.heappop(self.due)
            if push.done is not None:
                push.reply = (weights, stats)
                push.done.set()
                continue
            rank = self.parts.plan.first_rank(push.node)
            run_collective(dist.send, weights, dst=rank, group=self.group, tag=WEIGHTS)
            run_collective(dist.send, stats, dst=rank, group=self.group, tag=STATS)


class QuorumRound(Round):
    """A quorum round (the module doc)."""

    extra_columns = ("staleness",)

    def __init__(self, parts: NodeParts, rounds: int, timeout_s: float):
        self.parts = parts
        plan, groups, opts = parts.plan, parts.groups, parts.opts
        n = len(plan.nodes)
        self.push_scale = parts.coef / parts.divisor  # the node's term of the synchronous average
        self.server_rank = plan.first_rank(0)
        # Every process creates the group, as torch.distributed requires; only leaders use it.
        group = dist.new_group([plan.first_rank(i) for i in range(n)], timeout=timedelta(seconds=timeout_s),
                               backend="gloo")
        self.group = group if groups.is_leader else None
        scale = opts.time_scale if opts.emulate else 1.0
        self.pad_s = plan.comm_s * opts.time_scale if opts.emulate else 0.0
        self.server = (QuorumServer(parts, rounds, self.group, plan.grace_s * scale, self.pad_s)
                       if groups.rank == self.server_rank else None)

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        p = self.parts
        round_start, clock, loss_sum, compute_end = compute_phase(p, bar)
        staleness, wait_s, sent = self._push_pull(r) if p.groups.is_leader else (0, 0.0, 0)
        if self.pad_s:  # the sync after the wait, its transfers included, padded as every emulated sync is
            sleep_until(compute_end + wait_s + self.pad_s)
        p.groups.broadcast_in_node(p.outer.global_flat)
        p.outer.load_into_model()
        p.groups.sync_device()
        sync_end = time.perf_counter()
        sync_s = sync_end - compute_end
        idle_s = min(max(0.0, wait_s), sync_s)
        row = round_row(p, r, origin, loss_sum, clock, compute_s=compute_end - round_start, idle_s=idle_s,
                        comm_s=sync_s - idle_s, start=round_start, end=sync_end, bytes_sent=sent)
        row["staleness"] = staleness
        return row

    def _push_pull(self, r: int) -> tuple[int, float, int]:
        """The leader's push of round r and its pull: (staleness, wait seconds, bytes sent); the new
        global weights land in outer.global_flat."""
        p = self.parts
        outer, dtype = p.outer, p.plan.payload_dtype
        delta = outer.pseudo_gradient(self.push_scale).cpu()
        wire = encode(delta, dtype)
        if self.server is not None:  # node 0: the server is in this process
            weights, stats = self.server.hand_in(decode(wire, delta.numel(), dtype))
            outer.global_flat.copy_(weights)
            return int(stats[0]), float(stats[1]), 0
        server, group = self.server_rank, self.group
        run_collective(dist.send, torch.tensor([r, p.groups.index], dtype=torch.int64), dst=server, group=group,
                       tag=HEADER)
        run_collective(dist.send, wire, dst=server, group=group, tag=PAYLOAD)
        weights = torch.empty(outer.global_flat.numel(), dtype=torch.float32)
        run_collective(dist.recv, weights, src=server, group=group, tag=WEIGHTS)
        stats = torch.zeros(2, dtype=torch.float64)
        run_collective(dist.recv, stats, src=server, group=group, tag=STATS)
        outer.global_flat.copy_(weights)
        return int(stats[0]), float(stats[1]), wire.numel()

    def close(self) -> None:
        """Rank 0: wait for the last close, then hold the final global model (the run's final weights)."""
        if self.server is None:
            return
        self.parts.outer.global_flat.copy_(self.server.join())
        self.parts.outer.load_into_model()
