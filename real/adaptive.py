"""Adaptive rounds in the executor (plan adapt = rebalance | deadline): formats/adaptive.py's rules, run.

Every process of the run takes part in the barrier before the outer sync (real/groups.py's
one-element all-reduce). For an adaptive plan that same all-reduce carries, instead of one flag,
every node's mean step time and step count of the round just ended (2n float64; each of a node's
G processes adds 1/G of its node's figures). Afterwards every process holds the same numbers and
computes the same next round from them: rebalance's H_i, deadline's T, and the round's averaging
weights from the tokens each node did. No extra collective, no extra WAN round trip: the
barrier's latency is the same for 16 bytes and for 2n·8.

A deadline node of G > 1 devices takes a step only if all its devices would (the largest
elapsed time over them decides, one intra-node all-reduce per step), since they average
gradients every step. The first round's plan is the plan file's (the strategy made it with the
same rule from the planned step times).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from formats.adaptive import keep_stepping, rebalance_steps, round_time_s
from formats.plan import Plan
from real.options import run_collective


class AdaptiveRounds:
    """What this process's node does next round, agreed with every other process at each barrier."""

    def __init__(self, plan: Plan, index: int):
        self.mode, self.index = plan.adapt, index
        self.n = len(plan.nodes)
        self.gpus = np.array([p.gpus for p in plan.nodes], dtype=float)
        self.units = np.array([p.batch_size * p.gpus for p in plan.nodes], dtype=float)
        self.samples = float(sum(p.local_steps * p.batch_size * p.gpus for p in plan.nodes))
        self.steps = np.array([p.local_steps for p in plan.nodes], dtype=np.int64)  # this round's H_i
        self.deadline_s = float(round_time_s([p.step_s for p in plan.nodes], self.units, self.samples))
        self.scale = 1.0  # the deadline's time scale (--emulate's time_scale)

    def wants_step(self, done: int, elapsed_s: float) -> bool:
        """Whether the node takes another inner step, having done `done` in `elapsed_s` this round."""
        if self.mode == "rebalance":
            return done < int(self.steps[self.index])
        return keep_stepping(elapsed_s, done, self.deadline_s * self.scale)

    def exchange(self, device: torch.device, compute_s: float, steps: int) -> np.ndarray:
        """The barrier of an adaptive round: every node's (step_s, steps) of this round summed in one
        all-reduce; sets the next round's plan; returns the steps every node did (n,)."""
        figures = torch.zeros(2 * self.n, dtype=torch.float64, device=device)
        share = float(self.gpus[self.index])
        figures[self.index] = compute_s / steps / share
        figures[self.n + self.index] = steps / share
        run_collective(dist.all_reduce, figures)
        values = figures.cpu().numpy()
        step_s, done = values[: self.n] / self.scale, np.rint(values[self.n:]).astype(np.int64)
        if self.mode == "rebalance":
            self.steps = rebalance_steps(step_s, self.units, self.samples)
        else:
            self.deadline_s = float(round_time_s(step_s, self.units, self.samples))
        return done
