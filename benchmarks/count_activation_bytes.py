"""Memory traffic of a training step's forward + backward per token, counted op by op on geodt's own step.

simulator/models/estimate.py prices the memory-bound part of a step (norms, rotary, SwiGLU, residual
adds, casts, the loss, and the activation operands every GEMM reads and writes) as bytes per
token through the GPU's memory bandwidth, from an op-by-op count of a lean training stack
(ACT_BYTES_*: 58h + 12kv + 16f forward bytes per token per layer, ×3 with backward). This script
counts the same traffic on geodt's own step (transformers' LlamaForCausalLM under torch autocast,
SDPA attention: train.step's forward and backward) under a TorchDispatchMode that sees every
aten op: per op, the bytes of every tensor it reads and writes (views move nothing). Tensors
shaped like a weight (casts, weight gradients, their accumulation) are per-step traffic and are
left out, as are 0-d tensors. Matmul FLOPs are not bytes and are not counted.

What it shows (torch 2.13, this CPU; a count, so it runs anywhere):
- backward moves 1.79x the forward's bytes (loss and embedding included): the estimate's PASSES = 3;
- the eager step runs EAGER_KERNELS_PER_LAYER data-moving ops per layer, forward + backward (each a
  kernel launch on a GPU; the lean estimate's KERNELS_PER_LAYER is 120);
- transformers' eager Llama moves far more than a lean stack: about 577h + 130kv + 54f bytes
  per token per layer (fp32 RMSNorm in several kernels, casts, rotary's cat/neg/mul, GQA's
  repeat_kv copies), about 3x the estimate's 3 × (58h + 12kv + 16f). The estimate describes the
  published, optimised stacks (fused or compiled norms, flash attention); geodt's own eager
  step is slower than it by that traffic, which a calibration profile measures.

    PYTHONPATH=. python benchmarks/count_activation_bytes.py
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from facts.presets import ModelArch
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def count(arch, seq_len: int = 256, batch: int = 8, dtype: str = "bf16", split: bool = False,
          kernels: bool = False):
    """Bytes read + written per token by the forward + backward of one step, weights excluded
    ((forward, backward) if split; the number of data-moving ops, each a kernel on a GPU, if kernels).

    A tensor shaped like a weight (or its transpose) is per-step traffic (casts, weight
    gradients, their accumulation) and is left out; so is every 0-d tensor."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from train.step import random_batch, torch_dtype

    model = build_model(arch, seq_len)
    weight_shapes = set()
    for p in model.parameters():
        weight_shapes.add(tuple(p.shape))
        weight_shapes.add(tuple(p.shape[::-1]))
    ids = random_batch(arch.vocab_size, batch, seq_len, "cpu", torch.Generator().manual_seed(0))
    amp = torch_dtype(dtype)
    total = [0]
    ops = [0]

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
            ops[0] += 1
            for t in [*tensors(args), *tensors(list(kwargs.values())), *tensors(out)]:
                if t.dim() > 0 and tuple(t.shape) not in weight_shapes:
                    total[0] += t.nbytes
            return out

    with Count():
        with torch.autocast(device_type="cpu", dtype=amp, enabled=amp is not torch.float32):
            loss = model(input_ids=ids, labels=ids).loss
        forward = total[0]
        loss.backward()
    if kernels:
        return ops[0]
    if split:
        return forward / (batch * seq_len), (total[0] - forward) / (batch * seq_len)
    return total[0] / (batch * seq_len)


def main() -> int:
    base = ModelArch("count", hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=4, ffn_size=512, vocab_size=1536)
    variants = [base, replace(base, hidden_size=384, num_heads=6, num_kv_heads=6), replace(base, num_kv_heads=2),
                replace(base, ffn_size=768)]
    sizes, per_layer = [], []
    for arch in variants:  # one layer more isolates the per-layer bytes
        sizes.append([arch.hidden_size, arch.num_kv_heads * arch.head_dim, arch.ffn_size])
        per_layer.append(count(replace(arch, num_layers=2)) - count(arch))
    (h, kv, f), *_ = np.linalg.lstsq(np.array(sizes, float), np.array(per_layer), rcond=None)
    fwd, bwd = count(base, split=True)
    vocab = (count(replace(base, vocab_size=3072)) - count(base)) / 1536
    kernels = count(replace(base, num_layers=2), kernels=True) - count(base, kernels=True)
    print(f"transformers Llama, bf16 autocast: {h:.0f}h + {kv:.0f}kv + {f:.0f}f bytes per token per layer "
          f"(forward + backward), {vocab:.0f} bytes per vocabulary entry; backward/forward {bwd / fwd:.2f}; "
          f"{kernels} data-moving ops (GPU kernels) per layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
