"""The scenario sections both stages read: `[model]` and `[diloco]`, validated here once.

(`[training]`, `[network]` and `[simulation]` are in formats/sections.py, each key's default and
doc beside it; this module keeps the compile rule and the Young/Daly checkpoint interval.)

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

from formats.config import require_choice, require_positive
from formats.errors import FieldError
from formats.limits import limit
from formats.plan import FRAGMENT_PATTERNS, OUTER_STATES
from formats.sections import COMPILE_MODES
from formats.wire import AVERAGING_MODES, MODEL_DTYPES


def compiled_step(mode: str, on_gpu: bool) -> bool:
    """The one rule for [training] compile: "on", "off", or "auto" = on for GPU (CUDA) devices,
    off for CPU devices (compiling on a CPU takes minutes and gains little)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile {mode!r}: expected one of {', '.join(COMPILE_MODES)}")
    return mode == "on" or (mode == "auto" and on_gpu)


@dataclass(frozen=True)
class ModelSection:
    """What is trained: a preset (or config.json), or a bare parameter count."""

    preset: str | None = None
    params: float | None = None
    flops_per_token: float | None = None
    seq_len: int = 1024
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        require_positive(self, "params", "flops_per_token", "seq_len")
        limit(self, "params", "flops_per_token", "seq_len")
        require_choice(self, "dtype", MODEL_DTYPES)
        if self.preset is None and self.params is None:
            raise FieldError("preset", "expected a model preset name (or `params = <count>`)")


@dataclass(frozen=True)
class DilocoConfig:
    """The real executor's hyper-parameters (OpenDiLoCo's defaults); the simulator only checks them."""

    inner_lr: float = 4e-4
    weight_decay: float = 0.1
    warmup_steps: int = 1000
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    averaging: str = "uniform"
    betas: tuple[float, ...] = (0.9, 0.95)
    cosine_min_lr_ratio: float = 0.1
    outer_state: str = "cpu"  # where the global copy and outer momentum live (OpenDiLoCo: CPU)
    # Streaming DiLoCo (formats/plan.py's docstring): P fragments synced in turn, each all-reduce
    # overlapping τ inner steps, merged with weight α on the local weights (torchft's semantics).
    # The simulator's strategies plan with these unless they choose their own (`streaming` does);
    # the plan carries what runs.
    fragments: int = 1
    sync_delay_steps: int = 0
    fragment_alpha: float = 0.0
    fragment_pattern: str = "sequential"

    def __post_init__(self) -> None:
        require_positive(self, "inner_lr", "outer_lr", "fragments")
        require_choice(self, "outer_state", OUTER_STATES)
        if self.sync_delay_steps < 0:
            raise FieldError("sync_delay_steps", f"expected an integer >= 0, got {self.sync_delay_steps!r}")
        if not 0 <= self.fragment_alpha <= 1:
            raise FieldError("fragment_alpha", f"expected a number in [0, 1], got {self.fragment_alpha!r}")
        require_choice(self, "fragment_pattern", FRAGMENT_PATTERNS)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise FieldError("betas", f"expected two numbers in [0, 1), got {list(self.betas)!r}")
        if not 0 <= self.cosine_min_lr_ratio <= 1:
            raise FieldError("cosine_min_lr_ratio", f"expected a number in [0, 1], got {self.cosine_min_lr_ratio!r}")
        for name in ("weight_decay", "warmup_steps"):
            if getattr(self, name) < 0:
                raise FieldError(name, f"expected a number >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.outer_momentum < 1:
            raise FieldError("outer_momentum", f"expected 0 <= momentum < 1, got {self.outer_momentum!r}")
        require_choice(self, "averaging", AVERAGING_MODES)


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

