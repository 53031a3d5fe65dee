"""The scenario sections both stages read: `[model]` and `[diloco]`, each key defined once.

Each key is made by formats/sections.py's `key()`, as `[training]`, `[network]` and `[simulation]`
are: its default, doc, allowed values, bounds and checks beside it (docs/DESIGN.md's scenario block
is rendered from them). This module also keeps the compile rule and the Young/Daly checkpoint interval.

The simulator (simulator/scenario.py) and the executor (real/core/config.py) build these from the
same TOML with `formats.config.build`, so a key means the same thing, has the same default and
is refused for the same reason on both sides. The simulator extends ModelSection with the
resolved architecture (it needs the preset's parameter count and FLOPs); the executor adds
its own demand that the model be buildable (a preset, not a bare parameter count).

The model dtype defaults to bf16, as the simulator always had: the executor only ever reads
resolved scenarios in which the simulator had already written its value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from formats.errors import FieldError
from formats.plan import FRAGMENT_PATTERNS, OUTER_STATES
from formats.sections import COMPILE_MODES, check_keys, key, non_negative, positive, value_check
from formats.wire import AVERAGING_MODES, MODEL_DTYPES


def compiled_step(mode: str, on_gpu: bool) -> bool:
    """The one rule for [training] compile: "on", "off", or "auto" = on for GPU (CUDA) devices,
    off for CPU devices (compiling on a CPU takes minutes and gains little)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile {mode!r}: expected one of {', '.join(COMPILE_MODES)}")
    return mode == "on" or (mode == "auto" and on_gpu)


@dataclass(frozen=True)
class ModelSection:
    """[model]: what is trained, a preset (or config.json), or a bare parameter count."""

    preset: str | None = key(None, "tiny | llama-60m | llama-150m | llama-1b | llama-3.2-1b | llama-3.2-3b | "
                             "llama-3.1-8b | intellect-1 | a config.json path (facts/presets.py; the [model] "
                             "table absent: llama-150m)", example="llama-150m")
    params: float | None = key(None, "instead of a preset: a bare parameter count", positive,
                               bounds=(1.0, 1e15), example=2.15e8)
    flops_per_token: float | None = key(None, "training FLOPs per token, if known (else the preset's, else "
                                        "6·params)", positive, bounds=(1.0, 1e18), example=1.3e9)
    seq_len: int = key(1024, "tokens per sequence", positive, bounds=(1, 10**7))
    dtype: str = key("bf16", "the weights' and activations' dtype", choices=MODEL_DTYPES)

    def __post_init__(self) -> None:
        check_keys(self)
        if self.preset is None and self.params is None:
            raise FieldError("preset", "expected a model preset name (or `params = <count>`)")


def _betas(section: Any, name: str) -> None:
    betas = getattr(section, name)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise FieldError(name, f"expected two numbers in [0, 1), got {list(betas)!r}")


_fraction = value_check(lambda value: 0 <= value <= 1, "a number in [0, 1]")
_momentum = value_check(lambda value: 0 <= value < 1, "0 <= momentum < 1")
_non_negative_int = value_check(lambda value: value >= 0, "an integer >= 0")


@dataclass(frozen=True)
class DilocoConfig:
    """[diloco]: the real executor's hyper-parameters (OpenDiLoCo's defaults); the simulator only
    checks them. Streaming DiLoCo (formats/plan.py's docstring): P fragments synced in turn, each
    all-reduce overlapping τ inner steps, merged with weight α on the local weights (torchft's
    semantics); the simulator's strategies plan with these unless they choose their own
    (`streaming` does), and the plan carries what runs."""

    inner_lr: float = key(4e-4, "AdamW's peak learning rate for the inner steps", positive)
    weight_decay: float = key(0.1, "AdamW's weight decay", non_negative)
    warmup_steps: int = key(1000, "linear warm-up of the inner learning rate, in inner steps", non_negative)
    outer_lr: float = key(0.7, "the outer (Nesterov) step's learning rate", positive)
    outer_momentum: float = key(0.9, "the outer step's Nesterov momentum", _momentum)
    averaging: str = key("uniform", "how pseudo-gradients are weighed: equally, by tokens, or normalized by "
                         "local steps (FedNova)", choices=AVERAGING_MODES)
    betas: tuple[float, ...] = key(None, "AdamW's betas", _betas, factory=lambda: (0.9, 0.95))
    cosine_min_lr_ratio: float = key(0.1, "the cosine schedule's floor, a fraction of inner_lr", _fraction)
    outer_state: str = key("cpu", "where the global weights and outer momentum live (OpenDiLoCo: cpu); counts "
                           "in device memory and the outer step's time", choices=OUTER_STATES)
    fragments: int = key(1, "Streaming DiLoCo's P: fragments synced in turn (1 = classic DiLoCo); at most "
                         "local_steps and the model's layers", positive)
    sync_delay_steps: int = key(0, "τ: inner steps each fragment's all-reduce overlaps, 0 <= τ < local_steps "
                                "// fragments", _non_negative_int)
    fragment_alpha: float = key(0.0, "α: the merge θ = (1 − α)·θ_global + α·θ_local (torchft's "
                                "fragment_update_alpha; 0, its default, keeps the global weights)", _fraction)
    fragment_pattern: str = key("sequential", "sequential: consecutive layers; strided: layer l in fragment "
                                "l mod P", choices=FRAGMENT_PATTERNS)

    def __post_init__(self) -> None:
        check_keys(self)


# [training] checkpoint_every absent, the executor checkpoints every Young/Daly interval for the
# checkpoint's measured cost and [simulation] mtbf_s (both keys in formats/sections.py).
def young_daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Seconds of work between checkpoints that lose the least expected time: Young (1974) and
    Daly (2006), tau = sqrt(2 * cost * MTBF) - cost, for a checkpoint costing `cost_s`; Daly's
    bound tau = MTBF where the checkpoint costs at least twice the MTBF."""
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    return (2 * cost_s * mtbf_s) ** 0.5 - cost_s


def rounds_between_checkpoints(cost_s: float, mtbf_s: float, round_s: float) -> int:
    """The Young/Daly interval in whole rounds of `round_s` seconds (at least 1)."""
    return max(1, round(young_daly_interval_s(cost_s, mtbf_s) / max(round_s, 1e-9)))

