"""The registry of round kinds: what each kind of round is, has and supports, for the simulator and the executor.

A plan's kind of round follows from its sync column and its Streaming DiLoCo settings (`round_kind`):
diloco (classic DiLoCo: H_i inner steps, a barrier, one all-reduce of pseudo-gradients), gradients
(sync-ddp: every step's gradients averaged), streaming (DiLoCo whose model syncs in fragments that
overlap compute), async (a server applies each node's pseudo-gradient on arrival) and quorum (a round
closed by a share of the nodes within a grace window). Each entry names the code that times it
(`engine`, in simulator/engines/) and the code that runs it (`round_class`, in real/rounds/) as
"module:Class" paths, which each stage resolves itself (pkgutil.resolve_name): formats imports
neither stage. Where code differs by kind it asks the registry (`kind.barrier`,
`kind.supports("sharding")`, `kind.refusals[...]`, `kind.state_key`), not the kind's name or a
kind-shaped flag (tests/test_round_kinds.py counts such branches outside this module: none); whether
the executor runs a plan in fragments is decided here too (`runs_in_fragments`). docs/DESIGN.md "How
to add a kind of round or a strategy" lists the files a new kind touches.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

# What a kind may support, each with what it means (a kind's `supports` is a subset).
CAPABILITIES = MappingProxyType({
    "sharding": "a node's devices shard the model (zero1, zero2, fsdp: real/core/sharding.py)",
    "continue": "--on-node-loss continue: the others go on past a lost node (real/membership/members.py)",
    "outage": "the simulator prices a node's [[nodes]] outage (simulator/models/outage.py)",
    "adapt": "rounds re-plan themselves while they run (adapt = rebalance / deadline, formats/adaptive.py)",
    "fragments": "Streaming DiLoCo's fragment syncs: the executor's streaming loop (real/rounds/round_streaming.py)",
    "outer_on_cpu": "the outer state and the leaders' cross-node average in host memory (outer_state = cpu)",
    "padded_steps": "--emulate pads the inner loop's steps to the plan's step_s (sync-ddp pads in its gradient hook)",
    "node_offsets": "each node's own end of the plan's all-reduce, where a network profile measured it",
    "replicated": "every node keeps the same inner optimizer state (synchronous data parallel): a joiner takes it",
    "torchft": "`geodt plan --export torchft` writes it as torchft's DiLoCo (geodt/torchft_export.py)",
})
CHECKPOINTS = ("round", "cut")  # a set after a round's barrier, or a consistent cut at the nodes' pulls


@dataclass(frozen=True)
class RoundKind:
    """One kind of round: its name, shape, capabilities and the code each stage runs it with."""

    name: str
    sync: str  # plan.csv's sync column for it (streaming is sync diloco with fragments or a delay)
    doc: str  # one line: what a round of this kind does
    title: str  # how messages name its rounds ("quorum rounds")
    barrier: bool  # every node's round ends together: the others wait for the slowest
    streams: tuple[str, ...]  # what travels between the nodes in a round, in order
    analytic: bool  # the simulator has an exact analytic path (else SimPy's events only)
    outer_step: bool  # an outer optimizer step follows each sync (DiLoCo's outer SGD)
    checkpoints: str  # of CHECKPOINTS
    engine: str  # simulator/engines' "module:Class" that times it
    round_class: str  # real/rounds' "module:Class" that runs it
    capabilities: frozenset[str] = frozenset()
    settings: tuple[str, ...] = ()  # plan.csv columns only this kind reads (empty for the others)
    # capability -> the reason printed where a run asks for what the kind does not support
    refusals: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    sync_unit: str = "round"  # what one comm_s of the plan is (str.format'ed with the plan's fields)
    analytic_why: str = ""  # without an analytic path: why SimPy's events are needed
    # node.pt's entry of the state a node's round keeps across rounds (its Round's state_dict: a streaming
    # round's model weights and fragment rows, a cut's last pull), or None where it keeps none
    state_key: str | None = None

    def __post_init__(self) -> None:
        unknown = (set(self.capabilities) | set(self.refusals)) - set(CAPABILITIES)
        if unknown or self.checkpoints not in CHECKPOINTS:
            raise ValueError(f"round kind {self.name}: unknown capability or checkpoints {sorted(unknown)}")
        object.__setattr__(self, "refusals", MappingProxyType(dict(self.refusals)))

    def supports(self, capability: str) -> bool:
        """Whether this kind supports `capability` (a key of CAPABILITIES; KeyError for another)."""
        if capability not in CAPABILITIES:
            raise KeyError(f"unknown capability {capability!r}; expected one of {', '.join(CAPABILITIES)}")
        return capability in self.capabilities

    def sync_text(self, plan) -> str:
        """What one of the plan's comm_s is, for `geodt simulate`'s per-strategy heading."""
        return self.sync_unit.format(fragments=plan.fragments, sync_delay_steps=plan.sync_delay_steps)


KINDS = MappingProxyType({kind.name: kind for kind in (
    RoundKind("diloco", "diloco", "H_i inner steps, a barrier, one all-reduce of the pseudo-gradients, the outer step",
              "DiLoCo rounds", barrier=True, streams=("pseudo-gradients (all-reduce)",), analytic=True,
              outer_step=True, checkpoints="round",
              engine="simulator.engines.rounds_barrier:BarrierRounds",
              round_class="real.rounds.round_classic:ClassicRound",
              capabilities=frozenset({"sharding", "continue", "outage", "adapt", "outer_on_cpu", "padded_steps",
                                   "node_offsets", "torchft"})),
    RoundKind("gradients", "gradients", "synchronous data parallel (sync-ddp): every step's gradients averaged",
              "sync-ddp rounds", barrier=True, streams=("gradients (all-reduce, every step)",), analytic=True,
              outer_step=False, checkpoints="round",
              engine="simulator.engines.rounds_barrier:BarrierRounds",
              round_class="real.rounds.round_ddp:GradientRound",
              capabilities=frozenset({"continue", "replicated"}),
              refusals={"sharding": "sync = gradients (sync-ddp)", "fragments": "sync = gradients syncs every step"}),
    RoundKind("streaming", "diloco", "Streaming DiLoCo: the model syncs in P fragments, each overlapping τ inner steps",
              "Streaming DiLoCo rounds", barrier=True, streams=("fragment pseudo-gradients (all-reduce, overlapped)",),
              analytic=True, outer_step=True, checkpoints="round",
              engine="simulator.engines.rounds_streaming:StreamingRounds",
              round_class="real.rounds.round_streaming:StreamingRound",
              capabilities=frozenset({"continue", "fragments", "padded_steps", "node_offsets", "torchft"}),
              refusals={"sharding": "Streaming DiLoCo fragments"}, state_key="streaming",
              sync_unit="fragment, {fragments} a round, all-reduces overlapping {sync_delay_steps} inner steps"),
    RoundKind("async", "async", "no barrier: a server on rank 0 applies each node's pseudo-gradient on arrival; "
              "the node pulls the new weights and goes on", "async rounds", barrier=False,
              streams=("pseudo-gradient (push)", "global weights (pull)"), analytic=True, outer_step=True,
              checkpoints="cut",
              engine="simulator.engines.rounds_server:AsyncRounds",
              round_class="real.rounds.round_async:AsyncRound",
              capabilities=frozenset({"outer_on_cpu", "padded_steps"}),
              refusals={"sharding": "an async node pushes its whole replica",
                        "fragments": "an async node pushes whole rounds",
                        "continue": "a lost node stops an async run (the server waits for its pushes)"},
              state_key="async",
              sync_unit="node and round (push, outer step, pull; the server free)"),
    RoundKind("quorum", "quorum", "no barrier: a round closes when a share of the nodes arrived, plus a grace window",
              "quorum rounds", barrier=False, streams=("pseudo-gradient (push)", "global weights (pull)"),
              analytic=False, outer_step=True, checkpoints="cut",
              engine="simulator.engines.rounds_server:QuorumRounds",
              round_class="real.rounds.round_quorum:QuorumRound",
              capabilities=frozenset({"outer_on_cpu", "padded_steps"}), settings=("quorum", "grace_s"),
              refusals={"sharding": "a quorum node pushes its whole replica",
                        "fragments": "a quorum node pushes whole rounds",
                        "continue": "a lost node stops a quorum run (the server waits for its pushes)"},
              state_key="quorum",
              analytic_why="quorum rounds close on arrivals and grace windows: SimPy's events"),
)})
# plan.csv's sync values, each kind's own (streaming shares diloco's)
SYNC_MODES = tuple(dict.fromkeys(kind.sync for kind in KINDS.values()))


def is_streaming(fragments, sync_delay_steps):
    """Whether a plan's syncs split the model or overlap compute (Streaming DiLoCo): numpy booleans,
    elementwise on arrays."""
    return (np.asarray(fragments) > 1) | (np.asarray(sync_delay_steps) > 0)


def runs_in_fragments(settings=None, forced=None) -> bool:
    """Whether the executor runs a plan's rounds in fragments, as the kind of its sync that syncs in them
    (`round_kind`; real/core/options.py run_kind): wherever it forces its streaming loop (`forced`: its own
    Streaming DiLoCo settings, ExecOptions.streaming, which replace the plan's; any, P = 1, τ = 0, α = 0
    too: the loop then checks itself against the classic one bit for bit), or where `settings` (the
    plan's: fragments, sync_delay_steps, fragment_alpha; None: the forcing alone) are not classic
    DiLoCo's: they stream (`is_streaming`) or merge the fragments with α ≠ 0."""
    if forced is not None:
        return True
    return settings is not None and (bool(is_streaming(settings.fragments, settings.sync_delay_steps))
                                     or settings.fragment_alpha != 0.0)


def kind_problem(sync: str | None, fragments: int, sync_delay_steps: int, adapt: str | None) -> tuple[str, str] | None:
    """(key, what was expected) where a plan's sync, Streaming DiLoCo settings and adapt ask its kind of
    round for what it does not support, else None (formats/plan.py's check)."""
    kind = round_kind(sync, is_streaming(fragments, sync_delay_steps))
    if not kind.barrier and (is_streaming(fragments, sync_delay_steps) or adapt):
        return "sync", (f"sync = {kind.sync} runs whole rounds without a barrier; expected classic DiLoCo rounds "
                        "(fragments 1, sync_delay_steps 0, adapt none)")
    if adapt and not kind.supports("adapt"):
        return "adapt", (f"adapt = {adapt} re-plans whole DiLoCo rounds; expected classic DiLoCo (fragments 1, "
                         "sync_delay_steps 0, sync diloco)")
    if is_streaming(fragments, sync_delay_steps) and not kind.supports("fragments"):
        return "fragments", (f"{kind.refusals['fragments']}; expected fragments 1 and sync_delay_steps 0, got "
                             f"{fragments} and {sync_delay_steps}")
    return None


def round_kind(sync: str | None, fragments=False) -> RoundKind:
    """The kind of round of a plan's sync column (None = diloco) and whether it syncs in fragments
    (`is_streaming`; the executor also when it forces its streaming loop): the sync's own kind, or with
    fragments the kind of the same sync that syncs in them (diloco's: streaming) where it has one.
    KeyError for an unknown sync."""
    sync = sync or "diloco"
    if sync not in SYNC_MODES:
        raise KeyError(sync)
    own = KINDS[sync]
    if not fragments:
        return own
    return next((k for k in KINDS.values() if k.sync == sync and k.supports("fragments")), own)


def kinds_table() -> str:
    """docs/DESIGN.md's table of the kinds of round, rendered from KINDS (tests/test_round_kinds.py)."""
    rows = ["| kind | sync | what a round does | travels | barrier | analytic | checkpoints | supports |",
            "|---|---|---|---|---|---|---|---|"]
    for k in KINDS.values():
        supports = ", ".join(c for c in CAPABILITIES if k.supports(c)) or "none"
        rows.append(f"| `{k.name}` | {k.sync} | {k.doc} | {'; '.join(k.streams)} | {'yes' if k.barrier else 'no'} | "
                    f"{'yes' if k.analytic else 'no (SimPy)'} | {k.checkpoints} | {supports} |")
    return "\n".join(rows)
