"""The memory geodt's training step keeps, traced on CPU, as the torch-free table the simulator reads.

simulator/models/memory.py plans batches from `facts/step_memory.csv`, which this script writes: the
bytes train/step.py's step holds at its peak, derived from the step itself rather than a formula
for another stack. Each configuration runs the step (train.step.train_step on train.models'
transformers Llama, bf16 autocast, AdamW as make_optimizer builds it on CUDA: fused) under
torch's FakeTensorMode (shapes only, nothing allocated, so any size traces on this CPU) inside
torch.distributed._tools.mem_tracker.MemTracker (how torchtitan estimates memory without a
GPU). Two steps run and the second is measured, so the AdamW moments exist, as in training.

The peak of a step is the larger of two moments:
- the optimizer step: weights, gradients, both moments and the optimizer's temporaries,
  `optimizer_bytes_per_param` × Ψ (traced at seq_len 8, where activations are negligible);
- backward: `backward_bytes_per_param` × Ψ + `fixed_bytes` + b × seq_len × the activation bytes
  per token (every saved tensor, the logits' fp32 copies and gradients, the transients of the
  backward in flight), per layer `act_h`·h + `act_kv`·kv + `act_ffn`·f plus, once, `out_h`·h +
  `out_kv`·kv + `out_ffn`·f (with full recomputation: the one layer re-formed in backward) and
  `act_vocab` per vocabulary entry.
The coefficients are fitted over small models that differ in one size at a time (1 and 2
layers, hidden, kv and ffn sizes, vocabulary; seq_len 512, batches 4 and 8: enough tokens that backward, not
the optimizer step, holds the peak even under full recomputation). The traced CPU
step takes torch's CPU SDPA kernel (flash attention for CPU: it saves q, k, v, the output and
the log-sum-exp, as the CUDA flash kernel does). Compiled steps keep less (inductor recomputes
cheap ops in backward: 25-37% less on an H200); the table is the eager step's, an upper bound
the planner uses for both.

Check (printed): the table's peak for llama-150m and llama-1b against a direct trace of each,
and against the H200's measured peaks (../shared/gpu, copied to benchmarks/estimate/h200).

    PYTHONPATH=. python benchmarks/trace_step_memory.py [--out facts/step_memory.csv] [--check]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from facts.presets import ModelArch, load_arch
from simulator.models.memory import traced_peak_bytes
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEQ = 512
BATCHES = (4, 8)
COLUMNS = ("dtype", "checkpointing", "optimizer_bytes_per_param", "backward_bytes_per_param", "fixed_bytes",
           "act_h", "act_kv", "act_ffn", "out_h", "out_kv", "out_ffn", "act_vocab", "torch_version")


def trace_peak(arch, seq_len: int, batch: int, dtype: str = "bf16", checkpointing: str = "none") -> float:
    """Peak bytes of the second of two train_step calls, traced under FakeTensorMode + MemTracker."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from train.step import DEFAULT_BETAS, DEFAULT_LR, DEFAULT_WEIGHT_DECAY, train_step

    with FakeTensorMode():
        model = build_model(arch, seq_len)
        model.train()
        if checkpointing == "full":
            model.activation_checkpointing_enable({"use_reentrant": False})
        # make_optimizer's CUDA optimizer (fused AdamW): the step a GPU runs.
        optimizer = torch.optim.AdamW(model.parameters(), lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY,
                                      betas=DEFAULT_BETAS, fused=True)
        ids = torch.randint(0, arch.vocab_size, (batch, seq_len))
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            train_step(model, optimizer, ids, dtype)
            tracker.reset_mod_stats()
            train_step(model, optimizer, ids, dtype)
        return float(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def _variants():
    base = ModelArch("mem", hidden_size=256, num_layers=1, num_heads=4, num_kv_heads=4, ffn_size=512, vocab_size=1024)
    return base, [base, replace(base, hidden_size=384, num_heads=6, num_kv_heads=6), replace(base, num_kv_heads=2),
                  replace(base, ffn_size=768)]


def fit(dtype: str, checkpointing: str, progress=None) -> dict:
    """One table row: the coefficients of the module docstring, fitted from traces."""
    import torch

    def traced(arch, seq, batch):
        value = trace_peak(arch, seq, batch, dtype, checkpointing)
        if progress is not None:
            progress.update(1)
        return value

    base, variants = _variants()

    def per_token(arch):  # activation bytes per token, and the b = 0 intercept
        lo, hi = (traced(arch, SEQ, b) for b in BATCHES)
        slope = (hi - lo) / (BATCHES[1] - BATCHES[0])
        return slope / SEQ, lo - BATCHES[0] * slope

    sizes, layer, outside, intercepts, params = [], [], [], [], []
    for arch in variants:
        one, icpt = per_token(arch)
        two, icpt2 = per_token(replace(arch, num_layers=2))
        sizes.append([arch.hidden_size, arch.num_kv_heads * arch.head_dim, arch.ffn_size])
        layer.append(two - one)
        outside.append(one - (two - one))
        intercepts += [icpt, icpt2]
        params += [arch.params, replace(arch, num_layers=2).params]
    (a_h, a_kv, a_f), *_ = np.linalg.lstsq(np.array(sizes, float), np.array(layer), rcond=None)
    wide, _ = per_token(replace(base, vocab_size=2 * base.vocab_size))
    one_base = outside[0] + layer[0]
    act_vocab = (wide - one_base) / base.vocab_size
    rest = np.array(outside) - act_vocab * base.vocab_size
    (o_h, o_kv, o_f), *_ = np.linalg.lstsq(np.array(sizes, float), rest, rcond=None)
    (per_param, fixed), *_ = np.linalg.lstsq(np.column_stack([params, np.ones(len(params))]),
                                             np.array(intercepts), rcond=None)
    optimizer = traced(base, 8, 1) / base.params  # seq 8: the optimizer step's peak
    return {"dtype": dtype, "checkpointing": checkpointing, "optimizer_bytes_per_param": round(optimizer, 3),
            "backward_bytes_per_param": round(float(per_param), 3), "fixed_bytes": round(float(fixed)),
            "act_h": round(float(a_h), 2), "act_kv": round(float(a_kv), 2), "act_ffn": round(float(a_f), 2),
            "out_h": round(float(o_h), 2), "out_kv": round(float(o_kv), 2), "out_ffn": round(float(o_f), 2),
            "act_vocab": round(float(act_vocab), 2), "torch_version": torch.__version__.split("+")[0]}


def write_table(rows: list[dict], out: Path) -> None:
    text = pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False, lineterminator="\n")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, out)


def check(table: Path) -> None:
    """The table's peaks against direct traces and the H200's measured peaks (printed)."""
    h200 = Path(__file__).with_name("estimate") / "h200"
    for preset, batches in (("llama-150m", (8, 32, 128)), ("llama-1b", (8, 32, 42))):
        arch = load_arch(preset)
        frame = pd.read_csv(h200 / f"h200-{preset}-bf16.csv")
        measured = dict(zip(frame.batch_size, frame.peak_mem_bytes))
        for batch in batches:
            model = traced_peak_bytes(arch, 1024, batch, "bf16", "none", table)
            direct = trace_peak(arch, 1024, batch)
            print(f"{preset} b{batch}: table {model / 1e9:.2f} GB, direct trace {direct / 1e9:.2f} GB "
                  f"({100 * (model - direct) / direct:+.1f}%), H200 measured {measured[batch] / 1e9:.2f} GB "
                  f"({100 * (model - measured[batch]) / measured[batch]:+.1f}%)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "facts" / "step_memory.csv")
    parser.add_argument("--check", action="store_true", help="only compare the table with traces and the H200")
    args = parser.parse_args(argv)
    if not args.check:
        configs = [("bf16", "none"), ("bf16", "full"), ("fp32", "none"), ("fp32", "full")]
        with tqdm(total=len(configs) * 19, desc="traces", file=sys.stderr) as bar:
            rows = [fit(dtype, ckpt, bar) for dtype, ckpt in configs]
        write_table(rows, args.out)
        print(Path(args.out).read_text())
    check(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
