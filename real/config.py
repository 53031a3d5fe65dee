"""The executor's inputs: the scenario sections it reads, as frozen dataclasses; plan.csv via formats/plan.py.

`real/` never imports the simulator: it reads the files the simulator writes. From the
resolved scenario TOML it reads `seed`, `[model]` (preset, seq_len, dtype), `[training]`
(rounds, checkpoint_every, compile), `[diloco]` and `[network]`'s collective and payload_dtype (the
defaults for plan.csv cells left empty); the rest of `[network]`, `[[nodes]]` and `[simulation]`
belong to the simulator and are ignored. Unknown keys in the sections read here are errors. Every
error is a `ConfigError` whose message names the file, the key and what was expected. """
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from formats.config import build
from formats.errors import FieldError
from formats.plan import Plan, PlanError
from formats.plan import load_plan as _load_plan
from formats.scenario import (
    CHECKPOINT_EVERY_DEFAULT,
    COMPILE_MODES,
    MTBF_S_DEFAULT,
    DilocoConfig,
    ModelSection,
    check_checkpoint_every,
    check_mtbf_s,
)
from formats.toml import tomllib
from formats.wire import COLLECTIVES, PAYLOAD_BYTES

# Top-level keys of a scenario; those not read here are the simulator's business.
SCENARIO_TOP_KEYS = {"name", "seed", "model", "training", "network", "diloco", "nodes",
                     "simulation", "description"}
# Keys the simulator may write in [training] that the executor does not need (the plan
# carries per-node batch size and local steps).
IGNORED_TRAINING_KEYS = {"local_steps", "batch_size", "sharding", "activation_checkpointing", "target_loss",
                         "convergence_profile"}


class ConfigError(ValueError):
    """Bad executor input; str() is the whole one-line report (file, key, expectation)."""


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FieldError(key, f"expected a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class RunSpec:
    """What the executor reads from a resolved scenario."""

    seed: int
    model: ModelSection
    rounds: int
    diloco: DilocoConfig = field(default_factory=DilocoConfig)
    # [network]'s collective and payload dtype: what a plan.csv cell left empty means.
    collective: str = "ring"
    payload_dtype: str = "fp32"
    checkpoint_every: int | None = None  # [training].checkpoint_every; None: Young/Daly (formats/scenario.py)
    mtbf_s: float = MTBF_S_DEFAULT  # [simulation].mtbf_s: with the measured checkpoint cost, the default cadence
    latency_ms: float = 1.0  # [network].latency_ms, one way: emulated on --wan shaped where netem exists
    compile: str = "auto"    # [training] compile: the step's torch.compile'd blocks (train/step.py use_compile)

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise FieldError("seed", f"expected a non-negative integer, got {self.seed!r}")
        _positive_int("training.rounds", self.rounds)
        if not isinstance(self.model.preset, str) or not self.model.preset:
            raise FieldError("model.preset", "expected a preset name or a config.json path "
                             "(the executor needs a buildable model)")
        if self.collective not in COLLECTIVES:
            raise FieldError("network.collective", f"expected one of {', '.join(COLLECTIVES)}, got {self.collective!r}")
        if self.compile not in COMPILE_MODES:
            raise FieldError("training.compile", f"expected one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.payload_dtype not in PAYLOAD_BYTES:
            raise FieldError("network.payload_dtype",
                             f"expected one of {', '.join(PAYLOAD_BYTES)}, got {self.payload_dtype!r}")
        latency = self.latency_ms
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= latency < float("inf"):
            raise FieldError("network.latency_ms", f"expected a non-negative number, got {latency!r}")


def _check_keys(section: dict, allowed: set[str], prefix: str) -> None:
    for key in section:
        if key not in allowed:
            raise FieldError(f"{prefix}{key}", f"unknown key; expected one of {', '.join(sorted(allowed))}")


def _table(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise FieldError(key, "expected a table")
    return value


def run_spec_from_dict(data: dict) -> RunSpec:
    """The executor's view of a parsed scenario; raises FieldError naming the key.

    [model] and [diloco] are built by the shared sections (formats/scenario.py)."""
    _check_keys(data, SCENARIO_TOP_KEYS, "")
    training = _table(data, "training")
    _check_keys(training, {"rounds", "checkpoint_every", "compile"} | IGNORED_TRAINING_KEYS, "training.")
    if "rounds" not in training:
        raise FieldError("training.rounds", "missing; expected a positive integer")
    network = _table(data, "network")  # the rest of [network] is the simulator's
    return RunSpec(
        seed=data.get("seed", 0),
        model=build(ModelSection, _table(data, "model"), "model"),
        rounds=training["rounds"],
        checkpoint_every=check_checkpoint_every(training.get("checkpoint_every", CHECKPOINT_EVERY_DEFAULT)),
        diloco=build(DilocoConfig, _table(data, "diloco"), "diloco"),
        collective=network.get("collective", "ring"),
        payload_dtype=network.get("payload_dtype", "fp32"),
        latency_ms=network.get("latency_ms", 1.0),
        compile=training.get("compile", "auto"),
        mtbf_s=check_mtbf_s(_table(data, "simulation").get("mtbf_s", MTBF_S_DEFAULT)),
    )


def load_run_spec(path: str | Path) -> RunSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: scenario file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable TOML scenario ({exc})") from None
    try:
        return run_spec_from_dict(data)
    except FieldError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except TypeError as exc:  # wrong value types that the comparisons above trip over
        raise ConfigError(f"{path}: {exc}") from None


def load_plan(path: str | Path, seq_len: int | None = None) -> Plan:
    """plan.csv through the shared schema (formats/plan.py), errors as ConfigError."""
    try:
        return _load_plan(path, seq_len)
    except PlanError as exc:
        raise ConfigError(str(exc)) from None
