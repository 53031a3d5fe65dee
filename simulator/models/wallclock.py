"""A run's whole wall clock, predicted: startup, the rounds, and the checkpoints after them.

The timeline (simulator/engines/engine.py) holds the rounds and the checkpoints between them: its last
round ends at max(round_end_s). A run also pays, once,

- startup: the first steps' one-time cost (CUDA initialisation, allocator growth, and for a
  compiled step its compile), which a real run spends inside round 0's compute. Per node from
  its profiles (`simulator.models.profile_fit.ProfileModel.startup_s`: the largest warm-up cost beyond
  steady steps of any measured batch); nodes without measured warm-up (catalog, given step
  times, profiles from before the warmup columns) count 0, and `note` says so. The run waits
  for its slowest starter at the first barrier, so the largest counts.
- the checkpoint after the last round: its snapshot, then its whole write, which the run waits
  for before it ends (simulator/models/checkpoints.py; the timeline already holds the checkpoints
  between rounds; 0 where nothing measured the host's checkpoint, and `note` says so).

    wall_s = max_i startup_i + max(round_end_s) + last_checkpoint_s

`geodt validate` compares it with the run's measured wall clock: the last round's end, its
checkpoint's blocking part and its write, on each node's clock (trace.csv), the latest node's.
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.models.checkpoints import checkpoint_cost
from simulator.models.timing import node_timings


@dataclass(frozen=True)
class WallClock:
    """The predicted wall clock of a run and its parts, in the scenario's seconds."""

    startup_s: float
    rounds_s: float      # the timeline's end: rounds and the checkpoints between them
    last_checkpoint_s: float
    note: str            # what could not be counted ('' when every node's startup and the checkpoints were)

    @property
    def wall_s(self) -> float:
        return self.startup_s + self.rounds_s + self.last_checkpoint_s


def predicted_wall_clock(scenario, timeline) -> WallClock:
    """The run's predicted wall clock from a simulated timeline (module docstring)."""
    timings = node_timings(scenario)
    unmeasured = [t.node.name for t in timings if not t.startup_measured]
    note = (f"startup of {', '.join(unmeasured[:3])}{' and others' if len(unmeasured) > 3 else ''} not measured "
            "(no profile with warm-up columns): counted 0") if unmeasured else ""
    by_round = timeline.groupby("round")
    round_s = (by_round["round_end_s"].max() - by_round["round_start_s"].min()).to_numpy()
    cost = checkpoint_cost(scenario)
    last = float(cost.block_s(round_s)[-1]) + cost.write_s if len(round_s) and cost.due(round_s)[-1] else 0.0
    if not (cost.snapshot_s or cost.write_s):
        note = "; ".join(filter(None, [note, cost.note]))
    return WallClock(startup_s=max(t.startup_s for t in timings), rounds_s=float(timeline["round_end_s"].max()),
                     last_checkpoint_s=last, note=note)


def measured_wall_s(trace, time_scale: float = 1.0) -> float:
    """A run's measured wall clock from its trace.csv: the latest node's last round end plus the
    checkpoint after it, its blocking part and its background write, which the run waits for
    before it ends (each node on its own clock, from the run's start); NaN for a trace without
    round ends."""
    if "round_end_s" not in trace:
        return float("nan")
    end = trace["round_end_s"].copy()
    for column in ("ckpt_block_s", "ckpt_background_s"):
        if column in trace:
            end = end + trace[column].fillna(0.0)
    return float(end.max()) / time_scale
