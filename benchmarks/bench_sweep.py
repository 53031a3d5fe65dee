"""Benchmark: `geodt sweep` of --samples scenarios of 4 nodes × all strategies (default 10^6).

Runs the sweep as its own process (`python -m geodt sweep`) and prints its wall time (goal: 10^6
scenarios under 10 minutes on a 2-core machine), its peak resident memory, the largest of its
processes' (goal: under 1 GB for any size), its CPU seconds (user + system, its workers included:
over the workers, the wall time with the cores to itself), the rows and bytes of the Parquet dataset, and the
load average before and after (the machine may be shared: a figure taken under load says so).
With --twice (default for 10^5 samples or fewer) it runs again with the same seed and says
whether the two datasets are byte-identical (they must be). Node mixes: 4 nodes of 4 GPUs,
mixed types over every catalog GPU but the nominal `cpu`, at 0.1, 1 and 10 Gbit/s.

    .venv/bin/python benchmarks/bench_sweep.py [--samples 1000000] [--workers N] [--twice]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from facts.catalog import gpu_keys
from simulator.strategies import STRATEGIES


def peak_rss_bytes(pid: int) -> int:
    """The largest resident set of a process and its children so far (VmHWM of each, Linux)."""
    try:
        import psutil
    except ImportError:
        return 0
    best = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best, int(line.split()[1]) * 1024)
        except OSError:
            pass
    return best


def run(argv: list[str]) -> tuple[float, int, float]:
    """(wall seconds, peak resident bytes of any one of its processes, CPU seconds of it and its
    workers) of one sweep process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "geodt", "sweep", *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    peak = 0
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, peak_rss_bytes(child.pid))
        time.sleep(0.5)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"geodt sweep: exit status {os.waitstatus_to_exitcode(status)}")
    return time.perf_counter() - start, peak, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--twice", action="store_true", help="run twice and compare (default at <= 10^5 samples)")
    args = parser.parse_args()
    types = ",".join(k for k in gpu_keys() if k != "cpu")
    datasets = []
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in (1, 2) if (args.twice or args.samples <= 100_000) else (1,):
            out = Path(tmp) / f"run{attempt}"
            argv = ["--nodes", "4", "--gpus-per-node", "4", "--gpu-types", types, "--mixed-nodes",
                    "--bandwidth-gbps", "0.1,1,10", "--samples", str(args.samples), "--seed", "7",
                    "--workers", str(args.workers), "--out", str(out)]
            load = os.getloadavg()[0]
            elapsed, peak, cpu = run(argv)
            parts = sorted((out / "sweep").iterdir())
            import pyarrow.parquet as pq

            rows = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
            size = sum(p.stat().st_size for p in parts)
            datasets.append([p.read_bytes() for p in parts])
            print(f"run {attempt}: {rows:,} rows ({rows // len(STRATEGIES):,} scenarios x {len(STRATEGIES)} "
                  f"strategies, findings and figures included) in {elapsed:.1f} s (goal at 10^6: < 600 s) on "
                  f"{args.workers} workers ({os.cpu_count()} cores); CPU {cpu:.0f} s, {cpu / args.workers:.0f} s "
                  f"per worker (the wall time it would take with the cores to itself); peak memory of a process "
                  f"{peak / 2**30:.2f} GiB (goal < 1 GiB); {len(parts)} parts, {size / 1e6:.0f} MB; "
                  f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    if len(datasets) == 2:
        print(f"identical dataset for the same seed: {datasets[0] == datasets[1]}")


if __name__ == "__main__":
    main()
