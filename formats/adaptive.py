"""Rounds that re-plan themselves while they run: the rules of plans with adapt = rebalance | deadline.

One implementation for the simulator (simulator/models/adaptive.py, which predicts them) and the
executor (real/rounds/adaptive.py, which runs them), so both take the same decisions from the same
numbers. Torch-free; numpy, vectorised over the last axis (nodes), any leading axes.

Both keep a round's work at the plan's samples per round K = Σ_i H_i·b_i·G_i (the strategy made
the plan at the baseline's tokens per round) and decide from each node's step time as measured:
before round 0 the plan's step_s, before round r the mean step time of the node's round r − 1
(its compute_s / its steps; a round already averages H_i steps' jitter, and a longer window
would lag a step change by as many rounds).

The round time T(t̂) = the least T with Σ_i u_i·⌊T / t̂_i⌋ ≥ K (u_i = b_i·G_i samples per step):
the shortest compute phase in which the nodes, at their estimated speeds, do the round's work.
- rebalance: before each round, H_i = max(1, ⌊T / t̂_i⌋); every node finishes within one of its
  own steps of T (idle below one step per node when the estimates hold), b_i stays the plan's
  (a new batch would need its step time measured first; the strategy chose b_i where memory allows).
- deadline: every node runs inner steps until T (the round's deadline, counted from its own
  round start), then syncs: after k steps taking e seconds it takes another while e + e/k ≤ T
  (its mean step this round as the estimate of the next). Work per node then follows its speed
  within the round, tokens vary; averaging by tokens weighs each node by what it did.
"""
from __future__ import annotations

import numpy as np

ADAPTIVE = ("rebalance", "deadline")
BISECTION_STEPS = 64  # halves [lower bound, lower bound + slowest step] down to float64's resolution
# A deadline round's T is a whole number of some node's steps; e + e/k sums k equal floats and may
# land an ulp past it: a relative slack far below any measured time keeps that node's last step.
DEADLINE_SLACK = 1e-9


def capacity(time_s, step_s, units) -> np.ndarray:
    """Σ_i u_i·⌊T / t_i⌋: the samples the nodes finish within T."""
    t = np.asarray(time_s, dtype=float)[..., None]
    return (np.asarray(units) * np.floor(t / step_s)).sum(axis=-1)


def round_time_s(step_s, units, samples) -> np.ndarray:
    """T: the least compute time per round whose capacity reaches `samples` (module docstring).

    T lies in [K / Σ u_i/t_i, that + max t_i] (⌊x⌋ > x − 1); bisection keeps capacity(hi) ≥ K."""
    step_s, units = np.asarray(step_s, dtype=float), np.asarray(units, dtype=float)
    samples = np.asarray(samples, dtype=float)
    lo = samples / (units / step_s).sum(axis=-1)
    hi = lo + step_s.max(axis=-1)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        enough = capacity(mid, step_s, units) >= samples
        lo, hi = np.where(enough, lo, mid), np.where(enough, mid, hi)
    return hi


def rebalance_steps(step_s, units, samples) -> np.ndarray:
    """H_i = max(1, ⌊T / t̂_i⌋) at the round time T of the estimates (int64, the shape of step_s)."""
    step_s = np.asarray(step_s, dtype=float)
    t = round_time_s(step_s, units, samples)
    return np.maximum(1, np.floor(np.asarray(t)[..., None] / step_s)).astype(np.int64)


def keep_stepping(elapsed_s: float, steps: int, deadline_s: float) -> bool:
    """Deadline rounds: whether a node that did `steps` steps in `elapsed_s` takes another (at least one)."""
    return steps == 0 or elapsed_s + elapsed_s / steps <= deadline_s * (1 + DEADLINE_SLACK)


def deadline_steps(cumulative_s, deadline_s) -> np.ndarray:
    """keep_stepping over a node's step times known in advance: cumulative_s (..., K) the end of each of
    up to K steps; returns how many it takes (the first k whose next step it would not start; K if none)."""
    cum = np.asarray(cumulative_s, dtype=float)
    k = np.arange(1, cum.shape[-1] + 1)
    stop = cum + cum / k > np.asarray(deadline_s, dtype=float)[..., None] * (1 + DEADLINE_SLACK)
    return np.where(stop.any(axis=-1), stop.argmax(axis=-1) + 1, cum.shape[-1])


def measured_step_s(compute_s, steps) -> np.ndarray:
    """A round's mean step time per node: its compute over its steps (the next round's estimate)."""
    return np.asarray(compute_s, dtype=float) / np.asarray(steps, dtype=float)
