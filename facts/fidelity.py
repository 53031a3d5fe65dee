"""geodt's fidelity goals, defined once, and the verdict of one validation against them.

The goals are the ones the project's benchmarks hold the simulator to (benchmarks/bench_fidelity.py,
bench_time_to_loss.py; the README quotes them): a real run's round time within 5% of the
prediction (median over nodes), each node's idle within 3% of the round (median) and 6% (worst),
on a shaped WAN each node's sync within 5% (median) and 10% (worst), and the time to a target loss
within 20% (the worst case; 10% is the median over cases, which one run cannot judge); without a
barrier (async) the run's mean staleness within 10% of the predicted (issue 40). A
profile's step-time fit is usable for planning when its median leave-one-out error is within 8%
(the band a profiled prediction is held to).

`judge` takes validation.csv's per-node errors and returns one Verdict a goal: torch- and
pandas-free, so the benchmarks and `geodt validate` read the same numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class Goal:
    """|error| of `what`, reduced over the nodes by `statistic` (median | worst; run: one figure for the
    run), at most limit_pct."""
    key: str
    what: str
    statistic: str
    limit_pct: float
    unit: str  # how the error is expressed: "%" of its own prediction, or "% of round"
    wan_only: bool = False  # judged on a shaped WAN only: on the loopback a sync is too short to time


ROUND_MEDIAN = Goal("round_median", "round time", "median", 5.0, "%")
IDLE_MEDIAN = Goal("idle_median", "idle", "median", 3.0, "% of round")
IDLE_WORST = Goal("idle_worst", "idle", "worst", 6.0, "% of round")
SYNC_MEDIAN = Goal("sync_median", "sync", "median", 5.0, "%", wan_only=True)
SYNC_WORST = Goal("sync_worst", "sync", "worst", 10.0, "%", wan_only=True)
TIME_TO_TARGET = Goal("time_to_target", "time to target loss", "worst", 20.0, "%")
GOALS = (ROUND_MEDIAN, IDLE_MEDIAN, IDLE_WORST, SYNC_MEDIAN, SYNC_WORST, TIME_TO_TARGET)
# Rounds without a barrier (async): the run's mean staleness, over every merge, against the prediction's;
# judged only where pseudo-gradients merge stale (judge's staleness_pct).
STALENESS = Goal("staleness", "mean staleness", "run", 10.0, "%")
# The per-node goals: the ones a single node can miss (the worst over nodes is the node's own).
NODE_GOALS = {"round": 5.0, "idle": IDLE_WORST.limit_pct, "sync": SYNC_WORST.limit_pct}
PROFILE_LOO_PCT = 8.0  # a profile's fit: the median batch's leave-one-out |error| within this


@dataclass(frozen=True)
class Verdict:
    goal: Goal
    value_pct: float | None  # the reduced |error|; None: not judged
    note: str = ""  # why not judged

    @property
    def within(self) -> bool | None:
        return None if self.value_pct is None else self.value_pct <= self.goal.limit_pct

    def line(self) -> str:
        """One line: the goal, the value and within / outside (by how many points) / not judged."""
        goal = self.goal
        per_run = goal.statistic == "run" or goal.key == TIME_TO_TARGET.key
        head = goal.what if per_run else f"{goal.what}, {goal.statistic} over nodes"
        if self.value_pct is None:
            return f"{head} (goal ≤ {goal.limit_pct:g}{goal.unit}): not judged ({self.note})"
        outcome = "within" if self.within else f"outside by {self.value_pct - goal.limit_pct:.1f} points"
        return f"{head} |error| {self.value_pct:.1f}{goal.unit} (goal ≤ {goal.limit_pct:g}{goal.unit}): {outcome}"


def _reduce(values: list[float], statistic: str) -> float | None:
    finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return median(finite) if statistic == "median" else max(finite)


def judge(round_pct: list[float], idle_pct_of_round: list[float], sync_pct: list[float], shaped_wan: bool,
          time_to_target_pct: float | None = None, staleness_pct: float | None = None) -> list[Verdict]:
    """The verdict of each goal of GOALS for one validation: per node, the signed round error (% of
    the predicted round), idle error (% of the predicted round) and sync error (% of the predicted
    sync, NaN where none is predicted); the run's time-to-target error, None where not compared; and,
    given (an async run), the run's mean-staleness error: STALENESS's verdict last."""
    errors = {"round time": round_pct, "idle": idle_pct_of_round, "sync": sync_pct}
    verdicts = []
    for goal in GOALS:
        if goal is TIME_TO_TARGET:
            value = _reduce([time_to_target_pct], "worst") if time_to_target_pct is not None else None
            note = "no target loss, or the loss not compared, or a side never reached it"
        elif goal.wan_only and not shaped_wan:
            value, note = None, "the sync goals are for a shaped WAN; on the loopback a sync takes milliseconds"
        else:
            value = _reduce(errors[goal.what], goal.statistic)
            note = "no node predicted one"
        verdicts.append(Verdict(goal, value, note if value is None else ""))
    if staleness_pct is not None:
        value = _reduce([staleness_pct], "worst")
        verdicts.append(Verdict(STALENESS, value, "" if value is not None else "no staleness predicted"))
    return verdicts


def node_verdict(round_pct: float, idle_pct_of_round: float, sync_pct: float, shaped_wan: bool) -> str:
    """validation.csv's `verdict` of one node: "within", or "outside: " and each per-node goal it misses."""
    checks = [("round", round_pct, "%"), ("idle", idle_pct_of_round, "% of round")]
    if shaped_wan:
        checks.append(("sync", sync_pct, "%"))
    missed = [f"{name} {value:+.1f}{unit} (goal ±{NODE_GOALS[name]:g}{unit})" for name, value, unit in checks
              if value is not None and math.isfinite(value) and abs(value) > NODE_GOALS[name]]
    return "within" if not missed else "outside: " + "; ".join(missed)
