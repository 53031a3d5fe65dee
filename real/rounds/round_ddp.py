"""A synchronous data-parallel round (plans with sync = gradients, the sync-ddp strategy).

After every step's backward each device scales its gradients by b/B (B = Σ G_i·b_i, so the
result is the gradient of the global batch's mean loss), the node all-reduces them, the
leaders average across nodes (real/core/sync.py: the plan's collectives and payloads), the leader
broadcasts in the node, and every device applies its own AdamW step to identical gradients;
no outer step. Per round (one trace.csv row per node), compute_s is the round minus idle_s
(barrier waits before each cross-node average) and comm_s (the averages and broadcasts);
under --emulate each step's compute is padded to step_s and each average to comm_s.
"""
from __future__ import annotations

import time

import torch

from real.core.options import run_collective, sleep_until
from real.core.sharding import peak_memory_reset
from real.rounds.rounds import NodeParts, Origin, Progress, Round, RoundClock, round_row


class GradientRound(Round):
    """Synchronous data parallel: H steps, each ending in a global gradient average (the hook)."""

    def __init__(self, parts: NodeParts):
        self.parts = parts
        self.clock = RoundClock()  # the running round's, read by the hook

    def run(self, r: int, origin: Origin, bar=None) -> dict:
        p = self.parts
        peak_memory_reset(p.device)
        round_start = time.perf_counter()
        clock = self.clock = RoundClock(deadline=round_start)
        self.progress = Progress(round_start, clock)
        loss_sum = p.steps.run(clock, self._global_grad_sync, bar)
        p.outer.capture()  # checkpoints and the resume check read θ_g
        p.groups.sync_device()
        end = time.perf_counter()
        return round_row(p, r, origin, loss_sum, clock, compute_s=end - round_start - clock.idle_s - clock.comm_s,
                         idle_s=clock.idle_s, comm_s=clock.comm_s, start=round_start, end=end,
                         bytes_sent=clock.bytes_sent)

    def _global_grad_sync(self, model: torch.nn.Module) -> None:
        """The global batch's gradient on every device (see the module doc)."""
        p, clock = self.parts, self.clock
        opts, groups = p.opts, p.groups
        for param in model.parameters():  # every device sends the same layout, unused weights too
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        grads = [param.grad for param in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(p.grad_scale)
        groups.node_sum(flat)
        if opts.emulate:
            groups.sync_device()
            target = p.me.step_s * opts.time_scale * p.steps.drift_factor
            if time.perf_counter() - clock.step_start > target:
                clock.overruns += 1
            sleep_until(clock.step_start + target)
        groups.sync_device()
        wait_start = time.perf_counter()
        groups.barrier()
        sync_start = time.perf_counter()
        if groups.is_leader:
            average, sent = run_collective(p.cross.average, flat, 1.0)
            if average is not flat:
                flat.copy_(average)
            clock.bytes_sent += sent
        groups.broadcast_in_node(flat)
        groups.sync_device()
        if opts.emulate:
            sleep_until(sync_start + p.plan.comm_s * opts.time_scale)
        sync_end = time.perf_counter()
        clock.idle_s += sync_start - wait_start
        clock.comm_s += sync_end - sync_start
        for g, chunk in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(chunk.view_as(g))
