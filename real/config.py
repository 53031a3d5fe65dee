"""The executor's inputs: the scenario sections it reads, as frozen dataclasses; plan.csv via real/plan.py.

`real/` never imports the simulator: it reads the files the simulator writes. From the
resolved scenario TOML it reads `seed`, `[model]` (preset, seq_len, dtype), `[training]`
(rounds), `[diloco]` and `[network]`'s collective and payload_dtype (the defaults for plan.csv
cells left empty); the rest of `[network]`, `[[nodes]]` and `[simulation]` belong to the
simulator and are ignored. Unknown keys in the sections read here are errors. Every error is a
`ConfigError` whose message names the file, the key and what was expected.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from real.plan import COLLECTIVES, PAYLOAD_BYTES, Plan, PlanError
from real.plan import load_plan as _load_plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

AVERAGING_MODES = ("uniform", "tokens", "normalized")
DTYPES = ("bf16", "fp16", "fp32")
# Top-level keys of a scenario; those not read here are the simulator's business.
SCENARIO_TOP_KEYS = {"name", "seed", "model", "training", "network", "diloco", "nodes",
                     "simulation", "description"}
# Keys the simulator may write in the sections read here that the executor does not need
# (the plan carries per-node batch size and local steps).
IGNORED_MODEL_KEYS = {"params", "flops_per_token"}
IGNORED_TRAINING_KEYS = {"local_steps", "batch_size"}


class ConfigError(ValueError):
    """Bad executor input; str() is the whole one-line report (file, key, expectation)."""


class _FieldError(ValueError):
    def __init__(self, key: str, expected: str):
        super().__init__(f"{key}: {expected}")
        self.key, self.expected = key, expected


def _positive(key: str, value, kind=float, allow_zero: bool = False):
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok_type = isinstance(value, int) and not isinstance(value, bool)
    if not ok_type or (value < 0 if allow_zero else value <= 0) or (kind is float and not math.isfinite(value)):
        what = "a non-negative" if allow_zero else "a positive"
        raise _FieldError(key, f"expected {what} {'integer' if kind is int else 'number'}, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelSpec:
    preset: str
    seq_len: int
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if not isinstance(self.preset, str) or not self.preset:
            raise _FieldError("model.preset", "expected a preset name or a config.json path "
                              "(the executor needs a buildable model)")
        _positive("model.seq_len", self.seq_len, int)
        if self.dtype not in DTYPES:
            raise _FieldError("model.dtype", f"expected one of {', '.join(DTYPES)}, got {self.dtype!r}")


@dataclass(frozen=True)
class DilocoSpec:
    """DiLoCo hyper-parameters (OpenDiLoCo's defaults where the scenario leaves them out)."""

    inner_lr: float = 4e-4
    weight_decay: float = 0.1
    warmup_steps: int = 1000
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    averaging: str = "uniform"
    betas: tuple[float, float] = (0.9, 0.95)
    cosine_min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        _positive("diloco.inner_lr", self.inner_lr)
        _positive("diloco.weight_decay", self.weight_decay, allow_zero=True)
        _positive("diloco.warmup_steps", self.warmup_steps, int, allow_zero=True)
        _positive("diloco.outer_lr", self.outer_lr)
        m = self.outer_momentum
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
            raise _FieldError("diloco.outer_momentum", f"expected a number in [0, 1), got {m!r}")
        if self.averaging not in AVERAGING_MODES:
            raise _FieldError("diloco.averaging",
                              f"expected one of {', '.join(AVERAGING_MODES)}, got {self.averaging!r}")
        b = self.betas
        if (not isinstance(b, tuple) or len(b) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in b)):
            raise _FieldError("diloco.betas", f"expected two numbers in [0, 1), got {b!r}")
        r = self.cosine_min_lr_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise _FieldError("diloco.cosine_min_lr_ratio", f"expected a number in [0, 1], got {r!r}")


@dataclass(frozen=True)
class RunSpec:
    """What the executor reads from a resolved scenario."""

    seed: int
    model: ModelSpec
    rounds: int
    diloco: DilocoSpec = field(default_factory=DilocoSpec)
    # [network]'s collective and payload dtype: what a plan.csv cell left empty means.
    collective: str = "ring"
    payload_dtype: str = "fp32"
    latency_ms: float = 1.0  # [network].latency_ms, one way: emulated on --wan shaped where netem exists

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise _FieldError("seed", f"expected a non-negative integer, got {self.seed!r}")
        _positive("training.rounds", self.rounds, int)
        if self.collective not in COLLECTIVES:
            raise _FieldError("network.collective", f"expected one of {', '.join(COLLECTIVES)}, got {self.collective!r}")
        if self.payload_dtype not in PAYLOAD_BYTES:
            raise _FieldError("network.payload_dtype",
                              f"expected one of {', '.join(PAYLOAD_BYTES)}, got {self.payload_dtype!r}")
        _positive("network.latency_ms", self.latency_ms, allow_zero=True)


def _check_keys(section: dict, allowed: set[str], prefix: str) -> None:
    for key in section:
        if key not in allowed:
            raise _FieldError(f"{prefix}{key}", f"unknown key; expected one of {', '.join(sorted(allowed))}")


def _table(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _FieldError(key, "expected a table")
    return value


def run_spec_from_dict(data: dict) -> RunSpec:
    """The executor's view of a parsed scenario; raises _FieldError naming the key."""
    _check_keys(data, SCENARIO_TOP_KEYS, "")
    model = _table(data, "model")
    _check_keys(model, {"preset", "seq_len", "dtype"} | IGNORED_MODEL_KEYS, "model.")
    if "preset" not in model:
        raise _FieldError("model.preset", "missing; the executor needs a preset name or config.json")
    if "seq_len" not in model:
        raise _FieldError("model.seq_len", "missing; expected a positive integer")
    training = _table(data, "training")
    _check_keys(training, {"rounds"} | IGNORED_TRAINING_KEYS, "training.")
    if "rounds" not in training:
        raise _FieldError("training.rounds", "missing; expected a positive integer")
    diloco = dict(_table(data, "diloco"))
    _check_keys(diloco, set(DilocoSpec.__dataclass_fields__), "diloco.")
    if "betas" in diloco:
        betas = diloco["betas"]
        diloco["betas"] = tuple(betas) if isinstance(betas, list) else betas
    network = _table(data, "network")  # the rest of [network] is the simulator's
    return RunSpec(
        seed=data.get("seed", 0),
        model=ModelSpec(preset=model["preset"], seq_len=model["seq_len"], dtype=model.get("dtype", "fp32")),
        rounds=training["rounds"],
        diloco=DilocoSpec(**diloco),
        collective=network.get("collective", "ring"),
        payload_dtype=network.get("payload_dtype", "fp32"),
        latency_ms=network.get("latency_ms", 1.0),
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
    except _FieldError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except TypeError as exc:  # wrong value types that the comparisons above trip over
        raise ConfigError(f"{path}: {exc}") from None


def load_plan(path: str | Path, seq_len: int | None = None) -> Plan:
    """plan.csv through the shared schema (real/plan.py), errors as ConfigError."""
    try:
        return _load_plan(path, seq_len)
    except PlanError as exc:
        raise ConfigError(str(exc)) from None
