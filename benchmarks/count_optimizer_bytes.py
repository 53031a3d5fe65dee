"""Memory traffic of the per-step fixed cost of train/step.py's training step, counted op by op.

simulator/models/timing.py prices the part of a step that does not grow with the batch (gradient
unscaling, clipping, the AdamW update) as OPTIMIZER_BYTES_PER_PARAM bytes of memory traffic per
parameter through the GPU's memory bandwidth. This script counts those bytes on the exact code
path: it runs train.step.train_step (forward, backward, GradScaler.unscale_ under fp16,
clip_grad_norm_, AdamW, zero_grad) under a TorchDispatchMode that sees every aten op, and from
the first foreach op on (the first op after backward) adds up, per op, the bytes of every
tensor it reads and of every tensor it writes (in-place arguments and fresh outputs; views move
nothing). AdamW runs its foreach implementation, torch's default on CUDA (on CPU torch defaults
to the per-tensor loop, which makes the same passes).

It is a count, not a timing: deterministic, so it runs anywhere. Each op is assumed to stream
its operands once (no cache reuse across ops: the parameters are far larger than any cache).

    PYTHONPATH=. python benchmarks/count_optimizer_bytes.py [--preset tiny] [--dtype fp16 bf16]
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from facts.presets import load_arch
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _tensors(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def count(preset: str = "tiny", dtype: str = "fp16", seq_len: int = 32, batch: int = 2) -> tuple[dict, int]:
    """Bytes read + written per aten op (summed by op name) after backward, and the parameter count."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from train.step import make_optimizer, make_scaler, random_batch, train_step

    arch = load_arch(preset)
    model = build_model(arch, seq_len)
    optimizer = make_optimizer(model)
    for group in optimizer.param_groups:
        group["foreach"] = True  # CUDA's default implementation
    scaler = make_scaler("cpu", dtype)
    batch_ids = random_batch(arch.vocab_size, batch, seq_len, "cpu", torch.Generator().manual_seed(0))
    train_step(model, optimizer, batch_ids, dtype, scaler)  # first step creates the AdamW state

    per_op: dict[str, int] = defaultdict(int)

    class Count(TorchDispatchMode):
        started = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "foreach" in str(func.overloadpacket):
                self.started = True
            out = func(*args, **kwargs)
            if not self.started:
                return out
            schema = func._schema
            inputs = {}
            written = {}
            for arg, value in zip(schema.arguments, [*args, *[kwargs.get(a.name) for a in schema.arguments[len(args):]]]):
                for t in _tensors(value):
                    inputs[t.data_ptr(), t.nbytes] = t.nbytes
                    if arg.alias_info is not None and arg.alias_info.is_write:
                        written[t.data_ptr(), t.nbytes] = t.nbytes
            views = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns) and schema.returns
            if views and not written:
                return out  # a view, or detach: no data moves
            for t in _tensors(out):
                key = (t.data_ptr(), t.nbytes)
                if key not in inputs:
                    written[key] = t.nbytes
            per_op[str(func.overloadpacket).split(".")[-1]] += sum(inputs.values()) + sum(written.values())
            return out

    with Count():
        train_step(model, optimizer, batch_ids, dtype, scaler)
    return dict(per_op), sum(p.numel() for p in model.parameters())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--dtype", nargs="+", default=["fp16", "bf16"])
    args = p.parse_args(argv)
    for dtype in args.dtype:
        per_op, params = count(args.preset, dtype)
        total = sum(per_op.values())
        print(f"{args.preset}, {dtype}: {params:,} parameters; bytes per parameter after backward, by op:")
        for name, b in sorted(per_op.items(), key=lambda kv: -kv[1]):
            if b / params >= 0.05:
                print(f"  {name:45s} {b / params:6.1f}")
        print(f"  {'total':45s} {total / params:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
