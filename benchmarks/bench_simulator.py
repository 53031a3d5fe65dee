"""Simulator throughput: the SimPy engine against a bare SimPy barrier loop, and the analytic path.

Prints node-rounds per second at 1024 nodes × 200 rounds for (1) `simulate(..., "simpy")`
(engine, recorder and timeline DataFrame included), (2) a bare loop of the same processes,
timeouts and barrier events with no recording, and (3) `simulate(..., "analytic")`; then the
ratios engine / bare (goal >= 0.7) and analytic / engine (goal >= 100). Then (4) the whole
`geodt simulate SCENARIO --strategy baseline --engine simpy` process of the same scenario
(interpreter start, imports, scenario, plan, simulation, report and every output: plan.csv,
timeline.parquet, summary.csv, syncs.parquet, trace.json, scenario.toml), and its time over the
bare loop's (goal <= 3). Best of --repeats runs each, all measured in this one run. Then (5) the
whole process at fleet size, --big-nodes x --big-rounds (4096 x 2000) with default settings
(engine auto, the timeline aggregated above 10^6 node-rounds): its wall time (goal < 60 s) and
peak resident memory (goal < 1 GB), once, and the load average seen meanwhile (the machine may be
shared). Then (6) planning at --plan-rounds (10^5) rounds: make_plan of every strategy on the
built-in `paper` scenario, per strategy, against the same at 100 rounds (goal: seconds, and the
streaming planner's search no longer growing with the rounds).

Then the same for Streaming DiLoCo (--fragments P, --delay τ): `simulate_syncs(..., "simpy")`
(fragment-sync engine, segments, timeline and syncs DataFrames) against a bare loop of the same
events (per node and fragment: the compute timeout, the non-blocking arrival, the τ window's
timeout, the wait for the all-reduce's end, the outer step's timeout; per fragment one
all-reduce timeout that triggers the end), and its ratio bare / engine (goal: the engine within
2× of the bare loop, ratio >= 0.5).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import simpy

from simulator.engines.engine import outer_share_s, simulate, simulate_syncs
from simulator.engines.engine_simpy import Barrier
from simulator.models.workload import segment_matrices
from simulator.scenario import ModelConfig, NodeConfig, Scenario, TrainingConfig, load_scenario
from simulator.strategies import STRATEGIES, make_plan


def bare_loop(compute: np.ndarray, comm_s: float) -> None:
    env = simpy.Environment()
    barrier = Barrier(env, compute.shape[1])

    def node(column):
        timeout, wait = env.timeout, barrier.wait
        for busy_s in column.tolist():
            yield timeout(busy_s)
            yield wait()
            yield timeout(comm_s)

    for i in range(compute.shape[1]):
        env.process(node(compute[:, i]))
    env.run()


def bare_streaming_loop(pre: np.ndarray, delay: np.ndarray, allreduce_s: float, outer_s: float) -> None:
    env = simpy.Environment()
    n = pre.shape[1]
    state = {"arrived": 0, "done": env.event()}

    def arrive():
        done = state["done"]
        state["arrived"] += 1
        if state["arrived"] == n:
            state["arrived"], state["done"] = 0, env.event()
            env.timeout(allreduce_s).callbacks.append(lambda _: done.succeed())
        return done

    def node(pre_i, delay_i):
        timeout = env.timeout
        for busy_s, window_s in zip(pre_i, delay_i):
            yield timeout(busy_s)
            done = arrive()
            if window_s:
                yield timeout(window_s)
            if not done.triggered:
                yield done
            yield timeout(outer_s)

    for i in range(n):
        env.process(node(pre[:, i].tolist(), delay[:, i].tolist()))
    env.run()


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_scenario(nodes: int, rounds: int) -> Scenario:
    """nodes of one A30 each, step times uniform in 0.1-0.5 s (seed 0), llama-150m, H = 100."""
    rng = np.random.default_rng(0)
    config = tuple(NodeConfig(name=f"n{i}", gpus={"a30": 1}, step_time_s=float(s))
                   for i, s in enumerate(rng.uniform(0.1, 0.5, nodes)))
    scenario = Scenario(name="bench", nodes=config, model=ModelConfig(preset="llama-150m"),
                        training=TrainingConfig(rounds=rounds, local_steps=100, batch_size=4))
    scenario.model.resolve(None)
    return scenario


def run_measured(command: list[str], env: dict | None = None) -> tuple[float, int, float]:
    """(wall seconds, peak resident bytes, CPU seconds) of one child process (os.wait4's rusage); env: its
    environment (default: this process's)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)}: exit status {os.waitstatus_to_exitcode(status)}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # ru_maxrss: kilobytes on Linux


def whole_process(scenario: Scenario, repeats: int, *options: str) -> tuple[float, int, int, float]:
    """Best wall time of `geodt simulate` on the scenario (written as TOML), its peak memory then,
    the bytes it wrote and its CPU seconds then."""
    with tempfile.TemporaryDirectory(prefix="bench-simulate-") as tmp:
        path = Path(tmp) / "bench.toml"
        path.write_text(scenario.to_toml())
        command = [sys.executable, "-m", "geodt", "simulate", str(path), "--strategy", "baseline",
                   "--out", str(Path(tmp) / "out"), *options]
        seconds, peak, cpu = min(run_measured(command) for _ in range(repeats))
        written = sum(p.stat().st_size for p in (Path(tmp) / "out").iterdir())
    return seconds, peak, written, cpu


def planning(rounds: int) -> dict[str, tuple[float, float]]:
    """Per strategy, make_plan's seconds on `paper` at `rounds` rounds and at 100."""
    long, short = (load_scenario("paper", [f"training.rounds={r}"]) for r in (rounds, 100))
    times = {}
    for name in STRATEGIES:
        times[name] = tuple(best_of(1, lambda sc=sc, name=name: make_plan(sc, name)) for sc in (long, short))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--delay", type=int, default=2)
    parser.add_argument("--big-nodes", type=int, default=4096)
    parser.add_argument("--big-rounds", type=int, default=2000)
    parser.add_argument("--plan-rounds", type=int, default=100_000)
    args = parser.parse_args()

    scenario = bench_scenario(args.nodes, args.rounds)
    plan = make_plan(scenario, "baseline")
    compute = np.broadcast_to([n.compute_s for n in plan.nodes], (args.rounds, args.nodes)).copy()
    node_rounds = args.nodes * args.rounds

    engine_s = best_of(args.repeats, lambda: simulate(scenario, plan, "simpy"))
    bare_s = best_of(args.repeats, lambda: bare_loop(compute, plan.comm_s))
    analytic_s = best_of(args.repeats, lambda: simulate(scenario, plan, "analytic"))
    process_s, _, written, _ = whole_process(scenario, args.repeats, "--engine", "simpy")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}, simpy {simpy.__version__}")
    print(f"{args.nodes} nodes x {args.rounds} rounds = {node_rounds} node-rounds, best of {args.repeats}")
    print(f"engine (simpy, recorded)   {node_rounds / engine_s:12,.0f} node-rounds/s  ({engine_s:.3f} s)")
    print(f"bare simpy barrier loop    {node_rounds / bare_s:12,.0f} node-rounds/s  ({bare_s:.3f} s)")
    print(f"analytic path              {node_rounds / analytic_s:12,.0f} node-rounds/s  ({analytic_s:.4f} s)")
    print(f"engine / bare loop: {bare_s / engine_s:.2f}   (goal >= 0.7)")
    print(f"analytic / engine:  {engine_s / analytic_s:.0f}x  (goal >= 100x)")
    print(f"whole geodt simulate --engine simpy process  {process_s:.3f} s, {written / 1e6:.1f} MB written")
    print(f"whole process / bare loop: {process_s / bare_s:.2f}   (goal <= 3)")

    big = bench_scenario(args.big_nodes, args.big_rounds)
    load_before = os.getloadavg()[0]
    big_s, big_peak, big_written, big_cpu = whole_process(big, 1)
    print(f"fleet size, default settings: {args.big_nodes} nodes x {args.big_rounds} rounds "
          f"= {args.big_nodes * args.big_rounds:,} node-rounds")
    print(f"whole geodt simulate process  {big_s:.1f} s (goal < 60 s; {big_cpu:.1f} CPU s), peak memory {big_peak / 2**30:.2f} GiB "
          f"(goal < 1 GiB), {big_written / 1e6:.1f} MB written; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs")

    plan_times = planning(args.plan_rounds)
    print(f"planning every strategy of `paper` at {args.plan_rounds:,} rounds (and at 100): "
          f"{sum(t for t, _ in plan_times.values()):.2f} s in all (goal: seconds)")
    for name, (long_s, short_s) in plan_times.items():
        print(f"  {name:16s} {long_s:7.3f} s  ({short_s:.3f} s at 100 rounds)")

    streaming = replace(plan, fragments=args.fragments, sync_delay_steps=args.delay)
    pre, delay = segment_matrices(scenario, streaming)
    outer = outer_share_s(scenario, streaming)
    syncs = node_rounds * args.fragments
    stream_s = best_of(args.repeats, lambda: simulate_syncs(scenario, streaming, "simpy"))
    bare_stream_s = best_of(args.repeats, lambda: bare_streaming_loop(np.ascontiguousarray(pre),
                                                                      np.ascontiguousarray(delay),
                                                                      streaming.comm_s - outer, outer))
    print(f"streaming: {args.fragments} fragments, sync_delay_steps {args.delay}: {syncs} node-fragment syncs")
    print(f"engine (simpy, recorded)   {syncs / stream_s:12,.0f} node-syncs/s   ({stream_s:.3f} s)")
    print(f"bare simpy loop            {syncs / bare_stream_s:12,.0f} node-syncs/s   ({bare_stream_s:.3f} s)")
    print(f"bare loop / engine: {bare_stream_s / stream_s:.2f}   (goal >= 0.5: the engine within 2x)")


if __name__ == "__main__":
    main()
