"""What the rounds without a barrier share: a parameter server on rank 0, the wire to it, its cuts.

Asynchronous DiLoCo (real/rounds/round_async.py) and quorum rounds (real/rounds/round_quorum.py)
run the same round around different servers: the leaders' group of their own (gloo, point to
point), the node's inner steps, the leader's push of its pseudo-gradient and its pull of the global
weights and the reply's figures (`push_and_pull`; node 0 hands its push to the server in its own
process), the weights and the reply's counters broadcast in a node of several processes, and the
trace row with its `staleness`. `ServerRound` is that round; a kind says what its push weighs, how
its server is built, how node 0 is served, which counters a reply carries and how a sync's time
splits into idle_s and comm_s. Checkpoints of both are consistent cuts (`Cuts`, chosen by
real/checkpoint/checkpoint.py async_cuts).
"""
from __future__ import annotations

import bisect
import time
from abc import abstractmethod
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from real.core.options import run_collective
from real.core.sync import decode, encode
from real.rounds.rounds import NodeParts, Origin, Round, compute_phase, round_row

HEADER, PAYLOAD, WEIGHTS, STATS = 0, 1, 2, 3  # message tags on the server group
STALENESS_COLUMNS = ("staleness",)  # trace.csv's column after the run columns (rounds without a barrier)


def push_and_pull(header: list[int], wire: torch.Tensor, params: int, stats_len: int, server: int,
                  group) -> tuple[torch.Tensor, torch.Tensor]:
    """A leader's push to the server on rank `server` (its header, then its encoded pseudo-gradient)
    and its pull: (the fp32 global weights, the reply's `stats_len` float64 figures). The wire of
    both rounds without a barrier."""
    run_collective(dist.send, torch.tensor(header, dtype=torch.int64), dst=server, group=group, tag=HEADER)
    run_collective(dist.send, wire, dst=server, group=group, tag=PAYLOAD)
    weights = torch.empty(params, dtype=torch.float32)
    run_collective(dist.recv, weights, src=server, group=group, tag=WEIGHTS)
    stats = torch.zeros(stats_len, dtype=torch.float64)
    run_collective(dist.recv, stats, src=server, group=group, tag=STATS)
    return weights, stats


@dataclass(frozen=True)
class Cuts:
    """When a run's consistent cuts are due, in server versions (pushes applied, or arrivals taken in
    under quorum; the cut at V is the state right after the V-th), chosen by
    real/checkpoint/checkpoint.py async_cuts."""

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


class ServerRound(Round):
    """A round without a barrier (the module doc). The server, on rank 0 only (None elsewhere), has
    start() (idempotent), join() -> the final global weights, set_cuts(cuts), take_recorded(cut)
    and load_state_dict(state)."""

    extra_columns = STALENESS_COLUMNS
    # The reply's figures after (staleness, server seconds), in order: kept by the round, broadcast in
    # the node; pulled_version (the server's version at this node's last pull) and complete (the
    # newest cut every node has written its part of) first and last.
    counters: tuple[str, ...] = ("pulled_version", "complete")
    # Whether a reply's mark names the cut it belongs to, which may not be taken yet (quorum: written at the
    # next pull or at the end, real/checkpoint/checkpoint.py), rather than the version it pulled (async)
    marks_cuts: bool = False

    @classmethod
    def for_node(cls, parts: NodeParts, streaming, rounds: int) -> ServerRound:
        """`rounds` pushes per node, the collective timeout the run's."""
        return cls(parts, rounds, parts.opts.collective_timeout_s())

    def __init__(self, parts: NodeParts, rounds: int, timeout_s: float, push_scale: float):
        self.parts, self.rounds, self.push_scale = parts, rounds, push_scale
        plan, groups = parts.plan, parts.groups
        n = len(plan.nodes)
        self.server_rank = plan.first_rank(0)
        # Every process creates the group, as torch.distributed requires; only leaders use it.
        group = dist.new_group([plan.first_rank(i) for i in range(n)], timeout=timedelta(seconds=timeout_s),
                               backend="gloo")
        self.group = group if groups.is_leader else None
        self.server = None  # the kind's server on rank 0, built by the kind once the group is made
        self.cuts = Cuts()
        for name in self.counters:
            setattr(self, name, 0)

    def set_cuts(self, cuts: Cuts) -> None:
        """The run's cuts (real/checkpoint/checkpoint.py begin), before the first round."""
        self.cuts, self.complete = cuts, cuts.resumed
        if self.server is not None:
            self.server.set_cuts(cuts)

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        p = self.parts
        if self.server is not None:  # serving starts here (or at close), after a resume restored the server
            self.server.start()
        round_start, clock, loss_sum, compute_end = compute_phase(p, bar)
        staleness, server_s, sent = self._push_pull(r) if p.groups.is_leader else (0, 0.0, 0)
        self._after_pull(compute_end, server_s)
        p.groups.broadcast_in_node(p.outer.global_flat)
        if p.me.gpus > 1:  # the node's other processes stop at the stop cut with their leader
            counters = torch.tensor([getattr(self, name) for name in self.counters], dtype=torch.int64)
            p.groups.broadcast_in_node(counters)
            for name, value in zip(self.counters, counters.tolist(), strict=True):
                setattr(self, name, int(value))
        p.outer.load_into_model()
        p.groups.sync_device()
        sync_end = time.perf_counter()
        idle_s, comm_s = self._split(sync_end - compute_end, server_s)
        row = round_row(p, r, origin, loss_sum, clock, compute_s=compute_end - round_start, idle_s=idle_s,
                        comm_s=comm_s, start=round_start, end=sync_end, bytes_sent=sent)
        row["staleness"] = staleness
        return row

    def _push_pull(self, r: int) -> tuple[int, float, int]:
        """The leader's push of round r and its pull: (staleness, server seconds, bytes sent); the new
        global weights land in outer.global_flat, the reply's counters in this round's attributes."""
        p = self.parts
        outer, dtype = p.outer, p.plan.payload_dtype
        delta = outer.pseudo_gradient(self.push_scale).cpu()
        wire = encode(delta, dtype)
        if self.server is not None:  # node 0: the server is in this process
            staleness, server_s = self._serve_own(decode(wire, delta.numel(), dtype))
            return staleness, server_s, 0
        weights, stats = push_and_pull(self._header(r), wire, outer.global_flat.numel(), 2 + len(self.counters),
                                       self.server_rank, self.group)
        staleness, server_s = self._take_reply(weights, stats)
        return staleness, server_s, wire.numel()

    def _take_reply(self, weights: torch.Tensor, stats: torch.Tensor) -> tuple[int, float]:
        """A reply's weights into outer.global_flat, its counters kept; (staleness, server seconds)."""
        self.parts.outer.global_flat.copy_(weights)
        for name, value in zip(self.counters, stats[2:].tolist(), strict=True):
            setattr(self, name, int(value))
        return int(stats[0]), float(stats[1])

    def close(self) -> None:
        """Rank 0: wait for the others' last pushes (served even when node 0 had no round left to
        run), then hold the final global model (the run's final weights) in its model; the other
        leaders say what the kind's server needs to hear at the end (`_leave`)."""
        if self.server is None:
            self._leave()
            return
        self.parts.outer.global_flat.copy_(self.server.join())
        self.parts.outer.load_into_model()

    @abstractmethod
    def _header(self, r: int) -> list[int]:
        """The push's header on the wire."""

    @abstractmethod
    def _serve_own(self, push: torch.Tensor) -> tuple[int, float]:
        """Node 0's decoded push, served in this process: (staleness, server seconds); the new
        weights land in outer.global_flat, the counters in this round's attributes."""

    @abstractmethod
    def _split(self, sync_s: float, server_s: float) -> tuple[float, float]:
        """The sync's seconds (from the compute's end) as (idle_s, comm_s), given the reply's server seconds."""

    def _after_pull(self, compute_end: float, server_s: float) -> None:
        """Anything the kind does after the pull, before the weights are broadcast in the node (nothing)."""

    def _leave(self) -> None:
        """A leader's (or another process's) last word to the server at close (nothing)."""
