"""Asynchronous DiLoCo's round (strategy `async`, issue 40): no barrier, a parameter server on rank 0.

Liu et al. 2024 (docs/PAPERS.md): node i runs its H_i inner steps, pushes its pseudo-gradient to the
server, which applies it at once (real/diloco.py DelayedNesterov), and pulls the new global weights;
nobody waits for anybody but the server. The server lives on rank 0, node 0's leader, beside node 0's
training: a thread serves the other leaders over a gloo group of its own, point to point, one node at
a time in the order their requests arrive (a receive from any source), and node 0 applies its own
pushes in its process. One lock makes the two one server, so a node's sync waits for the push being
served (the queue simulator/engine_async.py prices). Node 0's pushes cross no link: its comm_s is the
outer step alone, where the simulator prices every node's transfer too.

The wire, per push of node j, on the server group: a one-element header (the round), then j's
pseudo-gradient in the plan's payload dtype (real/sync.py encode; weighted as the synchronous average
weighs it, times n, so that uniform averaging pushes Δ_j itself), then from the server the fp32 global
weights and two figures: the push's staleness and the server's service seconds. Staleness: the global
updates applied between node j's last pull and this push (node j's own pull counts as its last).

Per round, on the leader's clock (trace.csv, real/trace.py, plus the column `staleness`):
- compute_s: the H_i inner steps, as in every round kind.
- comm_s: the server's service of this push (receive, outer step, send the weights), on the server's
  clock; under --emulate padded to the plan's comm_s × time_scale while holding the server, so that
  the others queue behind it as the simulator has them.
- idle_s: the rest of the sync: the wait while the server served other pushes.
- bytes_sent: the encoded pseudo-gradient (0 on node 0).
A node of several processes: its leader pushes and pulls, then broadcasts the weights in the node.
What an async run does not do (sharded nodes, checkpoints, --resume, --stop-after, --on-node-loss
continue) is refused in one line by real/launch.py check_async.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from formats.wire import encoded_bytes
from real.diloco import DelayedNesterov
from real.options import run_collective, sleep_until
from real.rounds import NodeParts, Origin, Round, compute_phase, round_row
from real.sync import decode, encode

HEADER, PAYLOAD, WEIGHTS, STATS = 0, 1, 2, 3  # message tags on the server group
EXTRA_COLUMNS = ["staleness"]  # trace.csv's column after the run columns (async runs only)


class ParameterServer:
    """The global model, its delayed Nesterov state and each node's last pull, on rank 0."""

    def __init__(self, parts: NodeParts, pad_s: float | None):
        self.parts, self.pad_s = parts, pad_s
        n = len(parts.plan.nodes)
        self.theta = parts.outer.global_flat.detach().to("cpu", copy=True)
        self.rule = DelayedNesterov(self.theta, period=n)
        self.version, self.pulled = 0, [0] * n
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def apply(self, node: int, push: torch.Tensor, start: float) -> tuple[int, float]:
        """Node `node`'s decoded push, applied (the caller holds the lock); returns (staleness,
        service seconds since `start`, padded under --emulate)."""
        staleness = self.version - self.pulled[node]
        self.rule.step(push, self.parts.diloco.outer_lr, self.parts.diloco.outer_momentum)
        self.version += 1
        self.pulled[node] = self.version
        if self.pad_s is not None:
            sleep_until(start + self.pad_s)
        return staleness, time.perf_counter() - start

    def start(self, group, pushes: int) -> None:
        """Serve `pushes` pushes of the other nodes in a thread."""
        self.thread = threading.Thread(target=self._serve, args=(group, pushes), name="geodt-server", daemon=True)
        self.thread.start()

    def join(self) -> None:
        """Wait for the last push; a failure in the serving thread is raised here."""
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error

    def _serve(self, group, pushes: int) -> None:
        plan = self.parts.plan
        params = self.theta.numel()
        try:
            for _ in range(pushes):
                header = torch.zeros(1, dtype=torch.int64)
                src = run_collective(dist.recv, header, group=group, tag=HEADER)  # from any node
                with self.lock:
                    start = time.perf_counter()
                    wire = torch.empty(encoded_bytes(params, plan.payload_dtype), dtype=torch.uint8)
                    run_collective(dist.recv, wire, src=src, group=group, tag=PAYLOAD)
                    staleness, _ = self.apply(plan.node_of_rank(src), decode(wire, params, plan.payload_dtype), start)
                    run_collective(dist.send, self.theta, dst=src, group=group, tag=WEIGHTS)
                    service_s = time.perf_counter() - start
                stats = torch.tensor([float(staleness), service_s], dtype=torch.float64)
                run_collective(dist.send, stats, dst=src, group=group, tag=STATS)
        except BaseException as exc:  # raised again in the main thread by join()
            self.error = exc


class AsyncRound(Round):
    """Asynchronous DiLoCo's round (the module doc)."""

    extra_columns = tuple(EXTRA_COLUMNS)

    def __init__(self, parts: NodeParts, rounds: int, timeout_s: float):
        self.parts = parts
        plan, groups = parts.plan, parts.groups
        n = len(plan.nodes)
        # The push weighs Δ_i as the synchronous average would (c_i / D), times n: the server's
        # delayed Nesterov divides by its period n (real/diloco.py).
        self.push_scale = parts.coef * n / parts.divisor
        self.server_rank = plan.first_rank(0)
        # Every process creates the group, as torch.distributed requires; only leaders use it.
        group = dist.new_group([plan.first_rank(i) for i in range(n)], timeout=timedelta(seconds=timeout_s),
                               backend="gloo")
        self.group = group if groups.is_leader else None
        pad_s = plan.comm_s * parts.opts.time_scale if parts.opts.emulate else None
        self.server = ParameterServer(parts, pad_s) if groups.rank == self.server_rank else None
        if self.server is not None:
            self.server.start(self.group, rounds * (n - 1))

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        p = self.parts
        round_start, clock, loss_sum, compute_end = compute_phase(p, bar)
        staleness, service_s, sent = self._push_pull(r) if p.groups.is_leader else (0, 0.0, 0)
        p.groups.broadcast_in_node(p.outer.global_flat)
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
        the new global weights land in outer.global_flat."""
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
            return staleness, service_s, 0
        server, group = self.server_rank, self.group
        run_collective(dist.send, torch.tensor([r], dtype=torch.int64), dst=server, group=group, tag=HEADER)
        run_collective(dist.send, wire, dst=server, group=group, tag=PAYLOAD)
        weights = torch.empty(outer.global_flat.numel(), dtype=torch.float32)
        run_collective(dist.recv, weights, src=server, group=group, tag=WEIGHTS)
        stats = torch.zeros(2, dtype=torch.float64)
        run_collective(dist.recv, stats, src=server, group=group, tag=STATS)
        outer.global_flat.copy_(weights)
        return int(stats[0]), float(stats[1]), wire.numel()

    def close(self) -> None:
        """Rank 0: wait for the others' last pushes, then hold the final global model (the run's
        final weights) in its model."""
        if self.server is None:
            return
        self.server.join()
        self.parts.outer.global_flat.copy_(self.server.theta)
        self.parts.outer.load_into_model()
