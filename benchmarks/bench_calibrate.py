"""Harness overhead: `Calibrator.measure`'s median step time against a bare loop of the same step.

Both run in this process on the same model, optimizer and batch, interleaved round by round
(harness, bare, harness, bare, ...) so that drift in the machine's speed hits both alike. The
bare loop is what a training script does: `train_step` back to back, one clock read around
the whole loop (synchronising first and last on CUDA), mean per step. Reported: the median
over rounds of each, and their ratio (goal: within 2%).

    python benchmarks/bench_calibrate.py [--device cpu|cuda:0] [--model tiny] [--seq-len 256]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from facts.presets import load_arch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtype", default=None, help="[fp32 on CPU, bf16 on CUDA]")
    p.add_argument("--repeats", type=int, default=20, help="steps per harness measure and per bare loop")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    import torch

    from calibrate.harness import Calibrator
    from train.step import random_batch, train_step

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    cal = Calibrator(load_arch(args.model), args.seq_len, dtype, args.device, args.repeats, warmup=3)
    device = torch.device(args.device)
    batch = random_batch(cal.arch.vocab_size, args.batch, args.seq_len, device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def bare_loop() -> float:
        for _ in range(3):  # the same warm-up the harness gives itself
            train_step(cal.model, cal.optimizer, batch, dtype, cal.scaler)
        sync()
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            train_step(cal.model, cal.optimizer, batch, dtype, cal.scaler)
        sync()
        return (time.perf_counter() - t0) / args.repeats

    harness_s, harness_mean_s, bare_s = [], [], []
    for r in range(args.rounds):
        m = cal.measure(args.batch)
        harness_s.append(statistics.median(m.times_s))
        harness_mean_s.append(statistics.fmean(m.times_s))
        bare_s.append(bare_loop())
        print(f"round {r + 1}/{args.rounds}: harness median {harness_s[-1] * 1e3:8.3f} ms   "
              f"bare loop {bare_s[-1] * 1e3:8.3f} ms/step", flush=True)
    h, b = statistics.median(harness_s), statistics.median(bare_s)
    print(f"{args.model} seq_len {args.seq_len} batch {args.batch} {dtype} on {args.device} "
          f"({torch.get_num_threads()} threads), {args.rounds} rounds x {args.repeats} steps")
    print(f"harness median step: {h * 1e3:.3f} ms")
    print(f"bare loop step:      {b * 1e3:.3f} ms")
    print(f"ratio harness/bare:  {h / b:.4f}  ({100 * (h / b - 1):+.2f}%; goal within 2%)")
    # Same statistic on both sides (mean per step), and the noise floor of this machine:
    hm = statistics.median(harness_mean_s)
    print(f"harness mean step:   {hm * 1e3:.3f} ms  (ratio to bare {hm / b:.4f}, {100 * (hm / b - 1):+.2f}%)")
    print(f"bare loop across rounds: {min(bare_s) * 1e3:.3f} .. {max(bare_s) * 1e3:.3f} ms "
          f"({100 * (max(bare_s) / min(bare_s) - 1):.1f}% spread: differences below it are noise)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
