"""CI's speed guard (issue 58): fails when `geodt simulate` at fleet size regresses by a large factor.

Measured in this one run, on whatever machine CI has (benchmarks/bench_simulator.py's scenario
and bare loop, one implementation):
1. 1024 nodes x 200 rounds: the whole `geodt simulate --strategy baseline --engine simpy`
   process (interpreter start to the last file written) over a bare SimPy barrier loop of the
   same processes and events. A ratio, so a slow or loaded machine slows both. Goal <= 3.
2. 4096 nodes x 2000 rounds, default settings: the whole process's CPU seconds (user + system:
   unlike wall time, what other jobs on the machine take is not counted), wall seconds and peak
   resident memory. Goals 10 s and 0.5 GB.

Each `geodt simulate` runs as an installed geodt runs: its modules' bytecode cached (pip compiles it
at install; a checkout writes __pycache__ on first import). The children get a cache of their own
(PYTHONPYCACHEPREFIX, a temporary folder: nothing written into the tree) even where the environment
says PYTHONDONTWRITEBYTECODE, and a first 1024 x 200 run, not counted, fills it (compiling geodt's
~70 modules from source costs each process about 0.1 s; that run's ratio is printed too).

The limits (LIMITS) are regressions, not goals: wide enough for a 2-core VM shared with other
jobs (results/fleet/README.md, "Speed guard", says how they were chosen), narrow enough that a
regression of issue 58's size (idle.png drawn a bar per node-segment: 1024 x 200 at 275x the
bare loop, 4096 x 2000 at 181 CPU s, 207 s and 1.7 GB) fails by far. Prints its figures; exit
status 1 and one line per limit broken when any is. `python benchmarks/speed_guard.py`; about
20 s on an idle 2-core VM, about a minute under load.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.strategies import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_simulator import bare_loop, bench_scenario, best_of, run_measured


@dataclass(frozen=True)
class Limits:
    process_over_bare: float  # 1024 x 200: whole process seconds / bare loop seconds
    big_cpu_s: float  # 4096 x 2000: the process's user + system seconds
    big_wall_s: float  # 4096 x 2000: wall seconds (loose: other jobs' load counts here)
    big_rss_gib: float  # 4096 x 2000: peak resident memory


LIMITS = Limits(process_over_bare=6.0, big_cpu_s=25.0, big_wall_s=120.0, big_rss_gib=1.0)


def broken(figures: dict, limits: Limits = LIMITS) -> list[str]:
    """One line per limit the figures exceed (empty: pass). figures: process_s, bare_s, big_cpu_s,
    big_wall_s, big_rss_bytes."""
    checks = [("1024 x 200: whole process / bare SimPy loop", figures["process_s"] / figures["bare_s"],
               limits.process_over_bare, "x"),
              ("4096 x 2000: CPU seconds", figures["big_cpu_s"], limits.big_cpu_s, " s"),
              ("4096 x 2000: wall seconds", figures["big_wall_s"], limits.big_wall_s, " s"),
              ("4096 x 2000: peak memory", figures["big_rss_bytes"] / 2**30, limits.big_rss_gib, " GiB")]
    return [f"speed guard: {what} {value:.2f}{unit} is above its limit {limit:g}{unit}"
            for what, value, limit, unit in checks if not value <= limit]


def simulate_process(nodes: int, rounds: int, pycache: Path, *options: str) -> tuple[float, int, float]:
    """(wall s, peak resident bytes, CPU s) of one whole `geodt simulate` of the bench scenario, its bytecode
    cached under `pycache`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    with tempfile.TemporaryDirectory(prefix="speed-guard-") as tmp:
        path = Path(tmp) / "bench.toml"
        path.write_text(bench_scenario(nodes, rounds).to_toml())
        return run_measured([sys.executable, "-m", "geodt", "simulate", str(path), "--strategy", "baseline",
                             "--out", str(Path(tmp) / "out"), *options], env=env)


def measure() -> dict:
    scenario = bench_scenario(1024, 200)
    plan = make_plan(scenario, "baseline")
    compute = np.broadcast_to([n.compute_s for n in plan.nodes], (200, 1024)).copy()
    bare_cpu_s = []  # CPU seconds too: steadier than wall seconds on a machine shared with other jobs
    bare_s = best_of(3, lambda: _timed_cpu(bare_cpu_s, lambda: bare_loop(compute, plan.comm_s)))
    with tempfile.TemporaryDirectory(prefix="speed-guard-pycache-") as pycache:
        compiling_s = simulate_process(1024, 200, Path(pycache), "--engine", "simpy")[0]  # fills the cache
        runs = [simulate_process(1024, 200, Path(pycache), "--engine", "simpy") for _ in range(2)]
        process_s, process_cpu_s = min(r[0] for r in runs), min(r[2] for r in runs)
        load = os.getloadavg()[0]
        big_wall_s, big_rss_bytes, big_cpu_s = simulate_process(4096, 2000, Path(pycache))
    return {"process_s": process_s, "bare_s": bare_s, "big_cpu_s": big_cpu_s, "big_wall_s": big_wall_s,
            "big_rss_bytes": big_rss_bytes, "load": load, "compiling_s": compiling_s, "process_cpu_s": process_cpu_s,
            "bare_cpu_s": min(bare_cpu_s)}


def _timed_cpu(times: list, fn) -> None:
    start = time.process_time()
    fn()
    times.append(time.process_time() - start)


def main() -> int:
    f = measure()
    print(f"speed guard ({os.cpu_count()} CPUs, load average {f['load']:.1f}): 1024 x 200 whole process "
          f"{f['process_s']:.2f} s / bare SimPy {f['bare_s']:.2f} s = {f['process_s'] / f['bare_s']:.2f}x "
          f"(limit {LIMITS.process_over_bare:g}x, goal 3x; the first run, compiling the bytecode, "
          f"{f['compiling_s']:.2f} s = {f['compiling_s'] / f['bare_s']:.2f}x; CPU seconds {f['process_cpu_s']:.2f} / "
          f"{f['bare_cpu_s']:.2f} = {f['process_cpu_s'] / f['bare_cpu_s']:.2f}x); 4096 x 2000 {f['big_cpu_s']:.1f} CPU s "
          f"(limit {LIMITS.big_cpu_s:g}), {f['big_wall_s']:.1f} s wall (limit {LIMITS.big_wall_s:g}; goal 10), "
          f"{f['big_rss_bytes'] / 2**30:.2f} GiB peak (limit {LIMITS.big_rss_gib:g}; goal 0.5)")
    failures = broken(f)
    for line in failures:
        print(line, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
