"""The rounds of an adaptive plan (adapt = rebalance | deadline): what each node does, round by round.

Such a plan's round r depends on what rounds before it measured (formats/adaptive.py has the
rules, shared with the executor), so its compute cannot be drawn up front as compute_matrix
does: `adaptive_rounds` walks the rounds, draws each node's step times for the steps the rule
gives it (drift and jitter as in simulator/models/workload.py), and returns the compute matrix both
engines then run (they agree exactly, as for any plan) with the steps every node took.

Step times: node i's step in round r takes step_s_i × drift[r, i] × (a jitter factor where
jitter is on: the slowest of its G devices' lognormal draws, then the intra-node all-reduce,
as workload.py). The draws come from their own generator, seeded by (scenario seed,
ADAPT_STREAM), in round order then node order, so a run is deterministic.
"""
from __future__ import annotations

import math

import numpy as np

from formats.adaptive import deadline_steps, measured_step_s, rebalance_steps, round_time_s
from formats.plan import Plan
from simulator.models.drift import drift_factors
from simulator.models.outage import outages, rejoin_round
from simulator.models.timing import node_timings
from simulator.models.workload import allreduce_part_s, node_cvs
from simulator.scenario import Scenario

ADAPT_STREAM = 0x6164


class StepDraws:
    """Per node the step times of a round: deterministic, or jittered from one seeded generator."""

    def __init__(self, scenario: Scenario, plan: Plan):
        self.step_s = np.array([n.step_s for n in plan.nodes], dtype=float)
        self.cvs = node_cvs(scenario, plan)
        self.gpus = [n.gpus for n in plan.nodes]
        self.intra_s = np.zeros(len(plan.nodes))
        if any(self.cvs) and any(g > 1 for g in self.gpus):
            intra = {t.node.name: t.intra_s for t in node_timings(scenario)}
            self.intra_s = np.array([allreduce_part_s(n.step_s, intra[n.node] if n.gpus > 1 else 0.0)
                                     for n in plan.nodes])
        self.rng = np.random.default_rng((scenario.seed, ADAPT_STREAM))

    def total(self, i: int, factor: float, steps: int) -> tuple[float, float]:
        """(compute_s, the mean step the node measures) of `steps` steps of node i: deterministic
        steps as compute_matrix times them (H·t, then the drift), so an undrifted round is the plan's."""
        if not self.cvs[i]:
            return steps * self.step_s[i] * factor, self.step_s[i] * factor
        compute = float(self.draw(i, factor, steps).sum())
        return compute, compute / steps

    def draw(self, i: int, factor: float, steps: int) -> np.ndarray:
        """`steps` step times of node i at drift factor `factor`."""
        cv = self.cvs[i]
        if not cv:
            return np.full(steps, self.step_s[i] * factor)
        sigma = math.sqrt(math.log1p(cv * cv))
        jitter = self.rng.lognormal(-sigma * sigma / 2, sigma, size=(steps, self.gpus[i])).max(axis=1)
        return ((self.step_s[i] - self.intra_s[i]) * jitter + self.intra_s[i]) * factor


def adaptive_rounds(scenario: Scenario, plan: Plan, comm_s=0.0) -> tuple[np.ndarray, np.ndarray]:
    """(compute_s, steps), each (rounds × nodes), of an adaptive plan's rounds (module docstring).
    Under an outage (on_node_loss = "continue", simulator/models/outage.py) each round is planned over the
    nodes present when it is planned, at the plan's samples per round: the round in flight at a loss
    keeps the lost node, the rounds after it until it rejoins (`comm_s` prices its restart) do not."""
    rounds, n = plan.settings_from(scenario).rounds, len(plan.nodes)
    factors = drift_factors(scenario, plan)
    factors = np.ones((rounds, n)) if factors is None else factors
    draws = StepDraws(scenario, plan)
    units = np.array([p.batch_size * p.gpus for p in plan.nodes], dtype=float)
    samples = float(sum(p.local_steps * p.batch_size * p.gpus for p in plan.nodes))
    compute, steps = np.zeros((rounds, n)), np.zeros((rounds, n), dtype=np.int64)
    estimate = draws.step_s.copy()  # round 0 knows only the plan's step times; a node away keeps its own
    absent = Absences(scenario, plan, rounds, comm_s)
    for r in range(rounds):
        here = absent.planned(r)
        runs = here & ~absent.lost_at(r)  # a node lost at the round's start was planned, runs nothing
        if not runs.any():  # nobody left to train (a one-node run whose node is away)
            absent.after(r, compute[r])
            continue
        if plan.adapt == "rebalance":
            planned = np.array([p.local_steps for p in plan.nodes])
            if r > 0:
                planned[here] = rebalance_steps(estimate[here], units[here], samples)
            for i in np.flatnonzero(runs):
                compute[r, i], estimate[i] = draws.total(i, factors[r, i], int(planned[i]))
                steps[r, i] = planned[i]
        else:
            deadline = float(round_time_s(estimate[here], units[here], samples))
            for i in np.flatnonzero(runs):
                compute[r, i], steps[r, i] = _until_deadline(draws, i, factors[r, i], deadline)
            jittered = np.asarray(draws.cvs) > 0
            measured = np.where(jittered, measured_step_s(compute[r], np.maximum(steps[r], 1)),
                                draws.step_s * factors[r])
            estimate = np.where(runs, measured, estimate)
        absent.after(r, compute[r])
    return compute, steps


class Absences:
    """Which nodes each round of an adaptive plan is planned over, under continue's outages."""

    def __init__(self, scenario: Scenario, plan: Plan, rounds: int, comm_s):
        self.scenario, self.rounds = scenario, rounds
        self.comm = np.broadcast_to(np.asarray(comm_s, dtype=float), (len(plan.nodes),))
        self.lost = {i: o for i, o in outages(scenario, plan) if scenario.simulation.on_node_loss == "continue"}
        self.away = np.zeros((rounds, len(plan.nodes)), dtype=bool)

    def planned(self, r: int) -> np.ndarray:
        """The nodes round r is planned over: those not away (a node lost at r is: nobody knows yet)."""
        return ~self.away[r]

    def lost_at(self, r: int) -> np.ndarray:
        """The nodes lost at round r's start."""
        mask = np.zeros(self.away.shape[1], dtype=bool)
        mask[[i for i, outage in self.lost.items() if outage.round == r]] = True
        return mask

    def after(self, r: int, compute: np.ndarray) -> None:
        """Round r done: a node lost at its start is away until rejoin_round (its restart priced)."""
        for i, outage in self.lost.items():
            if outage.round == r:
                back = rejoin_round(self.scenario.simulation, outage, np.delete(compute, i), self.comm)
                self.away[r + 1:back, i] = True


def _until_deadline(draws: StepDraws, i: int, factor: float, deadline_s: float) -> tuple[float, int]:
    """(compute_s, steps) of node i running steps until the round's deadline (formats/adaptive.py)."""
    expected = draws.step_s[i] * factor
    chunk = int(min(deadline_s / expected * 1.25 + 4, 1e7))
    times = draws.draw(i, factor, chunk)
    while True:
        cum = np.cumsum(times)
        k = int(deadline_steps(cum, deadline_s))
        if k < len(times):
            return float(cum[k - 1]), k
        times = np.concatenate([times, draws.draw(i, factor, chunk)])
