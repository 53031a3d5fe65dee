"""Per node and round compute times of a plan: deterministic, or with seeded per-step jitter.

Both engines consume the same matrix, so they agree exactly whether or not jitter is on.
Jitter multiplies every inner step by a lognormal factor of mean 1 and coefficient of
variation `simulation.jitter_cv`, drawn from numpy.random.default_rng(scenario.seed).
"""
from __future__ import annotations

import numpy as np

from simulator.plan import Plan
from simulator.scenario import Scenario


def compute_matrix(scenario: Scenario, plan: Plan) -> np.ndarray:
    """compute_s[r, i]: node i's time for its H_i inner steps in round r (rounds × nodes)."""
    rounds = plan.rounds or scenario.training.rounds  # a plan may sync more often (sync-ddp)
    base = np.array([n.compute_s for n in plan.nodes], dtype=float)
    cv = scenario.simulation.jitter_cv
    if cv == 0:
        return np.broadcast_to(base, (rounds, len(base))).copy()
    rng = np.random.default_rng(scenario.seed)
    sigma = np.sqrt(np.log1p(cv * cv))
    out = np.empty((rounds, len(base)))
    for i, n in enumerate(plan.nodes):
        factors = rng.lognormal(-sigma * sigma / 2, sigma, size=(rounds, n.local_steps))
        out[:, i] = n.step_s * factors.sum(axis=1)
    return out
