"""CPU cost of DiLoCo's outer step per parameter, timed on the real executor's code (real/core/diloco.py).

OpenDiLoCo keeps the global weights and the outer optimizer on the CPU, so every outer sync
pays, besides the all-reduce, CPU arithmetic over every parameter: the pseudo-gradient
(copy the local weights out, θ_g − θ_local), the divide after the SUM all-reduce, the outer
Nesterov SGD step, and the copy of θ_g back into the model. This script times exactly those
calls of real.core.diloco.OuterState (everything outer_sync does but the all-reduce) on CPU tensors
shaped like a LLaMA's layers, and prints the median over repeats in nanoseconds per parameter:
the figure simulator/models/network.py's OUTER_STEP_NS_PER_PARAM holds.

The default size is scaled down (50 M parameters, 4 fp32 buffers of 200 MB) so it runs beside
other work; the cost is linear in the parameter count (memory-bound streams), so the rate per
parameter carries to the paper's 215 M model (`--params 2.15e8` times it at full size).

    PYTHONPATH=. python benchmarks/bench_outer_step.py [--params 5e7] [--repeats 7] [--threads N]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} cores, "
            f"torch {torch.__version__} with {torch.get_num_threads()} threads, Python {platform.python_version()}, "
            f"load average {load:.2f}")


def time_outer_step(params: int, repeats: int) -> list[float]:
    """Seconds per outer step (without the all-reduce), one per repeat after a warm-up (CPU state)."""
    from real.core.diloco import time_outer_step as timed

    return timed(params, repeats)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=5e7, help="parameters (default 5e7; the paper's model: 2.15e8)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    params = int(args.params)
    times = time_outer_step(params, args.repeats)
    med = statistics.median(times)
    print(f"machine: {machine()}")
    print(f"outer step without the all-reduce (pseudo-gradient, divide, Nesterov, copy back), {params:,} fp32 "
          f"parameters, {len(times)} repeats: median {med * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})")
    print(f"per parameter: {med / params * 1e9:.3f} ns (median); 215M parameters: {med / params * 2.15e8:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
