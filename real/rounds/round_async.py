"""Asynchronous DiLoCo's round (strategy `async`, issue 40): no barrier, a parameter server on rank 0.

Liu et al. 2024 (docs/PAPERS.md): node i runs its H_i inner steps, pushes its pseudo-gradient to the
server, which applies it at once (real/core/diloco.py DelayedNesterov), and pulls the new global weights;
nobody waits for anybody but the server. The server lives on rank 0, node 0's leader, beside node 0's
training: a thread serves the other leaders over a gloo group of its own, point to point, one node at
a time in the order their requests arrive (a receive from any source), and node 0 applies its own
pushes in its process. One lock makes the two one server, so a node's sync waits for the push being
served (the queue simulator/engines/engine_async.py prices). Node 0's pushes cross no link: its comm_s is the
outer step alone, where the simulator prices every node's transfer too.

The wire, per push of node j, on the server group: a one-element header (the round), then j's
pseudo-gradient in the plan's payload dtype (real/core/sync.py encode; weighted as the synchronous average
weighs it, times n, so that uniform averaging pushes Δ_j itself), then from the server the fp32 global
weights and four figures: the push's staleness, the server's service seconds, its version after the
push (the node's pull) and the newest cut every node has written its part of. Staleness: the global
updates applied between node j's last pull and this push (node j's own pull counts as its last).

Per round, on the leader's clock (trace.csv, real/rounds/trace.py, plus the column `staleness`):
- compute_s: the H_i inner steps, as in every round kind.
- comm_s: the server's service of this push (receive, outer step, send the weights), on the server's
  clock; under --emulate padded to the plan's comm_s × time_scale while holding the server, so that
  the others queue behind it as the simulator has them.
- idle_s: the rest of the sync: the wait while the server served other pushes.
- bytes_sent: the encoded pseudo-gradient (0 on node 0).
A node of several processes: its leader pushes and pulls, then broadcasts the weights in the node.
Checkpoints are a consistent cut (Chandy–Lamport; real/checkpoint/checkpoint.py writes them): the server
records its state when its version (pushes applied) reaches a due cut (`Cuts`), and each reply
carries the server's version, so a node learns of the cut at its next pull after it and writes the
state it held at its last pull at or before the cut (pushes it made before the cut are in the
server's state, the one after is not). `Cuts.stop` ends the run at a cut (--stop-after R: the cut
after R·n pushes). What an async run does not do (sharded nodes, Streaming DiLoCo, --on-node-loss
continue) is refused in one line by real/process/launch.py check_async.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from formats.wire import encoded_bytes
from real.core.diloco import DelayedNesterov
from real.core.options import run_collective, sleep_until
from real.core.sync import decode, encode
from real.rounds.rounds import NodeParts, Origin, Round, compute_phase, round_row

HEADER, PAYLOAD, WEIGHTS, STATS = 0, 1, 2, 3  # message tags on the server group
STALENESS_COLUMNS = ("staleness",)  # trace.csv's column after the run columns (rounds without a barrier)


def push_and_pull(header: list[int], wire: torch.Tensor, params: int, stats_len: int, server: int,
                  group) -> tuple[torch.Tensor, torch.Tensor]:
    """A leader's push to the server on rank `server` (its header, then its encoded pseudo-gradient)
    and its pull: (the fp32 global weights, the reply's `stats_len` float64 figures). The wire of
    both rounds without a barrier (this module and real/rounds/round_quorum.py)."""
    run_collective(dist.send, torch.tensor(header, dtype=torch.int64), dst=server, group=group, tag=HEADER)
    run_collective(dist.send, wire, dst=server, group=group, tag=PAYLOAD)
    weights = torch.empty(params, dtype=torch.float32)
    run_collective(dist.recv, weights, src=server, group=group, tag=WEIGHTS)
    stats = torch.zeros(stats_len, dtype=torch.float64)
    run_collective(dist.recv, stats, src=server, group=group, tag=STATS)
    return weights, stats


@dataclass(frozen=True)
class Cuts:
    """When an async run's consistent cuts are due, in server versions (pushes applied; the cut at V
    is the state right after the V-th push), chosen by real/checkpoint/checkpoint.py async_cuts."""

    due: tuple[int, ...] = ()  # sorted versions, each after `resumed`
    stop: int | None = None    # the version the run stops at (--stop-after), or None
    resumed: int = 0           # the cut this run resumed from (0: the run's start)

    def between(self, low: int, high: int) -> list[int]:
        """The due cuts V with low < V <= high."""
        return list(self.due[bisect.bisect_right(self.due, low):bisect.bisect_right(self.due, high)])

    def complete(self, pulled: list[int]) -> int:
        """The newest due cut every node has pulled past (so has written its part of; 0: none yet)."""
        done = self.between(self.resumed, min(pulled))
        return done[-1] if done else self.resumed

    def stopped(self, version: int) -> bool:
        """Whether a node whose last pull was at `version` is past the stop cut (does no more rounds)."""
        return self.stop is not None and max(version, self.resumed) >= self.stop


class ParameterServer:
    """The global model, its delayed Nesterov state and each node's last pull, on rank 0."""

    def __init__(self, parts: NodeParts, pad_s: float | None, rounds: int):
        self.parts, self.pad_s, self.rounds = parts, pad_s, rounds
        n = len(parts.plan.nodes)
        self.theta = parts.outer.global_flat.detach().to("cpu", copy=True)
        self.rule = DelayedNesterov(self.theta, period=n)
        self.version, self.pulled, self.pushes = 0, [0] * n, [0] * n
        self.cuts = Cuts()
        self.recorded: dict[int, dict] = {}  # the server's state at each cut, until node 0 writes it
        self.complete = 0  # Cuts.complete of the pulls so far
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def apply(self, node: int, push: torch.Tensor, start: float) -> tuple[int, float]:
        """Node `node`'s decoded push, applied (the caller holds the lock); returns (staleness,
        service seconds since `start`, padded under --emulate). At a due cut, the state is recorded."""
        staleness = self.version - self.pulled[node]
        self.rule.step(push, self.parts.diloco.outer_lr, self.parts.diloco.outer_momentum)
        self.version += 1
        self.pulled[node] = self.version
        self.pushes[node] += 1
        if self.cuts.between(self.version - 1, self.version):
            self.recorded[self.version] = {key: value.clone() if isinstance(value, torch.Tensor) else value
                                           for key, value in self.state_dict().items()}
        self.complete = self.cuts.complete(self.pulled)
        if self.pad_s is not None:
            sleep_until(start + self.pad_s)
        return staleness, time.perf_counter() - start

    def state_dict(self) -> dict:
        """What a cut holds of the server (live tensors: `apply` clones them)."""
        return {"theta": self.theta, "momentum": self.rule.momentum, "buffer": self.rule.buffer,
                "rule_pushes": self.rule.pushes, "version": self.version, "pulled": list(self.pulled),
                "pushes": list(self.pushes)}

    def load_state_dict(self, state: dict) -> None:
        """The server as a cut recorded it; ValueError when it does not fit this run."""
        if state["theta"].shape != self.theta.shape or len(state["pulled"]) != len(self.pulled):
            raise ValueError(f"the server's checkpoint has {state['theta'].numel()} weights and "
                             f"{len(state['pulled'])} nodes; this run {self.theta.numel()} and {len(self.pulled)}")
        for key, tensor in (("theta", self.theta), ("momentum", self.rule.momentum), ("buffer", self.rule.buffer)):
            tensor.copy_(state[key])
        self.rule.pushes, self.version = int(state["rule_pushes"]), int(state["version"])
        self.pulled, self.pushes = [int(v) for v in state["pulled"]], [int(v) for v in state["pushes"]]

    def take_recorded(self, cut: int) -> dict:
        """The server's state at `cut`, handed over once (node 0 writes it beside its own part)."""
        with self.lock:
            return self.recorded.pop(cut)

    def start(self, group) -> None:
        """Serve the other nodes' pushes in a thread, until each has done its rounds or passed the stop cut."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, args=(group,), name="geodt-server", daemon=True)
            self.thread.start()

    def join(self) -> None:
        """Wait for the last push; a failure in the serving thread is raised here."""
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error

    def _others_done(self) -> bool:
        # Only this thread changes the other nodes' entries: read without the lock.
        return all(self.pushes[i] >= self.rounds or self.cuts.stopped(self.pulled[i])
                   for i in range(1, len(self.pulled)))

    def _serve(self, group) -> None:
        plan = self.parts.plan
        params = self.theta.numel()
        try:
            while not self._others_done():
                header = torch.zeros(1, dtype=torch.int64)
                src = run_collective(dist.recv, header, group=group, tag=HEADER)  # from any node
                with self.lock:
                    start = time.perf_counter()
                    wire = torch.empty(encoded_bytes(params, plan.payload_dtype), dtype=torch.uint8)
                    run_collective(dist.recv, wire, src=src, group=group, tag=PAYLOAD)
                    staleness, _ = self.apply(plan.node_of_rank(src), decode(wire, params, plan.payload_dtype), start)
                    run_collective(dist.send, self.theta, dst=src, group=group, tag=WEIGHTS)
                    service_s = time.perf_counter() - start
                    version, complete = self.version, self.complete
                stats = torch.tensor([staleness, service_s, version, complete], dtype=torch.float64)
                run_collective(dist.send, stats, dst=src, group=group, tag=STATS)
        except BaseException as exc:  # raised again in the main thread by join()
            self.error = exc


class AsyncRound(Round):
    """Asynchronous DiLoCo's round (the module doc)."""

    extra_columns = STALENESS_COLUMNS

    def __init__(self, parts: NodeParts, rounds: int, timeout_s: float):
        self.parts = parts
        plan, groups = parts.plan, parts.groups
        n = len(plan.nodes)
        # The push weighs Δ_i as the synchronous average would (c_i / D), times n: the server's
        # delayed Nesterov divides by its period n (real/core/diloco.py).
        self.push_scale = parts.coef * n / parts.divisor
        self.server_rank = plan.first_rank(0)
        # Every process creates the group, as torch.distributed requires; only leaders use it.
        group = dist.new_group([plan.first_rank(i) for i in range(n)], timeout=timedelta(seconds=timeout_s),
                               backend="gloo")
        self.group = group if groups.is_leader else None
        pad_s = plan.comm_s * parts.opts.time_scale if parts.opts.emulate else None
        # Serving starts with the first round (or at close), after a resume has restored the server.
        self.server = ParameterServer(parts, pad_s, rounds) if groups.rank == self.server_rank else None
        self.cuts = Cuts()
        self.pulled_version = 0  # the server's version at this node's last pull
        self.complete = 0        # the newest cut every node has written its part of, as the last reply said

    def set_cuts(self, cuts: Cuts) -> None:
        """The run's cuts (real/checkpoint/checkpoint.py begin), before the first round."""
        self.cuts, self.complete = cuts, cuts.resumed
        if self.server is not None:
            self.server.cuts, self.server.complete = cuts, cuts.resumed

    def stopped(self) -> bool:
        """Whether this node is past the run's stop cut (does no more rounds)."""
        return self.cuts.stopped(self.pulled_version)

    def state_dict(self) -> dict:
        return {"pulled_version": self.pulled_version}

    def load_state_dict(self, state: dict) -> None:
        self.pulled_version = int(state["pulled_version"])

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        p = self.parts
        if self.server is not None:
            self.server.start(self.group)
        round_start, clock, loss_sum, compute_end = compute_phase(p, bar)
        staleness, service_s, sent = self._push_pull(r) if p.groups.is_leader else (0, 0.0, 0)
        p.groups.broadcast_in_node(p.outer.global_flat)
        if p.me.gpus > 1:  # the node's other processes stop at the stop cut with their leader
            versions = torch.tensor([self.pulled_version, self.complete], dtype=torch.int64)
            p.groups.broadcast_in_node(versions)
            self.pulled_version, self.complete = (int(v) for v in versions.tolist())
        p.outer.load_into_model()
        p.groups.sync_device()
        sync_end = time.perf_counter()
        sync_s = sync_end - compute_end
        row = round_row(p, r, origin, loss_sum, clock, compute_s=compute_end - round_start,
                        idle_s=max(0.0, sync_s - service_s), comm_s=min(service_s, sync_s),
                        start=round_start, end=sync_end, bytes_sent=sent)
        row["staleness"] = staleness
        return row

    def _push_pull(self, r: int) -> tuple[int, float, int]:
        """The leader's push of round r and its pull: (staleness, service seconds, bytes sent);
        the new global weights land in outer.global_flat, the server's version in pulled_version."""
        p = self.parts
        outer, dtype = p.outer, p.plan.payload_dtype
        delta = outer.pseudo_gradient(self.push_scale).cpu()
        wire = encode(delta, dtype)
        if self.server is not None:  # node 0: the server is in this process
            push = decode(wire, delta.numel(), dtype)
            with self.server.lock:
                start = time.perf_counter()
                staleness, service_s = self.server.apply(0, push, start)
                outer.global_flat.copy_(self.server.theta)
                self.pulled_version, self.complete = self.server.version, self.server.complete
            return staleness, service_s, 0
        weights, stats = push_and_pull([r], wire, outer.global_flat.numel(), 4, self.server_rank, self.group)
        outer.global_flat.copy_(weights)
        self.pulled_version, self.complete = int(stats[2]), int(stats[3])
        return int(stats[0]), float(stats[1]), wire.numel()

    def close(self) -> None:
        """Rank 0: wait for the others' last pushes (serving them even when node 0 had no round
        left to run), then hold the final global model (the run's final weights) in its model."""
        if self.server is None:
            return
        self.server.start(self.group)
        self.server.join()
        self.parts.outer.global_flat.copy_(self.server.theta)
        self.parts.outer.load_into_model()
