"""Memory traffic of a training step's forward + backward per token, counted op by op.

calibrate/estimate.py prices the memory-bound part of a step (norms, rotary, SwiGLU, residual
adds, casts, the loss, and the activation operands every GEMM reads and writes) as bytes per
token through the GPU's memory bandwidth. This script counts those bytes on geodt's own step
(calibrate.step.train_step's forward and backward: transformers' LlamaForCausalLM under torch
autocast, SDPA attention) under a TorchDispatchMode that sees every aten op, as
benchmarks/count_optimizer_bytes.py does for the optimizer: per op, the bytes of every tensor
it reads and writes (views move nothing). Parameters (fp32 masters), their half-precision
casts and their gradients are excluded here: they are per-step weight traffic, not per token
(calibrate.estimate.WEIGHT_BYTES_PER_PARAM). Matmul FLOPs are not bytes and are not counted.

It is a count, not a timing: deterministic, so it runs on a CPU. Two models that differ in one
size give the coefficient of that size exactly (the count is linear in h, kv and f per layer).

    PYTHONPATH=. python benchmarks/count_activation_bytes.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def count(arch, seq_len: int = 256, batch: int = 8, dtype: str = "bf16") -> float:
    """Bytes read + written per token by the forward + backward of one step, weights excluded.

    A tensor shaped like a weight (or its transpose) is per-step traffic (casts, weight
    gradients, their accumulation) and is left out; so is every 0-d tensor."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from calibrate.models import build_model
    from calibrate.step import random_batch, torch_dtype

    model = build_model(arch, seq_len)
    weight_shapes = set()
    for p in model.parameters():
        weight_shapes.add(tuple(p.shape))
        weight_shapes.add(tuple(p.shape[::-1]))
    ids = random_batch(arch.vocab_size, batch, seq_len, "cpu", torch.Generator().manual_seed(0))
    amp = torch_dtype(dtype)
    total = [0]

    def tensors(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                yield from tensors(x)

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            schema = func._schema
            if schema.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
                return out  # a view: no data moves
            for t in [*tensors(args), *tensors(list(kwargs.values())), *tensors(out)]:
                if t.dim() > 0 and tuple(t.shape) not in weight_shapes:
                    total[0] += t.nbytes
            return out

    with Count():
        with torch.autocast(device_type="cpu", dtype=amp, enabled=amp is not torch.float32):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return total[0] / (batch * seq_len)


def main() -> int:
    from dataclasses import replace

    from calibrate.presets import ModelArch

    base = ModelArch("count", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=4, ffn_size=512, vocab_size=1024)
    variants = {"base": base, "layers+1": replace(base, num_layers=3), "h+128": replace(base, hidden_size=384, num_heads=6, num_kv_heads=6),
                "ffn+256": replace(base, ffn_size=768), "kv/2": replace(base, num_kv_heads=2), "vocab+1024": replace(base, vocab_size=2048)}
    counts = {k: count(v) for k, v in variants.items()}
    per_layer = counts["layers+1"] - counts["base"]
    print(f"bytes per token: base {counts['base']:.0f}; per layer {per_layer:.0f}")
    print(f"  per layer per unit f  {(counts['ffn+256'] - counts['base']) / 2 / 256:.2f}")
    print(f"  per layer per unit kv {(counts['kv/2'] - counts['base']) / 2 / -128:.2f}")
    print(f"  per unit vocab        {(counts['vocab+1024'] - counts['base']) / 1024:.2f}")
    print(f"  h+128 total change    {counts['h+128'] - counts['base']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
