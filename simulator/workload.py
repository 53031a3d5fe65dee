"""Per node and round compute times of a plan: deterministic, or with seeded per-step jitter.

Both engines consume the same matrix, so they agree exactly whether or not jitter is on.
Jitter multiplies every inner step by a lognormal factor of mean 1 and coefficient of
variation `simulation.jitter_cv`, drawn from numpy.random.default_rng(scenario.seed). With
`simulation.variability = "profile"`, a node timed by calibration profiles takes its own
coefficient from their measured p10/p90 spread at its planned batch (the largest of its profiles).
A node of G devices draws each device's step and waits for the slowest (then its intra-node
all-reduce), as data-parallel devices do.
"""
from __future__ import annotations

import numpy as np

from formats.plan import Plan
from simulator.scenario import Scenario


def compute_matrix(scenario: Scenario, plan: Plan) -> np.ndarray:
    """compute_s[r, i]: node i's time for its H_i inner steps in round r (rounds × nodes)."""
    rounds = plan.rounds or scenario.training.rounds  # a plan may sync more often (sync-ddp)
    base = np.array([n.compute_s for n in plan.nodes], dtype=float)
    cvs = node_cvs(scenario, plan)
    if not any(cvs):
        return np.broadcast_to(base, (rounds, len(base))).copy()
    from simulator.timing import node_timings

    intra = {t.node.name: t.intra_s for t in node_timings(scenario)}
    rng = np.random.default_rng(scenario.seed)
    out = np.empty((rounds, len(base)))
    for i, (n, cv) in enumerate(zip(plan.nodes, cvs)):
        sigma = np.sqrt(np.log1p(cv * cv))
        # Every device of the node draws its own step; the node's step waits for the slowest
        # of them, then all-reduces (data parallel): more devices, more expected wait.
        factors = rng.lognormal(-sigma * sigma / 2, sigma, size=(rounds, n.local_steps, n.gpus)).max(axis=2)
        intra_s = intra[n.node] if n.gpus > 1 else 0.0
        out[:, i] = (n.step_s - intra_s) * factors.sum(axis=1) + n.local_steps * intra_s
    return out


def node_cvs(scenario: Scenario, plan: Plan) -> list[float]:
    """Each node's per-step coefficient of variation under the scenario's variability rule."""
    given = scenario.simulation.jitter_cv
    if scenario.simulation.variability != "profile":
        return [given] * len(plan.nodes)
    from simulator.timing import node_timings

    by_name = {t.node.name: t for t in node_timings(scenario)}  # alike nodes share one profile load
    cvs = []
    for n in plan.nodes:
        profiles = by_name[n.node].profiles
        cvs.append(max(p.step_cv(n.batch_size) for p in profiles) if profiles else given)
    return cvs
