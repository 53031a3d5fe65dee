"""What a run's checkpoints cost its timeline (the executor's: real/checkpoint/checkpoint.py).

After every `[training] checkpoint_every`-th round (absent: the Young/Daly interval from one
checkpoint's cost and `[simulation] mtbf_s`, in rounds of the mean round; formats/scenario.py), the executor stops
training for a snapshot of the state into host memory, then writes it in the background while
the next rounds train; a checkpoint that comes due while the previous write still runs waits
for it, and the run ends when the last write has. With the network profile's fits
(simulator/models/netfit.py) of the snapshot and of the write of B = CHECKPOINT_BYTES_PER_PARAM ×
parameters bytes (every node writes the same state, so it delays every node alike):

    block_r = snapshot(B) + max(0, write(B) − the rounds' time since the previous checkpoint)
              for a round r that ends in a checkpoint, else 0
    the run's end = the last round's end + block_last + write(B)

The rounds' time between two checkpoints is each round's longest node (its compute and sync),
which the checkpoints themselves do not change. A network profile without `snapshot` rows
(measured before the executor wrote in the background) prices each checkpoint as a write that
blocks, and nothing after it. Without checkpoint rows in a network profile, the nodes' own
profiles price it where `geodt calibrate device` timed their host's snapshot and write (ns per
byte, formats/profile.py CHECKPOINT_COLUMNS): the slowest host's of each, since the next
sync waits for every node; otherwise checkpoints cost 0, and the note says so.

Where a node trains on CPUs, its background write takes the cores (or the quota) its training
uses: a CPU node's rounds stretched by about the write's time while one ran (a 103 M-parameter
CPU node here: 5.4 s of compute a round became 9.2-10.0 s, its write 3.3 s alone and 7-8 s beside
training). The write is then priced as blocking, after the snapshot, which every node waits for
at the next sync; GPU nodes train beside it (on an H200 the rounds kept their time within 1%).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formats.scenario import rounds_between_checkpoints
from formats.sections import MTBF_S_DEFAULT
from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM, profiled_host_figure


@dataclass(frozen=True)
class CheckpointCost:
    """One checkpoint's seconds: the snapshot that blocks training, the write behind it."""

    every: int | None   # rounds between checkpoints; None: the Young/Daly interval (`rounds_every`)
    snapshot_s: float   # blocks every node
    write_s: float      # in the background (0 where the profile prices the write as blocking)
    note: str           # how it was priced, for a summary line
    mtbf_s: float = MTBF_S_DEFAULT

    def rounds_every(self, round_s: np.ndarray) -> int:
        """`every`, else the Young/Daly interval for a checkpoint of snapshot + write seconds, in mean rounds."""
        if self.every is not None:
            return self.every
        mean_s = float(np.mean(round_s)) if len(round_s) else 1.0
        return rounds_between_checkpoints(self.snapshot_s + self.write_s, self.mtbf_s, mean_s)

    def due(self, round_s: np.ndarray) -> np.ndarray:
        """Per round (0-based), whether it ends in a checkpoint: every `rounds_every`-th (none after
        the last unless it is one: the executor writes a final one only when asked)."""
        done = np.arange(1, len(round_s) + 1)
        return done % self.rounds_every(round_s) == 0

    def block_s(self, round_s: np.ndarray) -> np.ndarray:
        """Seconds training stops after each round, from each round's own time without checkpoints."""
        due = self.due(round_s)
        block = np.zeros(len(round_s))
        if not (self.snapshot_s or self.write_s):
            return block
        since = np.inf  # no write in flight before the first checkpoint
        for r in range(len(round_s)):
            since += round_s[r]
            if due[r]:
                block[r] = self.snapshot_s + max(0.0, self.write_s - since)
                since = 0.0
        return block


def checkpoint_cost(scenario) -> CheckpointCost:
    """The scenario's checkpoints priced from its network profile, else its nodes' profiles; the
    write blocks where a node trains on CPUs (module docstring)."""
    cost = _measured_cost(scenario)
    if cost.write_s and any(set(node.gpus) == {"cpu"} for node in scenario.nodes):
        return CheckpointCost(cost.every, cost.snapshot_s + cost.write_s, 0.0,
                              f"{cost.note}; the write priced as blocking: on a CPU node it takes the cores "
                              "training uses", cost.mtbf_s)
    return cost


def _measured_cost(scenario) -> CheckpointCost:
    cost = _priced(scenario)
    return CheckpointCost(cost.every, cost.snapshot_s, cost.write_s, cost.note, scenario.simulation.mtbf_s)


def _priced(scenario) -> CheckpointCost:
    every = scenario.training.checkpoint_every
    model = scenario.network_model
    size = CHECKPOINT_BYTES_PER_PARAM * scenario.model.param_count
    if model is None or model.checkpoint is None:
        hosts = profiled_checkpoint_ns_per_byte(scenario)
        if not hosts:
            return CheckpointCost(every, 0.0, 0.0, "checkpoints not priced (neither a network profile with "
                                                   "checkpoint rows nor a node profile with checkpoint columns)")
        snapshot_s, write_s = (max(h[part] for h in hosts.values()) * 1e-9 * size for part in ("snapshot", "write"))
        missing = [node.name for node in scenario.nodes if node.profile not in hosts]
        return CheckpointCost(every, snapshot_s, write_s, "checkpoints priced from the nodes' profiles"
                              + (f" (not {', '.join(missing[:3])}{' and others' if len(missing) > 3 else ''}: "
                                 "no checkpoint columns)" if missing else ""))
    write_s = model.checkpoint(size)
    if model.snapshot is None:
        return CheckpointCost(every, write_s, 0.0, "the write priced as blocking (the profile has no snapshot rows)")
    return CheckpointCost(every, model.snapshot(size), write_s, "snapshot blocks, the write runs behind the rounds")


def profiled_checkpoint_ns_per_byte(scenario) -> dict[str, dict[str, float]]:
    """{profile path: {"snapshot": ns, "write": ns}} for each node profile that timed its host's
    checkpoint (`geodt calibrate device`); the slowest of a node's profiles, one entry per path."""
    hosts = {}
    for node in scenario.nodes:
        if node.profile and node.profile not in hosts:
            figures = {part: profiled_host_figure(scenario, node, "checkpoint_ns_per_byte", part)
                       for part in ("snapshot", "write")}
            if None not in figures.values():
                hosts[node.profile] = figures
    return hosts


def round_s(compute: np.ndarray, comm_s) -> np.ndarray:
    """Each round's time without checkpoints: its longest node's compute, then the longest sync."""
    return compute.max(axis=1) + float(np.max(comm_s))
