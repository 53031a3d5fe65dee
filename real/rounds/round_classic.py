"""A DiLoCo round: H_i inner steps, the barrier, then the outer sync of the pseudo-gradients.

Per round, on the leader's clock (one trace.csv row per node, real/rounds/trace.py):
- compute_s: the H_i inner steps, intra-node gradient all-reduces included (synchronised on
  CUDA); under --emulate each step is padded to the plan's step_s × time_scale
  (real/rounds/rounds.py), and a step whose real compute overran its target is counted.
- idle_s: time blocked in a one-element all-reduce of every process (the barrier) before
  the sync: the wait for the slowest node.
- comm_s: pseudo-gradient, cross-node average (leaders, real/core/sync.py), broadcast in the node,
  outer step; under --emulate padded to the plan's comm_s × time_scale.
- bytes_sent: what the leader put on the wire in the cross-node average.
A sharded node (real/core/sharding.py) averages shard by shard, every process its own.
"""
from __future__ import annotations

import time

from real.core.options import run_collective, sleep_until
from real.core.sharding import sharded_average
from real.rounds.adaptive import round_weights
from real.rounds.rounds import NodeParts, Origin, Progress, Round, compute_phase, round_row


class ClassicRound(Round):
    """DiLoCo's round (the module doc)."""

    def __init__(self, parts: NodeParts):
        self.parts = parts
        # This node's averaging weight and the divisor: the plan's, or an adaptive round's own
        self.coef, self.divisor = parts.coef, parts.divisor

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        round_start, clock, _, compute_end = compute_phase(self.parts, bar)
        self.progress = Progress(round_start, clock, compute_end=compute_end)
        return self._sync(r, origin)

    retries_sync = True

    def retry_sync(self, r: int, origin: Origin) -> dict:
        """The barrier and the outer sync again, among a new membership (the inner steps kept)."""
        return self._sync(r, origin)

    def _sync(self, r: int, origin: Origin) -> dict:
        """The barrier, the outer sync, the round's trace row."""
        p, progress = self.parts, self.progress
        round_start, compute_end = progress.start, progress.compute_end
        if p.steps.adaptive is None:
            p.groups.barrier()
        else:  # the barrier carries every node's step time and steps (real/rounds/adaptive.py)
            self._adapt_at_barrier(compute_end - round_start)
        sync_start = progress.sync_start = time.perf_counter()
        sent = self._outer_sync()
        if p.opts.emulate:
            sleep_until(sync_start + p.plan.comm_s * p.opts.time_scale)
        sync_end = time.perf_counter()
        return round_row(p, r, origin, p.steps.loss_sum, progress.clock, compute_s=compute_end - round_start,
                         idle_s=sync_start - compute_end, comm_s=sync_end - sync_start, start=round_start,
                         end=sync_end, bytes_sent=sent)

    def _adapt_at_barrier(self, compute_s: float) -> None:
        """The adaptive barrier: agree on the next round, and weigh this round's pseudo-gradients
        by the tokens each node did (the plan's averaging, on this round's steps)."""
        p = self.parts
        steps = p.steps.adaptive.exchange(p.device, compute_s, p.steps.round_steps, p.members)
        p.groups.sync_device()
        self.coef, self.divisor = round_weights(p.plan, p.diloco.averaging, steps, p.members, p.groups.index)

    def _outer_sync(self) -> int:
        """Pseudo-gradient, cross-node average (leaders), broadcast in the node, outer step;
        returns the bytes this node sent."""
        p = self.parts
        groups, outer = p.groups, p.outer
        sent = 0
        if p.layout is not None:  # every process its own shard (real/core/sharding.py)
            outer.params = p.layout.local_tensors()
            delta = outer.pseudo_gradient(self.coef)
            sent = run_collective(sharded_average, p.layout, delta, p.cross, self.divisor, p.outer_device)
        else:
            if groups.is_leader:
                delta = outer.pseudo_gradient(self.coef)
                average, sent = run_collective(p.cross.average, delta, self.divisor)
                if average is not outer.delta:
                    outer.delta.copy_(average)
            groups.broadcast_in_node(outer.delta)
        outer.outer_step(outer.delta, p.diloco.outer_lr, p.diloco.outer_momentum)
        outer.load_into_model()
        groups.sync_device()
        return sent
