"""The scenario's `[training]`, `[network]` and `[simulation]` sections, defined once.

Each key is a field of a frozen dataclass made by `key(default, doc, *checks, choices=...)`: its
default, its one-line documentation, its allowed values and its checks sit beside it, and nowhere
else. The simulator (simulator/scenario.py) uses these classes as its scenario sections; the
executor (real/core/config.py) builds the same classes from the resolved scenario and keeps the few
values it needs; docs/DESIGN.md's scenario block for these sections is rendered from the same
metadata (formats/scenario_doc.py). `check_keys` runs every field's checks in `__post_init__`,
so a section built by `formats.config.build` from TOML, or directly, is validated the same way.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from formats.config import require_choice, require_positive, require_range
from formats.errors import FieldError
from formats.plan import CHECKPOINTING, SHARDINGS
from formats.wire import COLLECTIVES, PAYLOAD_BYTES

# [training] compile: whether the step runs torch.compile'd blocks (train/step.py).
COMPILE_MODES = ("auto", "on", "off")
# [training] stack: the software stack the catalog estimate prices (facts/stacks.py); geodt: its own step.
STACKS = ("geodt", "torchtitan-eager")
EXECUTED_STACK = STACKS[0]  # the one `geodt run` executes (real/core/config.py refuses the others)
# [simulation] on_node_loss: what the others do when a node is lost (simulator/models/outage.py).
NODE_LOSS_POLICIES = ("stop", "continue")
# [simulation] mtbf_s's default, named because the simulator's checkpoint pricing starts from it too.
MTBF_S_DEFAULT = 86400.0

Check = Callable[[Any, str], None]


def key(default: Any, doc: str, *checks: Check, choices: tuple[str, ...] = (), example: Any = None,
        bounds: tuple[float, float] | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """A section key: its default (REQUIRED: none, the key must be given; `factory`: a fresh
    default per instance), one-line doc, allowed values (`choices`), inclusive `bounds` (far beyond
    any real cluster and small enough that every later product stays finite: formats/limits.py)
    and checks, each a function (section, field name) raising FieldError. `example`: the value docs
    show for a key whose default is None (absent) or that is required."""
    metadata = {"doc": doc, "checks": checks, "choices": tuple(choices), "example": example, "bounds": bounds}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    if default is REQUIRED:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # key()'s default for a key that has none


def check_keys(section: Any) -> None:
    """Every field's allowed values, then its checks, then its bounds, in field order."""
    for f in fields(section):
        if f.metadata.get("choices"):
            require_choice(section, f.name, f.metadata["choices"])
        for check in f.metadata.get("checks", ()):
            check(section, f.name)
        if f.metadata.get("bounds"):
            require_range(section, f.name, *f.metadata["bounds"])


def choices_of(cls: type, name: str) -> tuple[str, ...]:
    """The allowed values of `cls`'s key `name` (a node's own sharding takes [training]'s)."""
    return next(f.metadata["choices"] for f in fields(cls) if f.name == name)


def default_of(cls: type, name: str) -> Any:
    return next(f.default for f in fields(cls) if f.name == name)


def bounds_of(cls: type, name: str) -> tuple[float, float]:
    """The inclusive bounds of `cls`'s key `name`."""
    return next(f.metadata["bounds"] for f in fields(cls) if f.name == name)


def check_checkpoint_every(value, key: str = "training.checkpoint_every") -> int | None:
    """`value` as rounds between checkpoints (a positive integer, or None: chosen by cost);
    FieldError naming `key` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FieldError(key, f"expected a positive integer (rounds between checkpoints), got {value!r}")
    return value


def check_mtbf_s(value, key: str = "simulation.mtbf_s") -> float:
    """`value` as seconds between failures (positive, finite, up to ten years); FieldError naming `key` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3.2e8:
        raise FieldError(key, f"expected seconds between failures, positive and at most 3.2e8, got {value!r}")
    return float(value)


def value_check(ok: Callable[[Any], bool], expected: str) -> Check:
    """A key's check: FieldError naming the field, "expected <expected>, got <value>", unless
    ok(value). Write `ok` as the comparison that must hold, so that NaN (false in every
    comparison) fails it."""
    def check(section: Any, name: str) -> None:
        value = getattr(section, name)
        if not ok(value):
            raise FieldError(name, f"expected {expected}, got {value!r}")
    return check


# The checks fields share; each takes (section, field name) and raises FieldError naming the field.
def positive(section: Any, name: str) -> None:
    require_positive(section, name)  # None passes: an absent optional key


non_negative = value_check(lambda value: value >= 0, "a number >= 0")
seconds_up_to_1e7 = value_check(lambda value: 0 <= value <= 1e7, "seconds from 0 to 1e7")
below_10 = value_check(lambda value: 0 <= value < 10, "a number in [0, 10)")


def rounds_between(section: Any, name: str) -> None:
    check_checkpoint_every(getattr(section, name), name)


def failure_interval(section: Any, name: str) -> None:
    check_mtbf_s(getattr(section, name), name)


@dataclass(frozen=True)
class TrainingConfig:
    """[training]: rounds R, local steps H, the baseline per-device batch b, and how every node lays out
    its memory (each overridable per node); the executor reads rounds, compile and checkpoint_every."""

    rounds: int = key(10, "outer syncs", positive, bounds=(1, 10**6))
    local_steps: int = key(100, "baseline H: inner steps per round", positive, bounds=(1, 10**6))
    batch_size: int = key(4, "baseline per-GPU batch", positive, bounds=(1, 1 << 16))
    sharding: str = key("auto", "how a node's G devices divide the training state (ZeRO stage 1, 2, full sharding "
                        "with FSDP2); auto: the least layout that holds batch_size (see \"Memory layouts\")",
                        choices=("auto",) + SHARDINGS)
    activation_checkpointing: str = key("auto", "full recomputes every decoder layer in backward; auto: the "
                                        "least layout that holds batch_size", choices=("auto",) + CHECKPOINTING)
    compile: str = key("auto", "the step's decoder blocks torch.compile'd (train/step.py; auto: on for GPU nodes, "
                       "off for CPU ones); the estimate prices the lean step when compiled, geodt's eager step "
                       "otherwise; a profile's `compiled` must match an explicit on/off (auto takes the profile's)",
                       choices=COMPILE_MODES)
    stack: str = key(EXECUTED_STACK, "the stack the catalog estimate prices on GPU nodes: geodt's own step (eager or "
                     "compiled by `compile`), or torchtitan-eager (fitted to its published throughput, "
                     "facts/stacks.py): priced for planning only, `geodt run` refuses it", choices=STACKS)
    checkpoint_every: int | None = key(None, "the executor's checkpoint after every k-th round (`--checkpoint-every "
                                       "K` overrides); absent: the Young/Daly interval (\"Checkpoints\" below)",
                                       rounds_between, example=4)
    target_loss: float | None = key(None, "the training loss the run must reach (`--target-loss`): every "
                                    "strategy's predicted time to it, and `simulate` recommends by it (\"Loss "
                                    "model\" below)", positive, example=3.5)
    convergence_profile: str | None = key(None, "a convergence profile (geodt calibrate convergence): the loss "
                                          "model's curve (its model) and per-strategy effects; default: the "
                                          "built-in one of hetero-cpu (simulator/scenarios/convergence-hetero-cpu.csv)",
                                          example="conv.csv")

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class NetworkConfig:
    """[network]: the links between nodes; the executor reads collective, payload_dtype and latency_ms."""

    bandwidth_gbps: float = key(1.0, "the WAN link between nodes, Gbit/s (a node's own uplink_gbps where slower)",
                                positive, bounds=(1e-6, 1e6))
    latency_ms: float = key(1.0, "one way (a real run on --wan shaped emulates it where netem exists)",
                            non_negative, bounds=(0.0, 1e7))
    collective: str = key("ring", "partitioned is bandwidth-balanced (as hivemind)",
                          choices=COLLECTIVES)
    payload_dtype: str = key("fp32", "pseudo-gradient compression", choices=tuple(PAYLOAD_BYTES))
    profile: str | None = key(None, "a network profile (geodt calibrate network): its ring fit replaces "
                              "bandwidth_gbps and latency_ms; it also times the outer step, the intra-node "
                              "all-reduce of CPU nodes and the checkpoints (snapshot, write)", example="net.csv")

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class SimulationConfig:
    """[simulation]: the simulator's knobs (step jitter, node losses); the executor reads mtbf_s."""

    jitter_cv: float = key(0.0, "per-step lognormal jitter (coefficient of variation), seeded by `seed`",
                           below_10)
    variability: str = key("given", "jitter_cv for every node (given), or a node timed by profiles takes its "
                           "jitter from their p10/p90 spread (profile); a node of G devices waits each step for "
                           "the slowest of G draws", choices=("given", "profile"))
    on_node_loss: str = key("stop", "what a node's outage does; stop: every node waits, restarts, re-runs the "
                            "round; continue: the others average among themselves, it rejoins from a peer",
                            choices=NODE_LOSS_POLICIES)
    detect_s: float = key(0.0, "how long the others wait at the barrier before they notice a lost node",
                          seconds_up_to_1e7)
    restart_s: float = key(0.0, "stop: relaunching every node and reloading; continue: the lost node's restart",
                           seconds_up_to_1e7)
    mtbf_s: float = key(MTBF_S_DEFAULT, "expected seconds between failures of the run: with a checkpoint's cost, "
                        "the default checkpoint interval (Young/Daly; executor and simulator alike)",
                        failure_interval)

    def __post_init__(self) -> None:
        check_keys(self)


SECTION_CLASSES = {"training": TrainingConfig, "network": NetworkConfig, "simulation": SimulationConfig}
# A scenario's top-level keys, for every reader: [model] and [diloco] are formats/scenario.py's,
# [[nodes]] the simulator's (the executor reads its nodes from plan.csv).
SCENARIO_TOP_KEYS = ("name", "seed", "model", "training", "network", "diloco", "simulation", "nodes")
