"""Memory model for one device: does a training step at per-device batch b fit, under a layout?

A node's *layout* is how its G devices divide the training state and whether activations are
recomputed (`Layout`: sharding none | zero1 | zero2 | fsdp, activation_checkpointing none |
full, and where the DiLoCo outer state lives). Bytes per device:

- state (Rajbhandari et al. 2020, "ZeRO", §5, Ψ parameters, K = 12 optimizer bytes of mixed
  precision Adam there; here fp32 weights 4Ψ, fp32 gradients 4Ψ, AdamW's two fp32 moments 8Ψ):
      none   4Ψ + 4Ψ + 8Ψ            zero1  4Ψ + 4Ψ + 8Ψ/G
      zero2  4Ψ + 4Ψ/G + 8Ψ/G         fsdp   (4Ψ + 4Ψ + 8Ψ)/G
  plus, under bf16/fp16 autocast, the 2Ψ half-precision weight copy (none, zero1, zero2). FSDP2
  is taken with MixedPrecisionPolicy(param_dtype = the compute dtype, reduce_dtype = fp32), as
  torchtitan trains: it casts at the all-gather, so there is no persistent half copy; what it
  gathers is the transient below. With `[diloco] outer_state = "device"` the global weights and
  outer momentum add 8Ψ, 8Ψ/G when sharded (each device keeps its shard's).
- the FSDP transient: FSDP2 keeps the unit being computed and the one it prefetches gathered
  (2 · U · p bytes, p = 2 in 16-bit, else 4) and the unit's unsharded fp32 gradient before its
  reduce-scatter (4U); U, the largest unit, is max(one decoder layer, the embedding table).
- the step itself, traced (facts/step_memory.csv, written by benchmarks/trace_step_memory.py:
  train/step.py's step under FakeTensorMode and MemTracker on CPU, fitted over model sizes):
  unsharded, the peak is the larger of the optimizer step (`optimizer_bytes_per_param` × Ψ:
  weights, gradients, both moments, fused AdamW's temporaries) and backward
  (`backward_bytes_per_param` × Ψ + `fixed_bytes` + b × the activation bytes per sample:
  every tensor saved for backward, the logits' fp32 copies and their gradients, and the
  backward's transients, per token `act_*` per layer, `out_*` once, `act_vocab` per vocabulary
  entry; under full recomputation the layers' inputs and the one layer re-formed in backward).
  Sharded layouts keep the ZeRO state above and the traced activations. A compiled step keeps
  less (25-37% less on an H200); the eager step's table bounds it from above.
- a reserve of RESERVE_BYTES for the CUDA context and workspaces, and FRAGMENTATION of the
  device's memory that the caching allocator cannot hand out: on an H200 llama-1b ran out of
  memory at batch 43 with 137.5 GB of 150.1 allocated (8.4% out of reach), llama-150m fitted
  148.9 GB (0.8%); 5% lies between, and the trace runs above the measured peaks (+1% to +6%).
Models given only as a parameter count have no activation model or layer structure: only their
state is checked (`memory_need_bytes`, no FSDP transient), and B, whose rule is "as large as
memory allows", needs a preset or profiles.

"auto" (the default) takes the first layout in LAYOUT_ORDER that holds the baseline batch:
sharding first (none < zero1 < zero2 < fsdp), recomputation only when no sharding is enough
(then with the least sharding that fits), because recomputation always costs a third more
compute while sharding's collectives run over the node's fast link, mostly hidden (timing.py).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from facts.catalog import get_gpu
from formats.errors import FieldError
from formats.plan import CHECKPOINTING, SHARDINGS

RESERVE_BYTES = 1.0e9
FRAGMENTATION = 0.05
STEP_MEMORY_PATH = Path(__file__).resolve().parents[2] / "facts" / "step_memory.csv"
STATIC_BYTES_PER_PARAM = 16
GIB = float(2**30)
OUTER_STATE_BYTES_PER_PARAM = 8  # fp32 global weights and outer Nesterov momentum
FSDP_UNITS_GATHERED = 2  # the unit computed and the one FSDP2 prefetches


@dataclass(frozen=True)
class Layout:
    """How one node trains: sharding over its `devices`, recomputation, the outer state's place."""

    sharding: str = "none"
    checkpointing: str = "none"
    devices: int = 1
    outer_state: str = "cpu"

    @property
    def sharded(self) -> bool:
        return self.sharding != "none"

    @property
    def label(self) -> str:
        return self.sharding + ("+recompute" if self.checkpointing == "full" else "")


UNSHARDED = Layout()
# auto's order: every sharding without recomputation, then every sharding with it.
LAYOUT_ORDER = tuple((s, c) for c in CHECKPOINTING for s in SHARDINGS)


def _half(scenario) -> bool:
    return scenario.model.dtype in ("bf16", "fp16")


def state_bytes(scenario, layout: Layout = UNSHARDED) -> float:
    """Weights, gradients, AdamW moments, the half copy and the outer state on one device (see above)."""
    n, g, s = scenario.model.param_count, layout.devices, layout.sharding
    if s == "none":  # exactly the unsharded sum (no division: published results depend on these floats)
        total = n * (STATIC_BYTES_PER_PARAM + (2 if _half(scenario) else 0))
    else:
        weights = 4 * n / g if s == "fsdp" else 4 * n
        grads = 4 * n / g if s in ("zero2", "fsdp") else 4 * n
        half_copy = 2 * n if _half(scenario) and s != "fsdp" else 0
        total = weights + grads + 8 * n / g + half_copy
    if layout.outer_state == "device":
        total += OUTER_STATE_BYTES_PER_PARAM * n / (g if layout.sharded else 1)
    return total


@lru_cache(maxsize=8)
def step_memory_table(path: str = str(STEP_MEMORY_PATH)) -> dict[tuple[str, str], dict[str, float]]:
    """facts/step_memory.csv by (dtype, checkpointing): the traced step's coefficients (see above)."""
    with open(path, newline="") as handle:
        return {(row["dtype"], row["checkpointing"]): {k: float(v) for k, v in row.items()
                                                       if k not in ("dtype", "checkpointing", "torch_version")}
                for row in csv.DictReader(handle)}


def _traced(dtype: str, checkpointing: str, path: str | None = None) -> dict[str, float]:
    table = step_memory_table(str(path or STEP_MEMORY_PATH))
    return table[("bf16" if dtype == "fp16" else dtype, checkpointing)]  # fp16's tensors are bf16's sizes


def traced_activation_bytes(arch, seq_len: int, dtype: str, checkpointing: str = "none", path=None) -> float:
    """Bytes per sample the traced step keeps for backward at its peak (module docstring)."""
    t = _traced(dtype, checkpointing, path)
    h, kv, f = arch.hidden_size, arch.num_kv_heads * arch.head_dim, arch.ffn_size
    per_token = (arch.num_layers * (t["act_h"] * h + t["act_kv"] * kv + t["act_ffn"] * f)
                 + t["out_h"] * h + t["out_kv"] * kv + t["out_ffn"] * f + t["act_vocab"] * arch.vocab_size)
    return seq_len * per_token


def traced_peak_bytes(arch, seq_len: int, batch: int, dtype: str, checkpointing: str = "none", path=None) -> float:
    """The traced step's unsharded peak at `batch` (no reserve): max(optimizer step, backward)."""
    t = _traced(dtype, checkpointing, path)
    backward = (t["backward_bytes_per_param"] * arch.params + t["fixed_bytes"]
                + batch * traced_activation_bytes(arch, seq_len, dtype, checkpointing, path))
    return max(t["optimizer_bytes_per_param"] * arch.params, backward)


def reserve_bytes(memory_bytes: float) -> float:
    """What a device of memory_bytes cannot give a step: RESERVE_BYTES + FRAGMENTATION of it."""
    return RESERVE_BYTES + FRAGMENTATION * memory_bytes


def static_memory_bytes(scenario, layout: Layout = UNSHARDED) -> float:
    """What backward holds at batch 0 (without the FSDP transient): the traced step's unsharded,
    the ZeRO state sharded (plus the device-resident outer state either way)."""
    arch = scenario.model.arch
    if arch is None or layout.sharded:
        return state_bytes(scenario, layout)
    t = _traced(scenario.model.dtype, layout.checkpointing)
    outer = OUTER_STATE_BYTES_PER_PARAM * arch.params if layout.outer_state == "device" else 0.0
    return t["backward_bytes_per_param"] * arch.params + t["fixed_bytes"] + outer


def fsdp_unit_params(arch) -> int:
    """Parameters of the largest FSDP unit: one decoder layer or the embedding table."""
    return max((arch.params - arch.vocab_size * arch.hidden_size * (1 if arch.tie_embeddings else 2)
                - arch.hidden_size) // arch.num_layers, arch.vocab_size * arch.hidden_size)


def transient_bytes(scenario, layout: Layout = UNSHARDED) -> float:
    """The FSDP gathered units and one unit's unsharded gradient; 0 for the other layouts."""
    if layout.sharding != "fsdp" or scenario.model.arch is None:
        return 0.0
    unit = fsdp_unit_params(scenario.model.arch)
    return FSDP_UNITS_GATHERED * unit * (2 if _half(scenario) else 4) + 4 * unit


def activation_bytes_per_sample(scenario, layout: Layout = UNSHARDED) -> float:
    """Activations kept for backward plus the loss's tensors, per sample, as traced."""
    model = scenario.model
    return traced_activation_bytes(model.arch, model.seq_len, model.dtype, layout.checkpointing)


def memory_need_bytes(scenario, batch: int, layout: Layout = UNSHARDED) -> float:
    """step_memory_bytes where the model has an architecture, else its state alone (no reserve)."""
    if scenario.model.arch is None:
        return static_memory_bytes(scenario, layout)
    return step_memory_bytes(scenario, batch, layout)


def step_memory_bytes(scenario, batch: int, layout: Layout = UNSHARDED) -> float:
    """Peak bytes of one training step at per-device batch `batch` (module docstring), no reserve."""
    if scenario.model.arch is None:
        raise FieldError("model.preset", "strategy B needs a model preset (for activations) or node profiles")
    backward = (static_memory_bytes(scenario, layout) + transient_bytes(scenario, layout)
                + batch * activation_bytes_per_sample(scenario, layout))
    if layout.sharded:
        return backward
    arch = scenario.model.arch
    t = _traced(scenario.model.dtype, layout.checkpointing)
    outer = OUTER_STATE_BYTES_PER_PARAM * arch.params if layout.outer_state == "device" else 0.0
    return max(t["optimizer_bytes_per_param"] * arch.params + outer, backward)


def fits_in_memory(scenario, gpu_key: str, batch: int, layout: Layout = UNSHARDED) -> bool:
    memory = get_gpu(gpu_key).memory_bytes
    return step_memory_bytes(scenario, batch, layout) <= memory - reserve_bytes(memory)
