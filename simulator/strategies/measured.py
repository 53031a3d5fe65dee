"""Strategies from t_i(b) itself (profiles where measured, else the catalog estimate).

They balance what the nodes really take per step, not their datasheets. Both keep the
slowest node (largest t_i(b) at the baseline batch) at the baseline b and H, so the round
is never longer than the baseline's, and round so that no other node becomes slower.
"""
from __future__ import annotations

import math

from simulator.strategies import node_plan, register, uniform_plan

EPS = 1e-12


@register("measured-steps")
def measured_steps(scenario, timings):
    """H_i = floor(H × t_slow(b) / t_i(b)): the most whole steps that end no later than the slowest node."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    step = [t.step_s(b) for t in timings]
    target_s = h * max(step)
    return uniform_plan("measured-steps", scenario,
                        [node_plan(t, b, max(1, math.floor(target_s / s + EPS))) for t, s in zip(timings, step)])


def largest_batch_within(timing, target_s: float, lo: int, hi: int) -> int:
    """Largest b in [lo, hi] with t(b) <= target_s (t is increasing in b); lo if none."""
    if timing.step_s(lo) > target_s * (1 + EPS):
        return lo
    while hi > lo:
        mid = (lo + hi + 1) // 2
        if timing.step_s(mid) <= target_s * (1 + EPS):
            lo = mid
        else:
            hi = mid - 1
    return lo


@register("measured-batch")
def measured_batch(scenario, timings):
    """b_i = the largest batch that fits in memory with t_i(b_i) <= t_slow(b); H unchanged."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    target_s = max(t.step_s(b) for t in timings)
    plans = []
    for timing in timings:
        limit = max(b, timing.max_batch())
        plans.append(node_plan(timing, largest_batch_within(timing, target_s, b, limit), h))
    return uniform_plan("measured-batch", scenario, plans)
