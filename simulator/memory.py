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
- activations per sample, after Korthikanti et al. (2022, "Reducing Activation Recomputation in
  Large Transformer Models", §4) with a fused (SDPA/flash) attention kernel, so no seq² term:
  without recomputation every layer keeps 34 · s · h bytes in 16-bit (twice that in fp32);
  full recomputation (their §5, "2sbhL") keeps each layer's input, 2 · s · h, and re-forms one
  layer's 34 · s · h at a time in backward. Plus the logits, kept either way
  (s · V · (2 + 4 + 4): half-precision logits, the fp32 copy for the loss, its gradient).
- a reserve of RESERVE_BYTES for the CUDA context, the allocator's fragmentation and workspaces.
Models given only as a parameter count have no activation model or layer structure: only their
state is checked (`memory_need_bytes`, no FSDP transient), and B, whose rule is "as large as
memory allows", needs a preset or profiles.

"auto" (the default) takes the first layout in LAYOUT_ORDER that holds the baseline batch:
sharding first (none < zero1 < zero2 < fsdp), recomputation only when no sharding is enough
(then with the least sharding that fits), because recomputation always costs a third more
compute while sharding's collectives run over the node's fast link, mostly hidden (timing.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from facts.catalog import get_gpu
from formats.errors import FieldError
from formats.plan import CHECKPOINTING, SHARDINGS

RESERVE_BYTES = 1.0e9
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


def static_memory_bytes(scenario, layout: Layout = UNSHARDED) -> float:
    """The reserve plus the state: what even batch 0 needs (without the FSDP transient)."""
    return RESERVE_BYTES + state_bytes(scenario, layout)


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
    """Activations kept for backward plus the logits, per sample (Korthikanti et al. 2022)."""
    arch, seq = scenario.model.arch, scenario.model.seq_len
    width = 1 if _half(scenario) else 2
    per_layer = 34 * seq * arch.hidden_size * width
    logits = seq * arch.vocab_size * ((2 if _half(scenario) else 0) + 4 + 4)
    if layout.checkpointing == "full":
        return arch.num_layers * 2 * seq * arch.hidden_size * width + per_layer + logits
    return arch.num_layers * per_layer + logits


def memory_need_bytes(scenario, batch: int, layout: Layout = UNSHARDED) -> float:
    """step_memory_bytes where the model has an architecture, else its static part alone."""
    if scenario.model.arch is None:
        return static_memory_bytes(scenario, layout)
    return step_memory_bytes(scenario, batch, layout)


def step_memory_bytes(scenario, batch: int, layout: Layout = UNSHARDED) -> float:
    """Peak bytes of one training step at per-device batch `batch` (see the module docstring)."""
    if scenario.model.arch is None:
        raise FieldError("model.preset", "strategy B needs a model preset (for activations) or node profiles")
    return (static_memory_bytes(scenario, layout) + transient_bytes(scenario, layout)
            + batch * activation_bytes_per_sample(scenario, layout))


def fits_in_memory(scenario, gpu_key: str, batch: int, layout: Layout = UNSHARDED) -> bool:
    return step_memory_bytes(scenario, batch, layout) <= get_gpu(gpu_key).memory_bytes
