"""Quorum rounds (strategy `quorum`, issue 40): a round closes on a quorum of nodes plus a grace
window, not on everyone; a parameter server on rank 0 holds the global model.

The rule is simulator/engines/engine_async.py's Quorum, run for real. Node i runs its H_i inner steps and
pushes its pseudo-gradient. A node that pulled the model now standing is on time: it waits for the
round's close. Once `need` nodes (fewer where fewer can still come) have pushes in, the grace window
opens (plan.quorum.grace_s); its end, or nobody left to come, closes the round: the server averages every
push in (each weighted as the synchronous average weighs it, renormalised over the nodes in),
applies DiLoCo's outer step (Nesterov SGD, real/core/diloco.py OuterState) and sends the new weights to
the nodes that waited. A node whose round closed without it is late: it does not wait; its push goes
into the next close and it pulls the model now standing (after the close's transfer) and computes
on. With need = n every close holds every node, which is DiLoCo (tests/test_quorum_real.py).

Rank 0 runs two threads beside node 0's training: a receiver takes the other leaders' pushes off
the wire (a receive from any source on a gloo group of its own), and a coordinator takes them and
node 0's own, in arrival order, opens and closes rounds on their arrivals and its grace timer, and
sends each reply when it is due. Under --emulate a close holds the server's link for the plan's
comm_s × time_scale (a later close and a late pull begin after it, as the simulator's all-reduces
queue), each node pads its sync after the wait to comm_s × time_scale (the transfers inside it, as
every emulated sync is padded), and the grace window is plan.quorum.grace_s × time_scale.

The wire on the server group, per push of node j: a header (the round, j, 0), j's pseudo-gradient in
the plan's payload dtype (real/core/sync.py encode), then from the server the fp32 global weights and five
figures: the push's staleness (closes between j's pull and the close that merges it; 0 on time),
the wait from its arrival to the start of its reply (the round's close, or the end of the link's
last close for a late node), the closes j has pulled, the reply's mark and the newest cut every
node has written its part of (the checkpoints below). A node stopped at the stop cut before its
last round sends a header (-1, j, 1) instead, so that the receiver stops listening for it.

Per round, on the leader's clock (trace.csv plus `staleness`): compute_s the inner steps; idle_s that
wait; comm_s the rest of the sync (the close's transfer, or the pull). The round's skeleton, the wire
and the cuts are an async round's (real/rounds/round_server.py ServerRound).

Checkpoints are a consistent cut (Chandy–Lamport), as an async run's (real/rounds/round_async.py; written by
real/checkpoint/checkpoint.py). The coordinator's decisions (each arrival it takes in, each close) are in one
order; cuts are due in arrivals (`Cuts`, real/checkpoint/checkpoint.py async_cuts), and the cut at A is the
server's state right after it took in the A-th arrival and any close that arrival brought at once.
Each decision's `mark` is the first cut it is in: the arrivals taken in when it was made, plus one
for a close on the grace timer (made after that arrival's cut). The server records at a cut θ_g, the
outer momentum, its closes, each node's last pull, the late pushes the next close will merge (their
nodes had their replies: their snapshots include them), and each node's arrivals less the push of
each node still waiting for a close (no reply yet: that node's snapshot predates the push; a resumed
run counts arrivals from there and redoes it); not its timers (a resumed run opens windows afresh).
Every reply carries its mark, so a node writes, for each cut, its snapshot of its last pull whose
mark is at or before the cut, once a later reply (or its end) shows the cut taken. A run stopped at
a cut (--stop-after) stops each node at its first reply marked after the stop cut (so that no
node's absence changes a decision in the cut), and the server then counts that node as no longer
coming (a close comes at once when nobody can still come). What a quorum run does not do (sharded
nodes, Streaming DiLoCo, --on-node-loss continue) is refused by real/process/launch.py check_async.
"""
from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from formats.plan import quorum_need
from formats.wire import encoded_bytes
from real.core.diloco import OuterState
from real.core.options import run_collective, sleep_until
from real.core.sync import decode
from real.rounds.round_server import HEADER, PAYLOAD, STATS, WEIGHTS, Cuts, ServerRound
from real.rounds.rounds import NodeParts


@dataclass
class Push:
    """One node's pseudo-gradient at the server: decoded, weighted c_i/D (never changed in place: a
    cut's record holds it as is); `at` when the server had it; `done` node 0's reply (set
    in-process), None for a node across the wire."""

    node: int
    delta: torch.Tensor
    at: float
    done: threading.Event | None = None
    reply: tuple = field(default=())


def node_shares(plan, averaging: str) -> list[float]:
    """Each node's share of the synchronous average (Σ = 1): what a close divides the pushes in by,
    so that a close of every node is DiLoCo's average (real/core/diloco.py averaging_weights)."""
    n = len(plan.nodes)
    if averaging == "uniform":
        return [1.0 / n] * n
    tokens = [node.tokens_per_round(1) for node in plan.nodes]
    return [t / sum(tokens) for t in tokens]


def past_stop(cuts: Cuts, mark: int) -> bool:
    """Whether a node whose last reply bears `mark` does no more rounds: its reply was decided after
    the stop cut was taken (mark > stop: a node stops only once the cut is taken, so that its
    absence changes no decision in it; an async node stops at the pull at the cut), or the run
    resumed at the stop cut."""
    return cuts.stop is not None and (mark > cuts.stop or cuts.resumed >= cuts.stop)


class QuorumServer:
    """The global model, its outer momentum, the open round and the replies due, on rank 0."""

    def __init__(self, parts: NodeParts, rounds: int, group, grace_s: float, pad_s: float):
        plan = parts.plan
        self.parts, self.rounds, self.group, self.grace_s, self.pad_s = parts, rounds, group, grace_s, pad_s
        self.n = len(plan.nodes)
        self.need = quorum_need(plan.quorum.share, self.n)
        self.shares = node_shares(plan, parts.diloco.averaging)
        self.state = OuterState([parts.outer.global_flat.detach().to("cpu", copy=True)])
        self.standing = self.state.global_flat.clone()  # the model a pull gets
        self.version, self.pulled, self.arrived = 0, [0] * self.n, [0] * self.n
        self.marks = [0] * self.n  # each node's last reply's mark (the module doc)
        self.stopped = [False] * self.n  # past the stop cut: no longer coming
        self.cuts, self.cut, self.complete = Cuts(), 0, 0  # the run's cuts, the one resumed from, Cuts.complete
        self.recorded: dict[int, dict] = {}  # the server's part of each cut, until node 0 writes it
        self.record_lock = threading.Lock()
        self.waiting: dict[int, Push] = {}  # on-time nodes waiting for the close
        self.entries: list[Push] = []  # the pushes the next close merges
        self.deadline: float | None = None  # the grace window's end
        self.link_free = -math.inf  # the end of the last close's transfer
        self.due: list[tuple] = []  # heap of replies: (time, order, push, weights, stats)
        self.order = itertools.count()
        self.inbox: queue.Queue[Push] = queue.Queue()
        self.error: BaseException | None = None
        self.threads: list[threading.Thread] = []

    def set_cuts(self, cuts: Cuts) -> None:
        """The run's cuts, after a resume has restored the server and before it starts."""
        self.cuts, self.complete = cuts, cuts.resumed
        self.stopped = [past_stop(cuts, mark) for mark in self.marks]

    def start(self) -> None:
        """Start the coordinator and the receiver (once; after a resume has restored the server)."""
        if self.threads:
            return
        self.threads.append(threading.Thread(target=self._guard, args=(self._coordinate,), name="geodt-quorum",
                                             daemon=True))
        if self.n > 1:
            self.threads.append(threading.Thread(target=self._guard, args=(self._receive, list(self.arrived)),
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
        self.start()
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise self.error
        return self.state.global_flat

    def _guard(self, body, *args) -> None:
        try:
            body(*args)
        except BaseException as exc:  # raised again in the main thread by join() or hand_in()
            self.error = exc

    def _receive(self, received: list[int]) -> None:
        """The other leaders' pushes, until each has made its rounds (`received` counts them from the
        cut resumed from) or said it stopped at the stop cut."""
        plan = self.parts.plan
        params = self.state.global_flat.numel()
        ended = [False] * self.n
        while any(received[i] < self.rounds and not ended[i] for i in range(1, self.n)):
            header = torch.zeros(3, dtype=torch.int64)
            run_collective(dist.recv, header, group=self.group, tag=HEADER)  # from any node
            node = int(header[1])
            if header[2]:
                ended[node] = True
                continue
            wire = torch.empty(encoded_bytes(params, plan.payload_dtype), dtype=torch.uint8)
            run_collective(dist.recv, wire, src=plan.first_rank(node), group=self.group, tag=PAYLOAD)
            received[node] += 1
            self.inbox.put(Push(node, decode(wire, params, plan.payload_dtype), time.perf_counter()))

    def _finished(self) -> bool:
        """Every node has made its rounds (none waiting) or stopped at the stop cut."""
        return all(self.stopped[i] or (self.arrived[i] >= self.rounds and i not in self.waiting)
                   for i in range(self.n))

    def _coordinate(self) -> None:
        while (not self._finished() or self.due) and self.error is None:  # the receiver's failure ends it
            wake = min([t for t in (self.deadline, self.due[0][0] if self.due else None) if t is not None],
                       default=None)
            timeout = 0.5 if wake is None else min(0.5, max(0.0, wake - time.perf_counter()))
            if not self._finished():
                try:
                    push = self.inbox.get(timeout=timeout)
                except queue.Empty:
                    pass
                else:
                    self._arrive(push)
            elif timeout:
                time.sleep(timeout)
            if self.deadline is not None and time.perf_counter() >= self.deadline:
                self._close(sum(self.arrived) + 1)  # on the timer: after the last arrival's cut
            self._send_due()

    def _arrive(self, push: Push) -> None:
        node = push.node
        self.arrived[node] += 1
        mark = sum(self.arrived)  # this arrival's cut is taken once it is decided
        self.entries.append(push)
        if self.pulled[node] < self.version:  # late: the model standing, after the link's last close
            staleness = self.version - self.pulled[node]
            self.pulled[node] = self.version
            self._reply(push, max(push.at, self.link_free), staleness, mark)
        else:
            self.waiting[node] = push
        # The quorum counts the nodes that wait (simulator/engines/engine_async.py Quorum: late work rides on a close)
        coming = sum(1 for i in range(self.n)
                     if self.arrived[i] < self.rounds and i not in self.waiting and not self.stopped[i])
        waiting = len(self.waiting)
        if not coming:
            self._close(mark)
        elif waiting >= min(self.need, waiting + coming) and self.deadline is None:
            self.deadline = push.at + self.grace_s
        if self.cuts.between(mark - 1, mark):
            self._record(mark)

    def _close(self, mark: int) -> None:
        """Merge every push in, the outer step, and the replies to the nodes that waited."""
        self.deadline = None
        entries, self.entries = self.entries, []
        grad = entries[0].delta.clone()  # summed in place: no copy of every push at once
        for push in entries[1:]:
            grad.add_(push.delta)
        grad.div_(sum(self.shares[push.node] for push in entries))
        self.state.outer_step(grad, self.parts.diloco.outer_lr, self.parts.diloco.outer_momentum)
        self.version += 1
        self.standing = self.state.global_flat.clone()
        begin = max(time.perf_counter(), self.link_free)
        self.link_free = begin + self.pad_s
        for node, push in self.waiting.items():
            self.pulled[node] = self.version
            self._reply(push, begin, 0, mark)
        self.waiting.clear()

    def _reply(self, push: Push, begin: float, staleness: int, mark: int) -> None:
        node = push.node
        self.marks[node] = mark
        self.stopped[node] = past_stop(self.cuts, mark)
        self.complete = self.cuts.complete([m - 1 for m in self.marks])  # a node writes cut m at its next pull
        stats = torch.tensor([float(staleness), begin - push.at, self.pulled[node], mark, self.complete],
                             dtype=torch.float64)
        heapq.heappush(self.due, (begin, next(self.order), push, self.standing, stats))

    def _record(self, cut: int) -> None:
        """The server's part of `cut` (the module doc): a waiting node's push is left out, its node redoes it."""
        late = [push for push in self.entries if self.waiting.get(push.node) is not push]
        state = {"cut": cut, "theta": self.state.global_flat.clone(), "momentum": self.state.momentum.clone(),
                 "version": self.version, "pulled": list(self.pulled), "marks": list(self.marks),
                 "arrived": [count - (i in self.waiting) for i, count in enumerate(self.arrived)],
                 "late_nodes": [push.node for push in late], "late_deltas": [push.delta for push in late]}
        with self.record_lock:
            self.recorded[cut] = state

    def take_recorded(self, cut: int) -> dict:
        """The server's part of `cut`, handed over once (node 0 writes it beside its own part)."""
        with self.record_lock:
            return self.recorded.pop(cut)

    def load_state_dict(self, state: dict) -> None:
        """The server as a cut recorded it (`_record`), before it starts; ValueError when it does not fit this run."""
        theta = self.state.global_flat
        if state["theta"].shape != theta.shape or len(state["pulled"]) != self.n:
            raise ValueError(f"the server's checkpoint has {state['theta'].numel()} weights and "
                             f"{len(state['pulled'])} nodes; this run {theta.numel()} and {self.n}")
        theta.copy_(state["theta"])
        self.state.momentum.copy_(state["momentum"])
        self.standing = theta.clone()
        self.cut, self.version = int(state["cut"]), int(state["version"])
        self.pulled, self.arrived, self.marks = ([int(v) for v in state[key]] for key in ("pulled", "arrived", "marks"))
        now = time.perf_counter()  # a late push's time is no longer used: its reply went out before the cut
        self.entries = [Push(int(node), delta, now) for node, delta in zip(state["late_nodes"], state["late_deltas"],
                                                                           strict=True)]

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


class QuorumRound(ServerRound):
    """A quorum round (the module doc)."""

    marks_cuts = True
    counters = ("pulled_version", "mark", "complete")  # the closes pulled, the last reply's mark (module doc)

    def __init__(self, parts: NodeParts, rounds: int, timeout_s: float):
        super().__init__(parts, rounds, timeout_s, parts.coef / parts.divisor)  # the node's term of the average
        plan, opts = parts.plan, parts.opts
        scale = opts.time_scale if opts.emulate else 1.0
        self.pad_s = plan.comm_s * opts.time_scale if opts.emulate else 0.0
        if parts.groups.rank == self.server_rank:
            self.server = QuorumServer(parts, rounds, self.group, plan.quorum.grace_s * scale, self.pad_s)
        self.pushes = 0  # the pushes it has made

    def stopped(self) -> bool:
        """Whether this node is past the run's stop cut (does no more rounds)."""
        return past_stop(self.cuts, self.mark)

    def state_dict(self) -> dict:
        return {"pulled_version": self.pulled_version, "mark": self.mark, "pushes": self.pushes}

    def load_state_dict(self, state: dict) -> None:
        self.pulled_version, self.mark, self.pushes = (int(state[key]) for key in ("pulled_version", "mark", "pushes"))

    def _push_pull(self, r: int) -> tuple[int, float, int]:
        self.pushes += 1
        return super()._push_pull(r)

    def _header(self, r: int) -> list[int]:
        return [r, self.parts.groups.index, 0]

    def _serve_own(self, push: torch.Tensor) -> tuple[int, float]:
        return self._take_reply(*self.server.hand_in(push))

    def _after_pull(self, compute_end: float, server_s: float) -> None:
        if self.pad_s:  # the sync after the wait, its transfers included, padded as every emulated sync is
            sleep_until(compute_end + server_s + self.pad_s)

    def _split(self, sync_s: float, server_s: float) -> tuple[float, float]:
        # idle_s is the wait for the close (or the link's last close), the rest of the sync comm_s
        idle_s = min(max(0.0, server_s), sync_s)
        return idle_s, sync_s - idle_s

    def _leave(self) -> None:
        """A leader stopped at the stop cut before its last round says so to the server's receiver."""
        if self.group is not None and self.stopped() and self.pushes < self.rounds:
            run_collective(dist.send, torch.tensor([-1, self.parts.groups.index, 1], dtype=torch.int64),
                           dst=self.server_rank, group=self.group, tag=HEADER)
