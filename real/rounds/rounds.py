"""What every kind of round shares: the `Round` interface, the node's parts it works with, and
the one inner-step loop.

real/process/worker.py builds a process's `NodeParts` once (model, optimizer, data, process groups,
outer state, averaging) and one round of the plan's kind, then calls `Round.run(r, origin,
bar)` for every round; each returns the node's trace.csv row (real/rounds/trace.py). `make_round` builds
the round its kind names (formats/rounds.py `round_class`), each kind in its own module: DiLoCo
(real/rounds/round_classic.py), synchronous data parallel (real/rounds/round_ddp.py), Streaming DiLoCo
(real/rounds/round_streaming.py) and the rounds without a barrier (real/rounds/round_server.py's
async and quorum). The first three run their H_i
inner steps through `InnerSteps.run`, which owns the node's step count and data position
(checkpointed, real/checkpoint/checkpoint.py). Under --emulate a DiLoCo or streaming step is padded here
to the plan's step_s × time_scale, deadlines accumulating so that sleep overshoot does not
pile up; a sync-ddp step is padded inside its gradient hook instead, before the global average.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pkgutil import resolve_name

import torch

from formats.plan import NodePlan, Plan
from formats.rounds import round_kind
from formats.scenario import DilocoConfig
from real.core.diloco import OuterState, inner_lr
from real.core.groups import Groups
from real.core.options import ExecOptions, sleep_until
from real.core.sharding import ShardLayout, peak_memory_bytes, peak_memory_reset
from real.core.sync import CrossNodeSync
from real.rounds.trace import trace_row
from train.step import train_step


@dataclass
class RoundClock:
    """What a round has measured so far, besides its start and end."""

    idle_s: float = 0.0      # barrier waits before cross-node averages (gradient rounds)
    comm_s: float = 0.0      # cross-node averages and broadcasts (gradient rounds)
    bytes_sent: int = 0
    overruns: int = 0        # emulated steps whose real compute overran step_s
    step_start: float = 0.0  # when the current inner step began
    deadline: float = 0.0    # when the current emulated step may end (DiLoCo and streaming rounds)


@dataclass
class Progress:
    """How far the current round got (perf_counter seconds), kept by the round as it goes: under
    --on-node-loss continue a round that fails is retried or written up from it (real/membership/members.py)."""

    start: float
    clock: RoundClock
    compute_end: float | None = None  # the inner steps are done
    sync_start: float | None = None   # the barrier is passed: the outer sync began


@dataclass(frozen=True)
class Origin:
    """The run's time axis: t0 (time.perf_counter() at the common start, a barrier before the
    first round run) and the offset a resumed run continues from."""

    t0: float
    offset_s: float = 0.0

    def at(self, t: float) -> float:
        """perf_counter time t on the run's axis (seconds)."""
        return self.offset_s + t - self.t0


class InnerSteps:
    """The node's inner steps: learning-rate schedule, its batches of the data shard, the step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler, shard, groups: Groups, *,
                 diloco: DilocoConfig, dtype: str, batch: int, local_steps: int, total_steps: int,
                 pad_step_s: float | None):
        """batch: per device; pad_step_s: the emulated step (step_s × time_scale) to pad each
        step to here, or None (no --emulate, or sync-ddp, which pads in its hook)."""
        self.model, self.optimizer, self.scaler, self.shard, self.groups = model, optimizer, scaler, shard, groups
        self.diloco, self.dtype, self.batch, self.local_steps = diloco, dtype, batch, local_steps
        self.node_batch = batch * groups.me.gpus
        self.total_steps, self.pad_step_s = total_steps, pad_step_s
        self.inner_step = 0     # steps done in the run (the learning-rate schedule's position)
        self.data_position = 0  # samples of the node's shard consumed (all its devices)
        self.adaptive = None    # an adaptive plan's rule (real/rounds/adaptive.py AdaptiveRounds), or None
        self.drift_factor = 1.0  # this round's injected step-time multiplier (ExecOptions.drift)
        self.round_steps = local_steps  # the steps of the current round: H_i, or an adaptive round's own
        self.loss_sum = torch.zeros(())  # the current round's, summed over its steps so far

    def run(self, clock: RoundClock, grad_sync, bar, after_step=None) -> torch.Tensor:
        """The round's H_i inner steps; returns the node's loss (mean over its devices) summed
        over them. after_step(step), step = 1..H_i, runs after each (streaming's fragment syncs)."""
        loss_sum = self.loss_sum = torch.zeros((), device=self.groups.device)  # so far, should the round fail
        step, round_start = 0, time.perf_counter()
        while self._wants_step(step, round_start):
            step += 1
            loss_sum += self._step(clock, grad_sync)
            if bar is not None:
                bar.update(1)
            if after_step is not None:
                after_step(step)
        self.groups.node_mean(loss_sum)
        self.round_steps = step
        return loss_sum

    def _wants_step(self, done: int, round_start: float) -> bool:
        """Another inner step this round? The plan's H_i, or an adaptive plan's rule (real/rounds/adaptive.py)."""
        if self.adaptive is None:
            return done < self.local_steps
        elapsed = time.perf_counter() - round_start
        if self.groups.me.gpus > 1 and self.adaptive.mode == "deadline":  # a node's devices decide together
            elapsed = self.groups.node_max(round(elapsed * 1e9)) / 1e9
        return self.adaptive.wants_step(done, elapsed)

    def _step(self, clock: RoundClock, grad_sync) -> torch.Tensor:
        """One inner step (its loss), padded to pad_step_s when given."""
        clock.step_start = step_start = time.perf_counter()
        lr = inner_lr(self.inner_step, self.diloco, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # Device j of the node reads samples j·b .. j·b + b − 1 of the node's next G·b.
        start = self.data_position + self.groups.local * self.batch
        batch = self.shard.batch(start, self.batch).to(self.groups.device, non_blocking=True)
        loss = train_step(self.model, self.optimizer, batch, self.dtype, self.scaler, grad_sync=grad_sync)
        self.data_position += self.node_batch
        self.inner_step += 1
        if self.pad_step_s is not None:
            step_target = self.pad_step_s * self.drift_factor
            self.groups.sync_device()
            if time.perf_counter() - step_start > step_target:
                clock.overruns += 1
            clock.deadline = max(clock.deadline, step_start) + step_target
            sleep_until(clock.deadline)
        return loss


@dataclass(frozen=True)
class NodeParts:
    """What a round works with, built once per process by real/process/worker.py."""

    plan: Plan
    me: NodePlan             # this node's row of the plan
    opts: ExecOptions
    diloco: DilocoConfig     # the outer step's lr and momentum
    groups: Groups           # this process's place: its node's group, the leaders'
    device: torch.device
    outer_device: torch.device  # where θ_g and the momentum live (the CPU with outer_state cpu on GPUs)
    model: torch.nn.Module
    layout: ShardLayout | None  # the node's sharding (real/core/sharding.py), or None
    outer: OuterState
    steps: InnerSteps
    cross: CrossNodeSync | None  # leaders: the cross-node average (real/core/sync.py)
    coef: float              # this node's averaging weight and the average's divisor (real/core/diloco.py)
    divisor: float
    grad_scale: float        # sync-ddp: b / B, this device's share of the global batch
    tokens_per_round: int
    members: tuple[int, ...]  # the plan indices of the nodes in the run (a continue run's current epoch)


def compute_phase(parts: NodeParts, bar) -> tuple[float, RoundClock, torch.Tensor, float]:
    """A DiLoCo-style round's first part: peak memory reset, the node's inner steps, the device
    synchronised; (round start, its clock, the loss summed over the steps, compute end)."""
    peak_memory_reset(parts.device)
    round_start = time.perf_counter()
    clock = RoundClock(deadline=round_start)
    loss_sum = parts.steps.run(clock, node_grad_sync(parts), bar)
    parts.groups.sync_device()
    return round_start, clock, loss_sum, time.perf_counter()


def node_grad_sync(parts: NodeParts):
    """The per-step gradient average of a DiLoCo or streaming round: in the node's group, when it
    has several devices and is not sharded (FSDP2 reduce-scatters the gradients itself)."""
    return parts.groups.average_gradients if parts.me.gpus > 1 and parts.layout is None else None


def round_row(parts: NodeParts, r: int, origin: Origin, loss_sum: torch.Tensor, clock: RoundClock, *,
              compute_s: float, idle_s: float, comm_s: float, start: float, end: float, bytes_sent: int) -> dict:
    """The node's trace.csv row of round r (peak memory: the largest of the node's processes, a
    collective of the node's group)."""
    steps = parts.steps.round_steps  # an adaptive round's own; the plan's otherwise
    me = parts.me if steps == parts.me.local_steps else replace(parts.me, local_steps=steps)
    return trace_row(parts.plan.strategy, me, r, compute_s=compute_s, idle_s=idle_s, comm_s=comm_s,
                     start_s=origin.at(start), end_s=origin.at(end),
                     loss=float(loss_sum.item()) / steps, tokens=parts.tokens_per_round // parts.me.local_steps * steps,
                     overruns=clock.overruns, bytes_sent=bytes_sent,
                     peak_mem_bytes=parts.groups.node_max(peak_memory_bytes(parts.device)))


class Round(ABC):
    """One kind of round; real/process/worker.py calls run() once per round, close() once at the end."""

    extra_columns: tuple[str, ...] = ()  # trace.csv's columns after the run columns, in this kind's rows
    progress: Progress | None = None  # the current round's, once it started
    # Whether retry_sync can finish a round whose sync failed; kinds whose syncs run between the inner
    # steps cannot, and run the round again from its start instead (real/membership/members.py)
    retries_sync: bool = False

    @classmethod
    def for_node(cls, parts: NodeParts, streaming, rounds: int) -> Round:
        """This kind's round for a node's parts (make_round); `streaming`: the Streaming DiLoCo settings,
        `rounds`: the run's rounds; a kind takes what it needs."""
        return cls(parts)

    def retry_sync(self, r: int, origin: Origin) -> dict:
        """Under --on-node-loss continue, after a failed sync and a new membership: sync round r again
        among the members, the inner steps kept; the round's trace row."""
        raise NotImplementedError(f"{type(self).__name__} runs a failed round again from its start")

    def state_dict(self) -> dict:
        """What the round keeps across rounds beyond the node's parts (checkpoints, a new membership)."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (nothing to load, unless a kind says)
        """Take back state_dict()'s state."""

    @abstractmethod
    def run(self, r: int, origin: Origin, bar=None) -> dict:
        """Round r: the node's inner steps and its syncs; returns the node's trace row. `bar`:
        a progress bar advanced once per inner step, or None."""

    def close(self) -> None:  # noqa: B027 (a default the rounds that run a thread override)
        """Stop what the round runs beside the main thread (nothing, unless it says)."""


def make_round(parts: NodeParts, streaming, rounds: int) -> Round:
    """The round of the node's kind (formats/rounds.py `round_class`, resolved here): its sync's, or, given
    Streaming DiLoCo settings (real/process/worker.py streaming_spec), the kind that syncs in fragments;
    `rounds` pushes per node for a round without a barrier."""
    kind = round_kind(parts.plan.sync, streaming is not None)
    return resolve_name(kind.round_class).for_node(parts, streaming, rounds)
