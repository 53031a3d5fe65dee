"""Drift: how a node's speed changes over a run, as a per-node, per-round step-time multiplier.

A node's `drift` (docs/DESIGN.md, "Scenario file") is a list of events, each a multiplier on
every inner step's time of the rounds it covers; events compose by product:

    { kind = "step",   round = 5, factor = 1.2 }                  rounds >= 5 take 1.2x
    { kind = "window", from_round = 3, to_round = 6, factor = 1.5 } rounds 3, 4, 5 take 1.5x
    { kind = "walk",   spread = 0.05 }                            a random walk: round r's factor is
                                                                   exp(Σ_{k=1..r} ε_k), ε_k ~ N(0, spread)

A step or window event may also give `cpu_quota_factor`: what a real run (`geodt run/validate`
without --emulate) divides the node's CPU quota by to inject it, where `factor` is then the step
time that quota was measured to give. A quota's effect on a step is not proportional (a step
under 10 ms CFS periods takes more than work / quota, the more so as the quota falls), so
dividing by `factor` itself slows the step by another amount; without it the quota is divided by
`factor`.

Time is counted in the scenario's rounds (training.rounds), not seconds: a round is what every
engine, strategy and the executor share, and it keeps the drift independent of the plan a
strategy makes (a rebalanced plan's rounds last longer or shorter, the drift is the same). A
plan with other rounds (sync-ddp's R·H) maps its round k to scenario round ⌊k·R / rounds⌋.
The walk is drawn from its own generator, seeded by (scenario seed, node position, event index), so it is
deterministic, the same for every strategy, and apart from the jitter's draws.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formats.errors import FieldError

KINDS = {"step": ("round", "factor"), "window": ("from_round", "to_round", "factor"), "walk": ("spread",)}
MAX_FACTOR = 1e3  # a node 1000x slower (or faster) than planned is beyond what a drift describes
DRIFT_STREAM = 0x6472  # the walk's generator words: (seed, DRIFT_STREAM, node position)


@dataclass(frozen=True)
class DriftEvent:
    """One entry of a node's `drift` list (module docstring); only its kind's keys may be set."""

    kind: str
    round: int | None = None
    from_round: int | None = None
    to_round: int | None = None
    factor: float | None = None
    spread: float | None = None
    cpu_quota_factor: float | None = None  # a real run's quota divisor (module docstring); default factor

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FieldError("kind", f"expected one of {', '.join(KINDS)}, got {self.kind!r}")
        wanted = KINDS[self.kind]
        for name in ("round", "from_round", "to_round", "factor", "spread"):
            given = getattr(self, name) is not None
            if given and name not in wanted:
                raise FieldError(name, f"not a key of a {self.kind} drift; expected {', '.join(wanted)}")
            if not given and name in wanted:
                raise FieldError(name, f"missing; a {self.kind} drift needs {', '.join(wanted)}")
        for name in ("round", "from_round", "to_round"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 10**9:
                raise FieldError(name, f"expected a round index from 0 to 1e9, got {value!r}")
        if self.to_round is not None and self.to_round <= self.from_round:
            raise FieldError("to_round", f"expected a round after from_round ({self.from_round}), got {self.to_round}")
        if self.factor is not None and not 1 / MAX_FACTOR <= self.factor <= MAX_FACTOR:
            raise FieldError("factor", f"expected a step-time multiplier from {1 / MAX_FACTOR:g} to {MAX_FACTOR:g}, "
                             f"got {self.factor!r}")
        if self.cpu_quota_factor is not None:
            if self.kind == "walk":
                raise FieldError("cpu_quota_factor", "not a key of a walk drift; expected spread")
            if not 1 / MAX_FACTOR <= self.cpu_quota_factor <= MAX_FACTOR:
                raise FieldError("cpu_quota_factor", f"expected a quota divisor from {1 / MAX_FACTOR:g} to "
                                 f"{MAX_FACTOR:g}, got {self.cpu_quota_factor!r}")
        if self.spread is not None and not 0 <= self.spread <= 1:
            raise FieldError("spread", f"expected a standard deviation of log step time per round in [0, 1], "
                             f"got {self.spread!r}")


def event_factors(events, rounds: int, rng_words, quota: bool = False) -> np.ndarray:
    """(rounds,) step-time multipliers of one node's events; rng_words seed its walk. quota: a
    real run's CPU quota divisors instead (each event's cpu_quota_factor where given)."""
    out = np.ones(rounds)
    r = np.arange(rounds)
    for k, e in enumerate(events):
        factor = e.cpu_quota_factor if quota and e.cpu_quota_factor is not None else e.factor
        if e.kind == "step":
            out *= np.where(r >= e.round, factor, 1.0)
        elif e.kind == "window":
            out *= np.where((r >= e.from_round) & (r < e.to_round), factor, 1.0)
        else:
            steps = np.random.default_rng((*rng_words, k)).normal(0.0, e.spread, size=rounds)
            steps[0] = 0.0  # round 0 runs at the planned speed
            out *= np.exp(np.cumsum(steps))
    return out


def has_drift(scenario) -> bool:
    return any(node.drift for node in scenario.nodes)


def drift_factors(scenario, plan, quota: bool = False) -> np.ndarray | None:
    """(plan rounds, plan nodes) step-time multipliers (quota: a real run's CPU quota divisors), or
    None where no node drifts."""
    if not has_drift(scenario):
        return None
    rounds = plan.settings_from(scenario).rounds
    base = scenario.training.rounds
    position = {node.name: i for i, node in enumerate(scenario.nodes)}
    per_node = []
    for p in plan.nodes:
        i = position[p.node]
        per_node.append(event_factors(scenario.nodes[i].drift or (), base, (scenario.seed, DRIFT_STREAM, i), quota))
    table = np.column_stack(per_node)  # (scenario rounds, nodes)
    if rounds == base:
        return table
    index = np.minimum(np.arange(rounds) * base // rounds, base - 1)
    return table[index]
