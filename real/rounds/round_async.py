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
The round's skeleton, the wire's `push_and_pull` and the cuts are shared with quorum rounds
(real/rounds/round_server.py ServerRound); this module is the server and what the push weighs.
Checkpoints are a consistent cut (Chandy–Lamport; real/checkpoint/checkpoint.py writes them): the server
records its state when its version (pushes applied) reaches a due cut (`Cuts`), and each reply
carries the server's version, so a node learns of the cut at its next pull after it and writes the
state it held at its last pull at or before the cut (pushes it made before the cut are in the
server's state, the one after is not). `Cuts.stop` ends the run at a cut (--stop-after R: the cut
after R·n pushes). What an async run does not do (sharded nodes, Streaming DiLoCo, --on-node-loss
continue) is refused in one line by real/process/launch.py check_async.
"""
from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from formats.wire import encoded_bytes
from real.core.diloco import DelayedNesterov
from real.core.options import run_collective, sleep_until
from real.core.sync import decode
from real.rounds.round_server import HEADER, PAYLOAD, STATS, WEIGHTS, Cuts, ServerRound
from real.rounds.rounds import NodeParts


class ParameterServer:
    """The global model, its delayed Nesterov state and each node's last pull, on rank 0."""

    def __init__(self, parts: NodeParts, pad_s: float | None, rounds: int, group):
        self.parts, self.pad_s, self.rounds, self.group = parts, pad_s, rounds, group
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

    def set_cuts(self, cuts: Cuts) -> None:
        """The run's cuts, after a resume has restored the server and before it starts."""
        self.cuts, self.complete = cuts, cuts.resumed

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

    def start(self) -> None:
        """Serve the other nodes' pushes in a thread, until each has done its rounds or passed the stop cut."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, args=(self.group,), name="geodt-server", daemon=True)
            self.thread.start()

    def join(self) -> torch.Tensor:
        """Wait for the last push (serving the others even when node 0 had no round left to run); the
        final global weights (a failure in the serving thread is raised here)."""
        self.start()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.theta

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


class AsyncRound(ServerRound):
    """Asynchronous DiLoCo's round (the module doc)."""

    def __init__(self, parts: NodeParts, rounds: int, timeout_s: float):
        # The push weighs Δ_i as the synchronous average would (c_i / D), times n: the server's
        # delayed Nesterov divides by its period n (real/core/diloco.py).
        super().__init__(parts, rounds, timeout_s, parts.coef * len(parts.plan.nodes) / parts.divisor)
        pad_s = parts.plan.comm_s * parts.opts.time_scale if parts.opts.emulate else None
        if parts.groups.rank == self.server_rank:
            self.server = ParameterServer(parts, pad_s, rounds, self.group)

    def stopped(self) -> bool:
        """Whether this node is past the run's stop cut (does no more rounds)."""
        return self.cuts.stopped(self.pulled_version)

    def state_dict(self) -> dict:
        return {"pulled_version": self.pulled_version}

    def load_state_dict(self, state: dict) -> None:
        self.pulled_version = int(state["pulled_version"])

    def _header(self, r: int) -> list[int]:
        return [r]

    def _serve_own(self, push: torch.Tensor) -> tuple[int, float]:
        with self.server.lock:
            start = time.perf_counter()
            staleness, service_s = self.server.apply(0, push, start)
            self.parts.outer.global_flat.copy_(self.server.theta)
            self.pulled_version, self.complete = self.server.version, self.server.complete
        return staleness, service_s

    def _split(self, sync_s: float, server_s: float) -> tuple[float, float]:
        # comm_s is the server's service of the push; the rest of the sync waited for other pushes
        return max(0.0, sync_s - server_s), min(server_s, sync_s)
