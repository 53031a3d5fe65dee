"""Benchmark: `geodt sweep` of 10,000 scenarios of 4 nodes × all strategies, run twice with one seed.

Prints the wall time of each run (goal: under a minute on a 2-core machine) and whether the
two sweep.csv files are byte-identical (they must be). Node mixes: 4 nodes of 4 GPUs, mixed
types over every catalog GPU but the nominal `cpu`, at 0.1, 1 and 10 Gbit/s.

    .venv/bin/python benchmarks/bench_sweep.py [--samples 10000] [--workers N]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    from facts.catalog import gpu_keys
    from simulator.strategies import STRATEGIES
    from simulator.sweep_cli import main as sweep

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    types = ",".join(k for k in gpu_keys() if k != "cpu")
    outputs = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in (1, 2):
            out = Path(tmp) / f"run{run}"
            argv = ["--nodes", "4", "--gpus-per-node", "4", "--gpu-types", types, "--mixed-nodes",
                    "--bandwidth-gbps", "0.1,1,10", "--samples", str(args.samples), "--seed", "7",
                    "--workers", str(args.workers), "--out", str(out)]
            start = time.perf_counter()
            assert sweep(argv) == 0
            elapsed = time.perf_counter() - start
            outputs.append((out / "sweep.csv").read_bytes())
            rows = outputs[-1].count(b"\n") - 1
            print(f"run {run}: {rows} rows ({rows // len(STRATEGIES)} scenarios x {len(STRATEGIES)} strategies, figures included) "
                  f"in {elapsed:.1f} s on {args.workers} workers ({os.cpu_count()} cores)")
    print(f"identical sweep.csv for the same seed: {outputs[0] == outputs[1]}")


if __name__ == "__main__":
    main()
