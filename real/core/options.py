"""How a plan is executed (ExecOptions), and the helpers every process of a run shares:
lost-peer errors (run_collective), the settings a resume must match, backend choice, sleep_until."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from formats.limits import check_threads
from formats.plan import Plan
from formats.rounds import RoundKind, round_kind, runs_in_fragments
from formats.sections import NODE_LOSS_POLICIES
from real.core.config import RunSpec
from real.core.streaming import StreamingSpec

WAN_MODES = ("loopback", "shaped")
ON_NODE_LOSS = NODE_LOSS_POLICIES  # [simulation] on_node_loss's values, as --on-node-loss


# The knock that names a lost node (real.wan.wan.LIVENESS_TIMEOUT_S, 2 s), printing, exiting and
# the launcher's teardown of the others and of the namespaces: measured 0.5-1 s beyond the knock.
SHAPED_STOP_BUDGET_S = 4.0


@dataclass(frozen=True)
class ExecOptions:
    """How to execute a plan (not what to train: that is RunSpec + Plan)."""

    out_dir: str
    emulate: bool = False
    time_scale: float = 1.0
    resume: bool = False
    data_path: str | None = None
    replicate_data: bool = False   # every node reads shard 0 (to check the arithmetic)
    timeout_s: float = 300.0       # how long a lost peer can stall us before we stop (collective_timeout_s)
    backend: str = "auto"          # auto | gloo | nccl
    stop_after: int | None = None  # stop cleanly after this many rounds (resumable)
    threads: int = 0               # torch threads per process; 0 = cores / local processes
    progress: bool = True
    checkpoint: bool = True
    # rounds between checkpoints; None: the scenario's [training] value, else Young/Daly
    checkpoint_every: int | None = None
    checkpoint_final: bool = False  # a set after the run's last round too (always with stop_after: resumable)
    summary: bool = True           # rank 0 prints per-node totals at the end
    wan: str = "loopback"          # loopback | shaped (real/wan/wan.py: node namespaces, shaped links)
    # Streaming DiLoCo settings that replace the plan's; given, the streaming loop runs even for
    # P = 1, τ = 0, α = 0 (which must then equal the classic loop bit for bit: a test's check).
    streaming: StreamingSpec | None = None
    # Injected drift (geodt run/validate from the scenario's nodes' drift, simulator/models/drift.py): per
    # plan node, per round, a step-time multiplier the node imposes on itself: under --emulate on the
    # padded step, for real on its CPU quota (cpu_quota / factor; real/process/worker.py _inject_drift).
    drift: tuple[tuple[float, ...], ...] | None = None
    # the quota's divisors where not drift's (cpu_quota_factor)
    drift_quota: tuple[tuple[float, ...], ...] | None = None
    # A node's process that dies: stop the run (exact --resume), or continue without it (real/membership/members.py).
    on_node_loss: str = "stop"
    # continue: restart a lost node's process this many seconds after it died (once), to rejoin; None: never.
    rejoin_after_s: float | None = None
    # Injected outages (geodt run/validate from the scenario's [[nodes]] outage, simulator/models/outage.py): per
    # lost node (plan index, round, rounds): its process SIGKILLs itself at that round's start, is restarted
    # at once and is admitted no earlier than round + rounds (real/membership/members.py). Continue runs only.
    outage: tuple[tuple[int, int, int], ...] | None = None
    # --host 0.0.0.0 (every interface) is refused unless asked for: the rendezvous is unauthenticated.
    allow_any_host: bool = False

    def collective_timeout_s(self) -> float:
        """The process groups' timeout. On the shaped WAN a node that times out first knocks on
        its peers to name whom it lost, then stops: SHAPED_STOP_BUDGET_S of --timeout-s is kept
        for that, so the run stops within --timeout-s of losing a peer."""
        if self.wan != "shaped":
            return self.timeout_s
        return max(min(self.timeout_s, 1.0), self.timeout_s - SHAPED_STOP_BUDGET_S)

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"--time-scale: expected a finite positive number, got {self.time_scale}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)) or self.timeout_s > 7 * 86400:
            raise ValueError(f"--timeout-s: expected a positive number of seconds up to a week, got {self.timeout_s}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"--backend: expected auto, gloo or nccl, got {self.backend!r}")
        if self.stop_after is not None and self.stop_after <= 0:
            raise ValueError(f"--stop-after: expected a positive number of rounds, got {self.stop_after}")
        if self.wan not in WAN_MODES:
            raise ValueError(f"--wan: expected {' or '.join(WAN_MODES)}, got {self.wan!r}")
        if any(table is not None and not all(f > 0 for row in table for f in row)
               for table in (self.drift, self.drift_quota)):
            raise ValueError("drift: expected positive step-time multipliers")
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or every <= 0):
            raise ValueError(f"--checkpoint-every: expected a positive number of rounds, got {self.checkpoint_every}")
        if self.on_node_loss not in ON_NODE_LOSS:
            raise ValueError(f"--on-node-loss: expected {' or '.join(ON_NODE_LOSS)}, got {self.on_node_loss!r}")
        if self.rejoin_after_s is not None:
            if self.on_node_loss != "continue":
                raise ValueError("--rejoin-after-s: a lost node rejoins only under --on-node-loss continue")
            if not (0 <= self.rejoin_after_s < 86400):
                raise ValueError(f"--rejoin-after-s: expected seconds from 0 to a day, got {self.rejoin_after_s}")
        if self.outage is not None and self.on_node_loss != "continue":
            raise ValueError("outage: a node's injected loss runs under --on-node-loss continue only")

        if check_threads(self.threads):
            raise ValueError(f"--threads: {check_threads(self.threads)}")


class PeerLost(RuntimeError):
    """A collective failed: a peer died or the network broke."""


def resolve_backend(backend: str, local_world: int) -> str:
    if backend != "auto":
        return backend
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    return "nccl" if cuda else "gloo"


def sleep_until(deadline: float) -> None:
    """Sleep until time.perf_counter() reaches `deadline` (no sleep when it has)."""
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


def run_collective(fn, *args, **kwargs):
    """fn(*args, **kwargs), a collective; a lost peer surfaces as PeerLost."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, dist.DistError) as exc:  # gloo/nccl report a lost peer as these
        raise PeerLost(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from exc


def run_kind(plan: Plan, opts: ExecOptions) -> RoundKind:
    """The kind of round the executor runs the plan as (formats/rounds.py): its sync's, in fragments where
    the registry says it runs them so (`runs_in_fragments`: the plan's Streaming DiLoCo settings, or
    ExecOptions.streaming forcing the streaming loop)."""
    return round_kind(plan.sync, runs_in_fragments(StreamingSpec.from_plan(plan), opts.streaming))


def run_config(spec: RunSpec, plan: Plan, opts: ExecOptions) -> dict:
    """The settings a resumed run must share with the run that wrote the checkpoints."""
    config = {"seed": spec.seed, "model.preset": spec.model.preset, "model.seq_len": spec.model.seq_len,
              "model.dtype": spec.model.dtype, "training.rounds": plan.rounds, "collective": plan.collective,
              "sync": plan.sync,
              "payload_dtype": plan.payload_dtype, "data": opts.data_path or "", "replicate_data": opts.replicate_data}
    for key, value in asdict(spec.diloco).items():
        config[f"diloco.{key}"] = list(value) if isinstance(value, tuple) else value
    config.update((opts.streaming or StreamingSpec.from_plan(plan)).config())
    return config
