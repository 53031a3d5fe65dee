"""The executor's inputs: the scenario sections it reads, as frozen dataclasses; plan.csv via formats/plan.py.

`real/` never imports the simulator: it reads the files the simulator writes. From the
resolved scenario TOML it reads `seed`, `[model]` (preset, seq_len, dtype), `[training]`
(rounds, checkpoint_every, compile; a `stack` other than geodt is refused: priced for planning
only), `[diloco]`, `[network]`'s collective and payload_dtype (the
defaults for plan.csv cells left empty) and latency_ms, and `[simulation]`'s mtbf_s. Those sections
are built by their one definition (formats/scenario.py, formats/sections.py), which the simulator
uses too: keys, defaults and checks are the same on both sides, and the values the executor does
not run are checked and dropped; `[[nodes]]` belongs to the simulator and is ignored. Unknown keys
are errors. Every error is a `ConfigError` whose message names the file, the key and what was
expected. """
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from formats.config import build
from formats.errors import FieldError, did_you_mean
from formats.plan import Plan, PlanError
from formats.plan import load_plan as _load_plan
from formats.scenario import DilocoConfig, ModelSection
from formats.sections import EXECUTED_STACK, SCENARIO_TOP_KEYS, NetworkConfig, SimulationConfig, TrainingConfig
from formats.toml import tomllib


class ConfigError(ValueError):
    """Bad executor input; str() is the whole one-line report (file, key, expectation)."""


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FieldError(key, f"expected a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class RunSpec:
    """What the executor reads from a resolved scenario: its sections themselves, each built by its one
    definition (formats/scenario.py, formats/sections.py), so no key is listed twice. The rounds a run
    runs are its plan's (resolved once, real/process/launch.py check_inputs; sync-ddp: R·H)."""

    seed: int
    model: ModelSection
    training: TrainingConfig
    network: NetworkConfig
    diloco: DilocoConfig
    simulation: SimulationConfig

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise FieldError("seed", f"expected a non-negative integer, got {self.seed!r}")
        if not isinstance(self.model.preset, str) or not self.model.preset:
            raise FieldError("model.preset", "expected a preset name or a config.json path "
                             "(the executor needs a buildable model)")


def _check_keys(section: dict, allowed: tuple[str, ...], prefix: str) -> None:
    for key in section:
        if key not in allowed:
            raise FieldError(f"{prefix}{key}", f"unknown key; expected one of {', '.join(allowed)}"
                             f"{did_you_mean(key, allowed)}")


def _table(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise FieldError(key, "expected a table")
    return value


def run_spec_from_dict(data: dict) -> RunSpec:
    """The executor's view of a parsed scenario; raises FieldError naming the key.

    Every section is built by its shared definition (formats/scenario.py, formats/sections.py),
    so unknown keys, bad values and defaults are the simulator's; the executor keeps what it runs."""
    _check_keys(data, SCENARIO_TOP_KEYS, "")
    raw_training = _table(data, "training")
    # The executor runs the scenario's rounds, so it wants them written (resolved scenarios always have them).
    if "rounds" not in raw_training:
        raise FieldError("training.rounds", "missing; expected a positive integer")
    _positive_int("training.rounds", raw_training["rounds"])
    training = build(TrainingConfig, raw_training, "training")
    if training.stack != EXECUTED_STACK:
        raise FieldError("training.stack", f"{training.stack!r} is priced for planning only: the executor runs "
                         f"geodt's own step (expected {EXECUTED_STACK!r})")
    return RunSpec(
        seed=data.get("seed", 0),
        model=build(ModelSection, _table(data, "model"), "model"),
        training=training,
        network=build(NetworkConfig, _table(data, "network"), "network"),
        diloco=build(DilocoConfig, _table(data, "diloco"), "diloco"),
        simulation=build(SimulationConfig, _table(data, "simulation"), "simulation"),
    )


def load_run_spec(path: str | Path) -> RunSpec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # with or without a byte-order mark
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
