"""Per node and round compute times of a plan: deterministic, or with seeded per-step jitter.

Both engines consume the same matrix, so they agree exactly whether or not jitter is on.
Jitter multiplies every inner step by a lognormal factor of mean 1 and coefficient of
variation `simulation.jitter_cv`, drawn from numpy.random.default_rng(scenario.seed). With
`simulation.variability = "profile"`, a node timed by calibration profiles takes its own
coefficient from their measured p10/p90 spread at its planned batch (the largest of its profiles).
A node of G devices draws each device's step and waits for the slowest (then its intra-node
all-reduce), as data-parallel devices do.

Drift (simulator/models/drift.py) multiplies every step of a round by the node's factor for that round,
after the draws, so a drifting run keeps the same draws as a steady one.

Streaming DiLoCo splits each round at its fragments' sync and merge points (`segment_matrices`):
the same draws, summed per segment of steps instead of per round.
"""
from __future__ import annotations

import numpy as np

from formats.plan import Plan, merge_steps
from simulator.models.drift import drift_factors
from simulator.models.timing import intra_node_allreduce_s, node_timings
from simulator.scenario import Scenario


def allreduce_part_s(step_s: float, intra_s: float) -> float:
    """The part of a node's step that jitter leaves alone: its devices' all-reduce, at most the whole step (a
    step given shorter than the node's own all-reduce has no device part left, not a negative one: a step of
    0.001 s on 8 GPUs drew negative step times and ended `sweep --table` in a traceback)."""
    return min(intra_s, step_s)


def compute_matrix(scenario: Scenario, plan: Plan) -> np.ndarray:
    """compute_s[r, i]: node i's time for its H_i inner steps in round r (rounds × nodes), drift applied."""
    return with_drift(scenario, plan, _steady_matrix(scenario, plan))


def with_drift(scenario: Scenario, plan: Plan, compute: np.ndarray, per_round: int = 1) -> np.ndarray:
    """compute (rounds·per_round × nodes) times each round's drift multiplier (simulator/models/drift.py)."""
    factors = drift_factors(scenario, plan)
    return compute if factors is None else compute * np.repeat(factors, per_round, axis=0)


def _steady_matrix(scenario: Scenario, plan: Plan) -> np.ndarray:
    rounds = plan.settings_from(scenario).rounds  # a plan may sync more often (sync-ddp)
    base = np.array([n.compute_s for n in plan.nodes], dtype=float)
    cvs = node_cvs(scenario, plan)
    if not any(cvs):
        return np.broadcast_to(base, (rounds, len(base))).copy()
    intra = {t.node.name: t.intra_s for t in node_timings(scenario)}
    rng = np.random.default_rng(scenario.seed)
    out = np.empty((rounds, len(base)))
    for i, (n, cv) in enumerate(zip(plan.nodes, cvs)):
        sigma = np.sqrt(np.log1p(cv * cv))
        # Every device of the node draws its own step; the node's step waits for the slowest
        # of them, then all-reduces (data parallel): more devices, more expected wait.
        factors = rng.lognormal(-sigma * sigma / 2, sigma, size=(rounds, n.local_steps, n.gpus)).max(axis=2)
        intra_s = allreduce_part_s(n.step_s, intra[n.node] if n.gpus > 1 else 0.0)
        out[:, i] = (n.step_s - intra_s) * factors.sum(axis=1) + n.local_steps * intra_s
    return out


def node_cvs(scenario: Scenario, plan: Plan) -> list[float]:
    """Each node's per-step coefficient of variation under the scenario's variability rule."""
    given = scenario.simulation.jitter_cv
    if scenario.simulation.variability != "profile":
        return [given] * len(plan.nodes)
    by_name = {t.node.name: t for t in node_timings(scenario)}  # alike nodes share one profile load
    cvs = []
    for n in plan.nodes:
        profiles = by_name[n.node].profiles
        cvs.append(max(p.step_cv(n.batch_size) for p in profiles) if profiles else given)
    return cvs


def segment_steps(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(pre, delay), each (P, n) inner steps: per fragment p and node i, the steps from the previous
    merge to the fragment's sync point, and the τ steps from there to its merge point."""
    tau = plan.sync_delay_steps
    pre = np.empty((plan.fragments, len(plan.nodes)), dtype=np.int64)
    for i, n in enumerate(plan.nodes):
        merges = np.asarray(merge_steps(n.local_steps, plan.fragments))
        pre[:, i] = np.diff(merges, prepend=0) - tau
    return pre, np.full_like(pre, tau)


def segment_matrices(scenario: Scenario, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(pre_s, delay_s), each (rounds × P, n): the compute of every segment of `segment_steps`, in
    the order the fragment syncs happen (round-major). With jitter, the draws of compute_matrix
    (same generator, same order), summed per segment."""
    pre, delay = _steady_segments(scenario, plan)
    return with_drift(scenario, plan, pre, plan.fragments), with_drift(scenario, plan, delay, plan.fragments)


def _steady_segments(scenario: Scenario, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    rounds = plan.settings_from(scenario).rounds
    pre_steps, delay_steps = segment_steps(plan)
    step = np.array([n.step_s for n in plan.nodes], dtype=float)
    cvs = node_cvs(scenario, plan)
    if not any(cvs):
        shape = (rounds * plan.fragments, len(plan.nodes))
        return (np.broadcast_to(np.tile(pre_steps * step, (rounds, 1)), shape),
                np.broadcast_to(np.tile(delay_steps * step, (rounds, 1)), shape))
    rng = np.random.default_rng(scenario.seed)
    by_name = {node.name: node for node in scenario.nodes}
    out = np.empty((2, rounds, plan.fragments, len(plan.nodes)))
    for i, (n, cv) in enumerate(zip(plan.nodes, cvs)):
        sigma = np.sqrt(np.log1p(cv * cv))
        factors = rng.lognormal(-sigma * sigma / 2, sigma, size=(rounds, n.local_steps, n.gpus)).max(axis=2)
        intra_s = allreduce_part_s(n.step_s, intra_node_allreduce_s(scenario, by_name[n.node]) if n.gpus > 1 else 0.0)
        steps_s = (n.step_s - intra_s) * factors + intra_s  # (rounds, H_i)
        # segment edges: 0, end of pre_0, end of delay_0 (merge 0), end of pre_1, ...
        edges = np.cumsum(np.ravel(np.column_stack([pre_steps[:, i], delay_steps[:, i]])))
        sums = np.add.reduceat(np.concatenate([steps_s, np.zeros((rounds, 1))], axis=1),
                               np.concatenate([[0], edges[:-1]]), axis=1)
        # reduceat yields the element at an empty segment's start instead of 0
        sums[:, np.flatnonzero(np.diff(np.concatenate([[0], edges])) == 0)] = 0.0
        out[:, :, :, i] = sums.reshape(rounds, plan.fragments, 2).transpose(2, 0, 1)
    return out[0].reshape(-1, len(plan.nodes)), out[1].reshape(-1, len(plan.nodes))
