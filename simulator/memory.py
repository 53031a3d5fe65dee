"""Memory model for one GPU: does a training step at per-GPU batch b fit? (every strategy asks)

Assumptions (stated, since strategy B's answer depends on them):
- static: fp32 weights, fp32 gradients and AdamW's two fp32 moments, 16 bytes per parameter,
  plus a 2-byte half-precision copy of the weights under bf16/fp16 autocast;
- activations per sample, kept for backward with no recomputation, after Korthikanti et al.
  (2022) with a fused (SDPA/flash) attention kernel, so no seq² term:
  34 · seq · hidden bytes per layer in 16-bit (twice that in fp32), plus the logits
  (seq · vocab · (2 + 4 + 4) bytes: half-precision logits, fp32 copy for the loss, its gradient);
- a reserve of RESERVE_BYTES for the CUDA context, the allocator's fragmentation and workspaces.
Models given only as a parameter count have no activation model: only their static memory
is checked (`memory_need_bytes`), and B, whose rule is "as large as memory allows", needs a
preset or profiles.
"""
from __future__ import annotations

from calibrate.catalog import get_gpu
from formats.errors import FieldError

RESERVE_BYTES = 1.0e9
STATIC_BYTES_PER_PARAM = 16
GIB = float(2**30)


def static_memory_bytes(scenario) -> float:
    """The reserve plus weights, gradients and optimizer state: what even batch 0 needs."""
    model = scenario.model
    half = model.dtype in ("bf16", "fp16")
    return RESERVE_BYTES + model.param_count * (STATIC_BYTES_PER_PARAM + (2 if half else 0))


def memory_need_bytes(scenario, batch: int) -> float:
    """step_memory_bytes where the model has an architecture, else its static part alone."""
    if scenario.model.arch is None:
        return static_memory_bytes(scenario)
    return step_memory_bytes(scenario, batch)


def step_memory_bytes(scenario, batch: int) -> float:
    """Peak bytes of one training step at per-GPU batch `batch` (see the module docstring)."""
    model = scenario.model
    if model.arch is None:
        raise FieldError("model.preset", "strategy B needs a model preset (for activations) or node profiles")
    arch, seq = model.arch, model.seq_len
    half = model.dtype in ("bf16", "fp16")
    per_layer = 34 * seq * arch.hidden_size * (1 if half else 2)
    logits = seq * arch.vocab_size * ((2 if half else 0) + 4 + 4)
    return static_memory_bytes(scenario) + batch * (arch.num_layers * per_layer + logits)


def fits_in_memory(scenario, gpu_key: str, batch: int) -> bool:
    return step_memory_bytes(scenario, batch) <= get_gpu(gpu_key).memory_bytes
