"""The ops geodt's eager step dispatches from the host, counted, for the estimate's host time.

An eager step on a GPU is host-bound when the device finishes each kernel before the host has
dispatched the next: at small batches on large GPUs the step then costs its dispatches, not its
FLOPs or bytes (../shared/gpu: llama-150m's step on an H200 takes 50-62 ms from batch 1 to 4).
simulator/estimate.py prices an eager step as max(device time, host time), host time = the
ops dispatched × the host's cost per op (HOST_S_PER_OP). This script counts the ops: every aten op
a TorchDispatchMode sees in the second of two train_step calls (views and casts included:
each costs the host its dispatch; `prim.device` queries and the 0-d reads of AdamW's step counter,
not dispatched to the device, left out), for 1 and 2 decoder layers, so per layer and fixed, per
dtype (fp16: with the GradScaler). Traced under FakeTensorMode, so it runs anywhere; the counts do
not depend on the sizes.

    PYTHONPATH=. python benchmarks/count_step_ops.py
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NOT_DISPATCHED = {"prim.device", "aten._local_scalar_dense"}


def count_ops(arch, dtype: str = "bf16") -> int:
    """Ops dispatched by the second of two train_step calls of `arch` (batch 1, seq_len 64)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from train.models import build_model
    from train.step import DEFAULT_BETAS, DEFAULT_LR, DEFAULT_WEIGHT_DECAY, make_scaler, train_step

    class Counter(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func.overloadpacket) not in NOT_DISPATCHED:
                self.ops += 1
            return func(*args, **(kwargs or {}))

    with FakeTensorMode():
        model = build_model(arch, 64)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY,
                                      betas=DEFAULT_BETAS, fused=True)  # make_optimizer's on CUDA
        ids = torch.randint(0, arch.vocab_size, (1, 64))
        scaler = make_scaler("cpu", dtype)
        train_step(model, optimizer, ids, dtype, scaler)
        counter = Counter()
        with counter:
            train_step(model, optimizer, ids, dtype, scaler)
    return counter.ops


def main() -> None:
    from facts.presets import load_arch

    base = load_arch("llama-150m")
    gqa = replace(base, num_kv_heads=base.num_heads // 4)  # grouped-query attention: repeat_kv's ops
    print("dtype  ops/layer  +GQA  fixed  llama-150m  llama-1b")
    for dtype in ("bf16", "fp16", "fp32"):
        one, two = (count_ops(replace(base, num_layers=n), dtype) for n in (1, 2))
        extra = count_ops(replace(gqa, num_layers=1), dtype) - one
        print(f"{dtype:5s} {two - one:10d} {extra:5d} {2 * one - two:6d} {count_ops(base, dtype):11d} "
              f"{count_ops(load_arch('llama-1b'), dtype):9d}")


if __name__ == "__main__":
    main()
