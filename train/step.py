"""One training step, exactly as geodt times it and as the real executor runs it.

`calibrate` times this function and `real/` trains with it, so a profile measures the very
code path a DiLoCo inner step executes: forward with loss, backward, gradient clipping,
AdamW step, zero_grad. Keep it that way: anything added here changes both.

    model = build_model(arch, seq_len).to(device)
    optimizer = make_optimizer(model)                 # OpenDiLoCo's inner AdamW
    scaler = make_scaler(device, "bf16")              # None unless fp16
    batch = random_batch(arch.vocab_size, 4, seq_len, device)
    loss = train_step(model, optimizer, batch, "bf16", scaler)   # detached tensor

Mixed precision is `torch.autocast` in the step's dtype with fp32 master weights.
fp16 uses a GradScaler (loss scaling) on every device torch supports it on; bf16 and fp32
need none. On CPU, torch (>= 2.3) has fp16 autocast and a CPU GradScaler, so fp16 runs as
fp16 there too (slowly: CPUs rarely have fast fp16 kernels), never silently as something else.

The lean step ([training] compile, docs/DESIGN.md): `compile_blocks(model)` compiles every
decoder layer in place with torch.compile, as torchtitan does (per block, before FSDP2 wraps
the blocks: identical blocks share one compiled graph, and module names, hence checkpoints, do
not change); the loss and the optimizer stay eager. `make_optimizer` uses torch's fused AdamW
on CUDA (one kernel per parameter group instead of the foreach ops' eight passes), foreach
elsewhere. Neither changes the arithmetic: the compiled step equals the eager one within float
rounding (tests/test_step_compile.py).
"""
from __future__ import annotations

from typing import Any

import torch

from formats.scenario import compiled_step

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# OpenDiLoCo's inner optimizer (docs/DESIGN.md, "Real executor").
DEFAULT_LR = 4e-4
DEFAULT_WEIGHT_DECAY = 0.1
DEFAULT_BETAS = (0.9, 0.95)
CLIP_NORM = 1.0


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'bf16' | 'fp16' | 'fp32' (or a torch dtype) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}") from None


def make_optimizer(model: torch.nn.Module, lr: float = DEFAULT_LR,
                   weight_decay: float = DEFAULT_WEIGHT_DECAY,
                   betas: tuple[float, float] = DEFAULT_BETAS) -> torch.optim.AdamW:
    """The inner AdamW over all parameters (weight decay on all, as OpenDiLoCo does): fused on
    CUDA (the lean stack's), torch's default (foreach) elsewhere, so CPU runs stay as they were."""
    params = list(model.parameters())
    fused = bool(params) and params[0].device.type == "cuda"
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None)


def use_compile(mode: str, device: torch.device | str) -> bool:
    """Whether the step is compiled: [training] compile "on" | "off" | "auto" (on for CUDA devices,
    off for CPU, where compiling even a tiny model takes minutes); formats/scenario.py's rule."""
    return compiled_step(mode, torch.device(device).type == "cuda")


def compile_blocks(model: torch.nn.Module) -> None:
    """torch.compile every decoder layer in place (torchtitan's apply_compile): call it after
    activation checkpointing and before FSDP2's fully_shard, as torchtitan orders them."""
    for layer in model.model.layers:
        layer.compile()


def make_scaler(device: torch.device | str, dtype: str | torch.dtype) -> Any | None:
    """A GradScaler for fp16 on the device's type; None for bf16/fp32 (no loss scaling needed)."""
    if torch_dtype(dtype) is not torch.float16:
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def random_batch(vocab_size: int, batch_size: int, seq_len: int, device: torch.device | str,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform random token ids of shape (batch_size, seq_len): content does not change timing."""
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
    return ids.to(device)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor,
               dtype: str | torch.dtype, scaler: Any | None = None,
               scheduler: Any | None = None, grad_sync: Any | None = None) -> torch.Tensor:
    """One full training step on `batch` (token ids, shape (b, seq_len)); returns the loss.

    The labels are the inputs: transformers' causal-LM loss shifts them by one itself, so
    each position predicts the next token. The loss comes back detached and NOT synchronised
    (no `.item()`), so a caller timing the step decides when to wait for the device.
    `scheduler`, if given, is stepped after the optimizer (the executor's warm-up).
    `grad_sync(model)`, if given, runs right after backward (before unscaling and clipping):
    the executor's intra-node data parallelism averages the devices' gradients there, as DDP.
    """
    device_type = batch.device.type
    amp_dtype = torch_dtype(dtype)
    with torch.autocast(device_type=device_type, dtype=amp_dtype, enabled=amp_dtype is not torch.float32):
        loss = model(input_ids=batch, labels=batch).loss
    if scaler is not None:
        scaler.scale(loss).backward()
        if grad_sync is not None:
            grad_sync(model)
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        if grad_sync is not None:
            grad_sync(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return loss.detach()
