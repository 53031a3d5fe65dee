"""The plan schema: plan.csv's columns, the Plan/NodePlan dataclasses, parsing and validation.

The one contract between the planner (`simulator`, which builds Plans) and the executor
(`real`, which runs them). Torch-free and simulator-free, so both sides import it.

plan.csv, one row per node (plan order = rank order, see real/process/launch.py):

    strategy          the strategy that made the plan (same on every row)
    node              node name (unique)
    gpus              devices of the node G_i (the executor runs G_i processes)
    batch_size        b_i, per device
    local_steps       H_i, inner steps per round
    step_s            predicted seconds of one inner step
    tokens_per_round  H_i · b_i · G_i · seq_len
    comm_s            predicted seconds of one outer sync (same on every row)
    rounds            outer rounds to run (the strategy's, else the scenario's)
    collective        ring | partitioned (same on every row)
    payload_dtype     fp32 | fp16 | int8: what the pseudo-gradients travel as (same on every row)
    sync              diloco (default: H inner steps, then the outer sync of pseudo-gradients)
                      | gradients (synchronous data parallel, sync-ddp: every step's gradients
                      averaged over all devices, weighted by batch; no outer step)
                      | async | quorum: rounds without DiLoCo's barrier (each kind of round, what
                      it supports and the code each stage runs it with: formats/rounds.py)
    link_gbps         the node's WAN link (min of network bandwidth and its uplink); sets its
                      share of a partitioned all-reduce
    cpu_cores         optional: core indices for the node's processes, space-separated ("0 1");
                      with at least G cores device process j gets cores[j::G], else all share them
    cpu_quota         optional: CPU quota per device process, in cores (0.4 = 40% of one core)
    sharding          none | zero1 | zero2 | fsdp: how the node's G devices divide the training
                      state (none: every device a whole replica, DDP; zero1: AdamW moments /G;
                      zero2: + gradients /G; fsdp: + parameters /G, FSDP2 `fully_shard` per
                      layer); never "auto" (the planner writes what it chose). The executor
                      runs zero1 as zero2 (real/core/sharding.py says why)
    activation_checkpointing  none | full: full = every decoder layer recomputed in backward
                      (only the layer inputs kept)
    outer_state       cpu | device: where each device process keeps its DiLoCo global weights
                      and outer momentum (its 1/G shard of them when sharded; same on every row)
    fragments         P, Streaming DiLoCo's fragments (1 = classic DiLoCo; same on every row)
    sync_delay_steps  τ, inner steps a fragment's all-reduce overlaps (0 = blocking; same on every row)
    fragment_alpha    α, the merge θ = (1 − α)·θ_global + α·θ_local (same on every row)
    fragment_pattern  sequential | strided: how layers are grouped into fragments (same on every row)
    adapt             none | rebalance | deadline: rounds that re-plan themselves while they run
                      (formats/adaptive.py; the row's local_steps are round 0's; same on every row)
    quorum            sync = quorum only: the share of the nodes whose arrival closes a round (0 < q ≤ 1;
                      same on every row); empty otherwise
    grace_s           sync = quorum only: seconds a round stays open after its quorum arrived (same on
                      every row); empty otherwise

The first eight columns are required; for the others a missing column or an empty cell means
the scenario's value (rounds; [network] collective and payload_dtype, else ring and fp32),
equal links, no CPU limits, sharding none, activation_checkpointing none, outer_state cpu
(the scenario's [diloco] outer_state), and classic DiLoCo (fragments 1, sync_delay_steps 0,
fragment_alpha 0.0, fragment_pattern sequential), adapt none, no quorum. `geodt run` and `geodt plan`
write every column.

Streaming DiLoCo (arXiv 2501.18512; torchft.local_sgd.DiLoCo, whose semantics these are;
real/core/streaming.py runs it): the model's layers form P fragments (`sequential`: consecutive
layers; `strided`: layer l in fragment l mod P) and each round syncs them one after the other,
fragment p (0-based) at its merge point, the end of inner step m_p = ⌊H_i·(p + 1) / P⌋ of the
round (`merge_steps`; torchft's H/P, 2H/P, ... when P divides H). The fragment's pseudo-gradient
is taken and its all-reduce started τ steps earlier, after step m_p − τ, and runs while those τ
steps compute; at the merge point the node waits for it, applies the outer step to the fragment
and merges θ = (1 − α)·θ_global + α·θ_local (torch's lerp, as torchft's `fragment_update_alpha`,
whose default 0 keeps the global weights: the τ steps' local progress on the fragment is
dropped). Valid: 1 ≤ P ≤ H_i and 0 ≤ τ < ⌊H_i / P⌋ on every node (a fragment's all-reduce is
merged before the next one starts, as torchft requires), 0 ≤ α ≤ 1; P = 1 and τ = 0 is classic
DiLoCo; sync = gradients only with P = 1 and τ = 0. comm_s is then one fragment's sync.
"""
from __future__ import annotations

import csv
import math
import numbers
from dataclasses import dataclass, field, replace
from pathlib import Path

from formats.rounds import SYNC_MODES, RoundKind, is_streaming, kind_problem, round_kind
from formats.wire import COLLECTIVES, PAYLOAD_BYTES, node_link_gbps

REQUIRED_COLUMNS = ("strategy", "node", "gpus", "batch_size", "local_steps", "step_s", "tokens_per_round",
                    "comm_s")
OPTIONAL_COLUMNS = ("rounds", "collective", "payload_dtype", "sync", "link_gbps", "cpu_cores", "cpu_quota",
                    "sharding", "activation_checkpointing", "outer_state", "fragments", "sync_delay_steps",
                    "fragment_alpha", "fragment_pattern", "adapt", "quorum", "grace_s")
PLAN_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
STREAMING_COLUMNS = ("fragments", "sync_delay_steps", "fragment_alpha", "fragment_pattern")
FRAGMENT_PATTERNS = ("sequential", "strided")
__all__ = ["SYNC_MODES"]  # formats/rounds.py's: plan.csv's sync values, one per kind of round (streaming: diloco)
SHARDINGS = ("none", "zero1", "zero2", "fsdp")  # least to most sharded
CHECKPOINTING = ("none", "full")
OUTER_STATES = ("cpu", "device")
ADAPT_MODES = ("none", "rebalance", "deadline")


def quorum_need(share: float, nodes: int) -> int:
    """Nodes whose arrival closes a quorum round: ⌈share·n⌉, at least 1 (the simulator and the executor)."""
    return max(1, math.ceil(share * nodes - 1e-9))


class PlanError(ValueError):
    """A bad plan; str() names the key (and the file/line when read from one)."""

    def __init__(self, key: str, expected: str):
        super().__init__(f"{key}: {expected}")
        self.key, self.expected = key, expected


def _int(key: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise PlanError(key, f"expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _real(key: str, value, allow_zero: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value < 0 if allow_zero else value <= 0):
        raise PlanError(key, f"expected a finite {'non-negative' if allow_zero else 'positive'} number, got {value!r}")
    return float(value)


def _choice(key: str, value, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise PlanError(key, f"expected one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class QuorumSettings:
    """sync = quorum's own settings, the plan's `quorum` (plan.csv's quorum and grace_s columns, same on every
    row): the share of the nodes whose arrival closes a round (0 < share ≤ 1; `quorum_need` counts them) and
    the seconds a round stays open after its quorum arrived. The Plan checks them (`checked`) once it knows
    its kind of round: settings given to another kind are refused as such, whatever their values."""

    share: float
    grace_s: float

    def checked(self) -> QuorumSettings:
        """These settings with their values checked (PlanError naming the column) and made floats."""
        q = self.share
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 < q <= 1:
            raise PlanError("quorum", f"expected a share of the nodes in (0, 1], got {q!r}")
        return QuorumSettings(float(q), _real("grace_s", self.grace_s, allow_zero=True))

    @classmethod
    def from_columns(cls, quorum, grace_s) -> QuorumSettings | None:
        """The settings of plan.csv's quorum and grace_s cells (None: empty); None where both are empty."""
        return None if quorum is None and grace_s is None else cls(quorum, grace_s)


@dataclass(frozen=True)
class SyncSettings:
    """What a plan's rounds run with once its scenario fills what the plan leaves open (Plan.settings_from):
    the simulator and the tools read these rather than merging a plan value with its scenario's themselves."""

    rounds: int
    collective: str
    payload_dtype: str


@dataclass(frozen=True)
class NodePlan:
    """One node's part of a plan (batch_size is per device)."""

    node: str
    gpus: int
    batch_size: int
    local_steps: int
    step_s: float  # t_i(b_i): one inner step at this node's batch
    link_gbps: float | None = None
    cpu_cores: tuple[int, ...] | None = None
    cpu_quota: float | None = None
    sharding: str | None = None  # None = "none" (resolved())
    activation_checkpointing: str | None = None  # None = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.node, str) or not self.node:
            raise PlanError("node", f"expected a non-empty node name, got {self.node!r}")
        set_ = lambda k, v: object.__setattr__(self, k, v)  # frozen: normalise numpy scalars
        set_("gpus", _int("gpus", self.gpus))
        set_("batch_size", _int("batch_size", self.batch_size))
        set_("local_steps", _int("local_steps", self.local_steps))
        set_("step_s", _real("step_s", self.step_s))
        if self.link_gbps is not None:
            set_("link_gbps", _real("link_gbps", self.link_gbps))
        if self.cpu_cores is not None:
            cores = tuple(self.cpu_cores)
            if not cores:
                raise PlanError("cpu_cores", "expected at least one core index (or none for no pinning)")
            set_("cpu_cores", tuple(_int("cpu_cores", c, minimum=0) for c in cores))
        if self.cpu_quota is not None:
            set_("cpu_quota", _real("cpu_quota", self.cpu_quota))
        _choice("sharding", self.sharding, SHARDINGS)
        _choice("activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)

    def tokens_per_round(self, seq_len: int) -> int:
        return self.local_steps * self.batch_size * self.gpus * seq_len

    @property
    def compute_s(self) -> float:
        return self.local_steps * self.step_s


@dataclass(frozen=True)
class Plan:
    """Per node b_i and H_i, plus how the nodes sync. None = the scenario's value (resolved())."""

    strategy: str
    nodes: tuple[NodePlan, ...]
    comm_s: float  # one outer sync
    seq_len: int
    note: str = ""  # what the strategy decided and why, for the printed report
    # Overrides of the scenario for strategies that change how often or how the nodes sync:
    # sync-ddp syncs every step (rounds = R × H), network-aware picks collective and payload.
    rounds: int | None = None
    collective: str | None = None
    payload_dtype: str | None = None
    sync: str | None = None  # None = "diloco"; sync-ddp sets "gradients"
    outer_state: str | None = None  # None = the scenario's [diloco] outer_state, else "cpu"
    # Streaming DiLoCo (module docstring); the defaults are classic DiLoCo.
    fragments: int = 1
    sync_delay_steps: int = 0
    fragment_alpha: float = 0.0
    fragment_pattern: str = "sequential"
    adapt: str | None = None  # None = "none": every round runs the plan's H_i (formats/adaptive.py)
    # sync = quorum's own settings (the share of nodes that closes a round, the grace window after it); None
    # for every other kind
    quorum: QuorumSettings | None = None
    _index: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise PlanError("node", "expected at least one node")
        index = {n.node: i for i, n in enumerate(self.nodes)}
        if len(index) != len(self.nodes):
            raise PlanError("node", f"expected unique node names, got {[n.node for n in self.nodes]}")
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "comm_s", _real("comm_s", self.comm_s, allow_zero=True))
        object.__setattr__(self, "seq_len", _int("seq_len", self.seq_len))
        if self.rounds is not None:
            object.__setattr__(self, "rounds", _int("rounds", self.rounds))
        if self.collective is not None and self.collective not in COLLECTIVES:
            raise PlanError("collective", f"expected one of {', '.join(COLLECTIVES)}, got {self.collective!r}")
        if self.payload_dtype is not None and self.payload_dtype not in PAYLOAD_BYTES:
            raise PlanError("payload_dtype", f"expected one of {', '.join(PAYLOAD_BYTES)}, got {self.payload_dtype!r}")
        if self.sync is not None and self.sync not in SYNC_MODES:
            raise PlanError("sync", f"expected one of {', '.join(SYNC_MODES)}, got {self.sync!r}")
        _choice("outer_state", self.outer_state, OUTER_STATES)
        _choice("adapt", self.adapt, ADAPT_MODES)
        if self.adapt == "none":  # plan.csv spells None so (one value per plan, however read)
            object.__setattr__(self, "adapt", None)
        self._check_fragments()
        self._check_settings(self.round_kind)

    def _check_settings(self, kind: RoundKind) -> None:
        """A kind's own settings (QuorumSettings, of the columns formats/rounds.py `settings` names) given with
        it only, their values checked."""
        q = self.quorum
        if q is not None and not isinstance(q, QuorumSettings):
            raise PlanError("quorum", f"expected QuorumSettings(share, grace_s), got {q!r}")
        if "quorum" in kind.settings:
            object.__setattr__(self, "quorum", (q or QuorumSettings(None, None)).checked())
        elif q is not None:
            raise PlanError("quorum", f"quorum and grace_s belong to sync = quorum; got sync {self.sync or 'diloco'}")

    def _check_fragments(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # frozen: normalise numpy scalars
        set_("fragments", _int("fragments", self.fragments))
        set_("sync_delay_steps", _int("sync_delay_steps", self.sync_delay_steps, minimum=0))
        alpha = self.fragment_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha <= 1:
            raise PlanError("fragment_alpha", f"expected a number in [0, 1], got {alpha!r}")
        set_("fragment_alpha", float(alpha))
        if self.fragment_pattern not in FRAGMENT_PATTERNS:
            raise PlanError("fragment_pattern",
                            f"expected one of {', '.join(FRAGMENT_PATTERNS)}, got {self.fragment_pattern!r}")
        problem = kind_problem(self.sync, self.fragments, self.sync_delay_steps, self.adapt)
        if problem is not None:  # what the plan's kind of round does not support (formats/rounds.py)
            raise PlanError(*problem)
        problem = fragment_problem([n.local_steps for n in self.nodes], self.fragments, self.sync_delay_steps)
        if problem is not None:
            key, i, expected = problem
            raise PlanError(key, f"node {self.nodes[i].node} (local_steps {self.nodes[i].local_steps}): {expected}")

    @property
    def streaming(self) -> bool:
        """Whether the plan's syncs overlap compute or split the model (Streaming DiLoCo's settings)."""
        return bool(is_streaming(self.fragments, self.sync_delay_steps))

    @property
    def round_kind(self) -> RoundKind:
        """The plan's kind of round (formats/rounds.py): its sync, in fragments where it streams."""
        return round_kind(self.sync, self.streaming)

    @property
    def adaptive(self) -> bool:
        """Whether rounds re-plan themselves while they run (adapt rebalance or deadline)."""
        return self.adapt not in (None, "none")

    def index(self, name: str) -> int:
        return self._index[name]

    @property
    def tokens_per_round(self) -> int:
        return sum(n.tokens_per_round(self.seq_len) for n in self.nodes)

    @property
    def round_s(self) -> float:
        """Deterministic round time with nothing overlapped: the slowest node's compute plus its
        syncs (P fragment syncs of comm_s each). Exact for classic DiLoCo; the engines give the
        streaming round, in which the all-reduces overlap compute."""
        return max(n.compute_s for n in self.nodes) + self.fragments * self.comm_s

    @property
    def world_size(self) -> int:
        """Processes that run the plan: one per device."""
        return sum(n.gpus for n in self.nodes)

    def first_rank(self, index: int) -> int:
        """Global rank of node `index`'s leader: ranks go to nodes in plan order, G_i each."""
        return sum(n.gpus for n in self.nodes[:index])

    def ranks(self, index: int) -> range:
        """Global ranks of node `index`'s processes (its leader first)."""
        first = self.first_rank(index)
        return range(first, first + self.nodes[index].gpus)

    def node_of_rank(self, rank: int) -> int:
        start = 0
        for i, n in enumerate(self.nodes):
            if rank < start + n.gpus:
                return i
            start += n.gpus
        raise PlanError("rank", f"rank {rank} is beyond the plan's {self.world_size} processes")

    def settings(self, rounds: int, collective: str = "ring", payload_dtype: str = "fp32") -> SyncSettings:
        """How the plan's rounds sync: its own rounds, collective and payload dtype, else the given defaults.
        The one place a plan's value and its scenario's merge (tests/test_plan_settings.py keeps it so)."""
        own_or = lambda own, default: default if own is None else own
        return SyncSettings(own_or(self.rounds, rounds), own_or(self.collective, collective),
                            own_or(self.payload_dtype, payload_dtype))

    def settings_from(self, scenario) -> SyncSettings:
        """settings() with a scenario's defaults: any object with training.rounds and
        network.{collective, payload_dtype} (a simulator Scenario, a run's spec)."""
        net = scenario.network
        return self.settings(scenario.training.rounds, net.collective, net.payload_dtype)

    def resolved(self, rounds: int, collective: str = "ring", payload_dtype: str = "fp32",
                 link_gbps: dict[str, float] | None = None, outer_state: str = "cpu") -> Plan:
        """A copy with every None filled from the given defaults (the plan's own values win)."""
        links = link_gbps or {}
        nodes = tuple(replace(n, link_gbps=links.get(n.node) if n.link_gbps is None else n.link_gbps,
                              sharding=n.sharding or "none",
                              activation_checkpointing=n.activation_checkpointing or "none")
                      for n in self.nodes)
        sync = self.settings(rounds, collective, payload_dtype)
        return replace(self, nodes=nodes, rounds=sync.rounds, collective=sync.collective,
                       payload_dtype=sync.payload_dtype, sync=self.sync or "diloco",
                       outer_state=self.outer_state or outer_state)

    def resolved_from(self, scenario) -> Plan:
        """resolved() with a scenario's defaults: any object with training.rounds,
        network.{collective, payload_dtype, bandwidth_gbps}, nodes[*].{name, uplink_gbps} and
        optionally diloco.outer_state."""
        net = scenario.network
        links = {n.name: node_link_gbps(net.bandwidth_gbps, getattr(n, "uplink_gbps", None)) for n in scenario.nodes}
        outer = getattr(getattr(scenario, "diloco", None), "outer_state", None) or "cpu"
        return self.resolved(scenario.training.rounds, net.collective, net.payload_dtype, links, outer)

    def rows(self) -> list[dict]:
        """plan.csv's rows (empty cells for values left to the scenario)."""
        blank = lambda v: "" if v is None else v
        q = self.quorum
        return [{"strategy": self.strategy, "node": n.node, "gpus": n.gpus, "batch_size": n.batch_size,
                 "local_steps": n.local_steps, "step_s": n.step_s, "tokens_per_round": n.tokens_per_round(self.seq_len),
                 "comm_s": self.comm_s, "rounds": blank(self.rounds), "collective": blank(self.collective),
                 "payload_dtype": blank(self.payload_dtype), "sync": blank(self.sync), "link_gbps": blank(n.link_gbps),
                 "cpu_cores": "" if n.cpu_cores is None else " ".join(map(str, n.cpu_cores)),
                 "cpu_quota": blank(n.cpu_quota), "sharding": blank(n.sharding),
                 "activation_checkpointing": blank(n.activation_checkpointing),
                 "outer_state": blank(self.outer_state), "fragments": self.fragments,
                 "sync_delay_steps": self.sync_delay_steps, "fragment_alpha": self.fragment_alpha,
                 "fragment_pattern": self.fragment_pattern, "adapt": self.adapt or "none",
                 "quorum": "" if q is None else q.share, "grace_s": "" if q is None else q.grace_s}
                for n in self.nodes]

    def to_frame(self, scenario=None):
        """plan.csv as a DataFrame; with a scenario, every value resolved (what `geodt run` runs)."""
        # deferred: every command's parser reads formats.plan; pandas only to write one
        import pandas as pd  # noqa: PLC0415
        plan = self if scenario is None else self.resolved_from(scenario)
        return pd.DataFrame(plan.rows(), columns=list(PLAN_COLUMNS))


# --- plan.csv ---------------------------------------------------------------------------

def merge_steps(local_steps: int, fragments: int) -> list[int]:
    """Per fragment p, the inner step of a round after which it merges: ⌊H·(p + 1) / P⌋ (module docstring)."""
    return [local_steps * (p + 1) // fragments for p in range(fragments)]


def fragment_problem(local_steps: list[int], fragments: int, delay_steps: int) -> tuple[str, int, str] | None:
    """(key, node index, what was expected) for the first node whose H_i cannot hold the schedule; else None.

    Every fragment needs at least one step of a round (P ≤ H_i), and a fragment's all-reduce must
    start after the previous fragment merged (τ < ⌊H_i / P⌋, torchft's rule)."""
    for i, steps in enumerate(local_steps):
        if fragments > steps:
            return "fragments", i, f"expected at most local_steps fragments, got {fragments}"
        if delay_steps >= steps // fragments:
            return ("sync_delay_steps", i, (f"expected sync_delay_steps < local_steps // fragments = "
                    f"{steps // fragments}, got {delay_steps}"))
    return None


def _number(text: str, kind):
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if kind is int:
        if not value.is_integer():
            raise ValueError(f"expected an integer, got {text!r}")
        return int(value)
    return value


def _same(path, column: str, values: set):
    if len(values) != 1:
        raise PlanError(column, f"expected the same value on every row, got {sorted(map(str, values))}")
    return values.pop()


def _read_rows(path: Path) -> list[dict]:
    """plan.csv's rows as text, the required columns present and at least one row."""
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            rows = list(reader)
    except FileNotFoundError:
        raise PlanError(str(path), "plan file not found") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PlanError(str(path), f"not a readable CSV plan ({exc})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise PlanError(f"{path}: column {missing[0]}", f"missing; expected columns {', '.join(REQUIRED_COLUMNS)}")
    if not rows:
        raise PlanError(f"{path}: node", "expected at least one node row")
    return rows


def load_plan(path: str | Path, seq_len: int | None = None) -> Plan:
    """Read and validate plan.csv; raises PlanError whose message starts with the file name.

    With `seq_len` (the scenario's) every row's tokens_per_round is checked against it;
    without, seq_len is inferred and must agree between rows."""
    path = Path(path)
    rows = _read_rows(path)
    kinds = {"gpus": int, "batch_size": int, "local_steps": int, "step_s": float, "tokens_per_round": int,
             "comm_s": float, "rounds": int, "link_gbps": float, "cpu_quota": float, "fragments": int,
             "sync_delay_steps": int, "fragment_alpha": float, "quorum": float, "grace_s": float}
    shared_columns = ("strategy", "comm_s", "rounds", "collective", "payload_dtype", "sync", "outer_state",
                      "adapt", "quorum", "grace_s", *STREAMING_COLUMNS)
    words = ("strategy", "node", "collective", "payload_dtype", "sync", "sharding", "activation_checkpointing",
             "outer_state", "fragment_pattern", "adapt")
    nodes, shared, seq_lens = [], {k: set() for k in shared_columns}, set()
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        values = {}
        for column in PLAN_COLUMNS:
            text = (row.get(column) or "").strip()
            try:
                if column in words:
                    values[column] = text or None
                elif column == "cpu_cores":
                    values[column] = tuple(_number(t, int) for t in text.split()) if text else None
                else:
                    values[column] = _number(text, kinds[column]) if text else None
            except ValueError as exc:
                raise PlanError(f"{path}: line {line}: {column}", str(exc)) from None
        for column in REQUIRED_COLUMNS:
            if values[column] is None:
                raise PlanError(f"{path}: line {line}: {column}", "empty; expected a value")
        for column in shared:
            shared[column].add(values[column])
        try:
            node = NodePlan(node=values["node"], gpus=values["gpus"], batch_size=values["batch_size"],
                            local_steps=values["local_steps"], step_s=values["step_s"], link_gbps=values["link_gbps"],
                            cpu_cores=values["cpu_cores"], cpu_quota=values["cpu_quota"],
                            sharding=values["sharding"], activation_checkpointing=values["activation_checkpointing"])
        except PlanError as exc:
            raise PlanError(f"{path}: line {line}: {exc.key}", exc.expected) from None
        per_seq = node.local_steps * node.batch_size * node.gpus
        if seq_len is not None and values["tokens_per_round"] != per_seq * seq_len:
            raise PlanError(f"{path}: line {line}: tokens_per_round",
                            f"expected local_steps × batch_size × gpus × seq_len = {per_seq * seq_len} "
                            f"(seq_len {seq_len} from the scenario), got {values['tokens_per_round']}")
        if values["tokens_per_round"] % per_seq:
            raise PlanError(f"{path}: line {line}: tokens_per_round",
                            f"expected local_steps × batch_size × gpus × seq_len, a multiple of {per_seq}, "
                            f"got {values['tokens_per_round']}")
        seq_lens.add(values["tokens_per_round"] // per_seq)
        nodes.append(node)
    try:
        one = {column: _same(path, column, values) for column, values in shared.items()}
        seq_len = _same(path, "tokens_per_round", seq_lens)
        streaming = {k: one[k] for k in STREAMING_COLUMNS if one[k] is not None}  # empty: classic DiLoCo
        return Plan(strategy=one["strategy"], nodes=tuple(nodes), comm_s=one["comm_s"], seq_len=seq_len,
                    rounds=one["rounds"], collective=one["collective"], payload_dtype=one["payload_dtype"],
                    sync=one["sync"], outer_state=one["outer_state"], adapt=one["adapt"],
                    quorum=QuorumSettings.from_columns(one["quorum"], one["grace_s"]), **streaming)
    except PlanError as exc:
        raise PlanError(f"{path}: {exc.key}", exc.expected) from None
