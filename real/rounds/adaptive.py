"""Adaptive rounds in the executor (plan adapt = rebalance | deadline): formats/adaptive.py's rules, run.

Every process of the run takes part in the barrier before the outer sync (real/core/groups.py's
one-element all-reduce). For an adaptive plan that same all-reduce carries, instead of one flag,
every node's mean step time and step count of the round just ended (2n float64; each of a node's
G processes adds 1/G of its node's figures). Afterwards every process holds the same numbers and
computes the same next round from them: rebalance's H_i, deadline's T, and the round's averaging
weights from the tokens each node did. No extra collective, no extra WAN round trip: the
barrier's latency is the same for 16 bytes and for 2n·8.

Under --on-node-loss continue (real/membership/members.py) a round's members are the current epoch's nodes,
and the barrier is over them: the next round is planned over the members only, at the plan's
samples per round K over ALL plan nodes (the survivors absorb a lost node's share: the global
batch stays constant as nodes come and go). Each node's estimate is its last round's mean step
time; a node that is gone keeps its last one, used again when it rejoins. Entering an epoch, the
members take the estimates (and this round's plan) from the member that broadcasts θ_g
(real/membership/membership.py agree), and every epoch after the first re-plans the coming round over its
members.

A deadline node of G > 1 devices takes a step only if all its devices would (the largest
elapsed time over them decides, one intra-node all-reduce per step), since they average
gradients every step. The first round's plan is the plan file's (the strategy made it with the
same rule from the planned step times).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from formats.adaptive import keep_stepping, rebalance_steps, round_time_s
from formats.plan import Plan
from real.core.diloco import averaging_weights
from real.core.options import run_collective


class AdaptiveRounds:
    """What this process's node does next round, agreed with every other process at each barrier."""

    def __init__(self, plan: Plan, index: int, scale: float = 1.0):
        """scale: the deadline's time scale (--emulate's time_scale; 1 otherwise)."""
        self.plan, self.mode, self.index, self.scale = plan, plan.adapt, index, scale
        self.n = len(plan.nodes)
        self.gpus = np.array([p.gpus for p in plan.nodes], dtype=float)
        self.units = np.array([p.batch_size * p.gpus for p in plan.nodes], dtype=float)
        self.samples = float(sum(p.local_steps * p.batch_size * p.gpus for p in plan.nodes))
        self.estimates = np.array([p.step_s for p in plan.nodes], dtype=float)  # t̂_i, scenario seconds
        self.steps = np.array([p.local_steps for p in plan.nodes], dtype=np.int64)  # this round's H_i
        self.deadline_s = float(round_time_s(self.estimates, self.units, self.samples))

    def wants_step(self, done: int, elapsed_s: float) -> bool:
        """Whether the node takes another inner step, having done `done` in `elapsed_s` this round."""
        if self.mode == "rebalance":
            return done < int(self.steps[self.index])
        return keep_stepping(elapsed_s, done, self.deadline_s * self.scale)

    def figures(self, device: torch.device, compute_s: float, steps: int) -> torch.Tensor:
        """This process's part of the barrier (2n float64): its node's (step_s, steps) in its own slots
        (1/G of them: the node's G processes sum), zeros elsewhere (a SUM or a MAX reads the same)."""
        figures = torch.zeros(2 * self.n, dtype=torch.float64, device=device)
        share = float(self.gpus[self.index])
        figures[self.index] = compute_s / steps / share
        figures[self.n + self.index] = steps / share
        return figures

    def take(self, values: np.ndarray, members: Sequence[int]) -> np.ndarray:
        """The barrier's reduced figures (2n): the members' estimates updated, the next round planned
        over them; returns the steps every node did (n; meaningful for the members only)."""
        m = list(members)
        self.estimates[m] = values[: self.n][m] / self.scale
        self.plan_round(m)
        return np.rint(values[self.n:]).astype(np.int64)

    def plan_round(self, members: Sequence[int]) -> None:
        """The next round over `members` at the plan's K: rebalance's H_i (of the members), or deadline's T."""
        m = list(members)
        if self.mode == "rebalance":
            self.steps[m] = rebalance_steps(self.estimates[m], self.units[m], self.samples)
        else:
            self.deadline_s = float(round_time_s(self.estimates[m], self.units[m], self.samples))

    def exchange(self, device: torch.device, compute_s: float, steps: int, members: Sequence[int]) -> np.ndarray:
        """The barrier of an adaptive round over the run's `members`: every node's (step_s, steps) of this
        round summed in one all-reduce; sets the next round's plan; returns the steps every node did (n,)."""
        figures = self.figures(device, compute_s, steps)
        run_collective(dist.all_reduce, figures)
        return self.take(figures.cpu().numpy(), members)

    def state(self) -> torch.Tensor:
        """What a member entering an epoch takes from the source member: estimates, H_i, T (2n + 1 float64)."""
        return torch.from_numpy(np.concatenate([self.estimates, self.steps.astype(float), [self.deadline_s]]))

    def entered(self, state: torch.Tensor, members: Sequence[int], replan: bool) -> None:
        """Entering an epoch: the source member's state(); after a membership change (replan), the
        coming round planned over the epoch's members from those estimates."""
        values = state.numpy()
        self.estimates = values[: self.n].copy()
        self.steps = np.rint(values[self.n: 2 * self.n]).astype(np.int64)
        self.deadline_s = float(values[-1])
        if replan:
            self.plan_round(members)


def round_weights(plan: Plan, averaging: str, done: np.ndarray, members: Sequence[int],
                  index: int) -> tuple[float, float]:
    """An adaptive round's averaging over its members: the plan's averaging rule (real/core/diloco.py) on the
    tokens each member did this round (done[i] steps); (this node's coefficient, the divisor)."""
    m = list(members)
    tokens = [int(done[i]) * plan.nodes[i].batch_size * plan.nodes[i].gpus * plan.seq_len for i in m]
    coefs, divisor = averaging_weights(averaging, tokens, [int(done[i]) for i in m])
    return coefs[m.index(index)], divisor

