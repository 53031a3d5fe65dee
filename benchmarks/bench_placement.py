"""Where the scheduler puts a scenario's device processes, and what that costs their step.

A scenario's CPU devices are processes under CPU quotas; without `cpu_cores` the kernel's
scheduler chooses the core each runs on, moment to moment. Two measurements:

1. **free against pinned.** Sessions alternate (free, pinned, free, ...) so that the machine's
   drift over minutes falls on both alike. In each, every device process builds the model under
   its node's quota, waits at a barrier, then steps one fixed batch back to back for --seconds;
   its steady step is the median of those after the first 2 s. Free: no core affinity, as the
   scenario runs; pinned: the cores of --pinned (the scenario with `cpu_cores`).
2. **co-location, calibration against run.** `geodt calibrate scenario` and then `geodt validate
   --strategy measured-steps` of the free scenario at that calibration, while every 10 ms each
   device process's runnable threads, and the CPU each is on, are read from /proc. A device's
   share is the fraction of the samples in which it was runnable that another device was runnable
   on the same CPU: the time it competed for its core. The whole of each process's life counts
   (start and model build included), in both alike.

    python benchmarks/bench_placement.py [--scenario benchmarks/fidelity/three-node.toml]
        [--pinned benchmarks/fidelity/three-node-pinned.toml] [--sessions 12] [--seconds 8]
        [--out results/predict-the-run/placement]

Writes steps.csv (every step of part 1), colocation.csv, ahead.csv (part 1's sessions: how well their first
2 s predict the rest, in the same processes) and table.md; needs root (CPU quotas). `--tables-only`
recomputes ahead.csv and table.md from the files already in --out.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from facts.presets import load_arch
from simulator.scenario import load_scenario
from train.cpulimit import apply_cpu_limits, device_cores
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_fidelity import ROOT, with_profiles
from benchmarks.bench_interference import environment, markdown, write_files
from facts.fidelity import IDLE_WORST, ROUND_MEDIAN

STEADY_AFTER_S = 2.0
SAMPLE_S = 0.01
# ahead(): the seconds a prediction made inside the session is taken from, and where what it predicts starts
EARLY_S, LATE_AFTER_S = 2.0, 4.0
ROUND_PCT, IDLE_PCT = ROUND_MEDIAN.limit_pct, IDLE_WORST.limit_pct


def _jobs(scenario_path: str) -> tuple[object, list[tuple]]:
    scenario = load_scenario(scenario_path, without_profiles=True)
    return scenario, [(n.name, j, n.gpu_count, n.cpu_cores, n.cpu_quota)
                      for n in scenario.nodes for j in range(n.gpu_count)]


def _stepper(rank: int, jobs: list, setup: dict, barrier, queue) -> None:
    import torch

    from train.step import make_optimizer, random_batch, train_step

    node, j, gpus, cores, quota = jobs[rank]
    cleanup = apply_cpu_limits(device_cores(cores, gpus, j), quota, f"geodt-place-{rank}")
    try:
        torch.set_num_threads(1)
        arch = load_arch(setup["preset"])
        model = build_model(arch, setup["seq_len"], 0)
        model.train()
        optimizer = make_optimizer(model)
        batch = random_batch(arch.vocab_size, setup["batch"], setup["seq_len"], "cpu")
        for _ in range(3):  # warm-up, untimed
            train_step(model, optimizer, batch, setup["dtype"])
        barrier.wait()
        start, rows = time.perf_counter(), []
        while time.perf_counter() - start < setup["seconds"]:
            t0 = time.perf_counter()
            train_step(model, optimizer, batch, setup["dtype"])
            rows.append((node, j, t0 - start, time.perf_counter() - t0))
        queue.put(rows)
    finally:
        cleanup()


def free_against_pinned(free_path: str, pinned_path: str, sessions: int, seconds: float) -> pd.DataFrame:
    import torch.multiprocessing as mp

    scenario, free = _jobs(free_path)
    _, pinned = _jobs(pinned_path)
    setup = {"preset": scenario.model.preset, "seq_len": scenario.model.seq_len, "dtype": scenario.model.dtype,
             "batch": scenario.training.batch_size, "seconds": seconds}
    ctx, frames = mp.get_context("spawn"), []
    for session in tqdm(range(sessions), desc="free against pinned", unit="session", file=sys.stderr):
        mode, jobs = ("free", free) if session % 2 == 0 else ("pinned", pinned)
        barrier, queue = ctx.Barrier(len(jobs)), ctx.Queue()
        procs = [ctx.Process(target=_stepper, args=(r, jobs, setup, barrier, queue)) for r in range(len(jobs))]
        for p in procs:
            p.start()
        rows = [r for _ in procs for r in queue.get()]
        for p in procs:
            p.join()
        frame = pd.DataFrame(rows, columns=["node", "device", "t_s", "step_s"])
        frames.append(frame.assign(session=session, mode=mode))
    return pd.concat(frames, ignore_index=True)


def _tagged() -> dict[int, str]:
    """{pid: cgroup tag} of the processes in a geodt CPU-quota cgroup (train/cpulimit.py names them tag.pid)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            match = re.search(r"(geodt-[A-Za-z0-9_-]+)\.\d+", Path(f"/proc/{pid}/cgroup").read_text())
        except OSError:
            continue
        if match:
            out[int(pid)] = match.group(1)
    return out


def _runnable_cpus(pid: int) -> list[int]:
    cpus = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "R":
                cpus.append(int(fields[36]))  # field 39 of proc(5): the CPU last run on
    except OSError:
        pass
    return cpus


def colocation(cmd: list[str], devices: int) -> dict[str, tuple[int, float]]:
    """Run cmd; {tag: (samples runnable, share of them with another device runnable on the same CPU)}."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runnable, shared, tags = {}, {}, {}
    while proc.poll() is None:
        if len(tags) < devices:
            tags = _tagged()
        now = {tag: _runnable_cpus(pid) for pid, tag in tags.items()}
        for tag, cpus in now.items():
            if cpus:
                others = {c for other, cs in now.items() if other != tag for c in cs}
                runnable[tag] = runnable.get(tag, 0) + 1
                shared[tag] = shared.get(tag, 0) + bool(others.intersection(cpus))
        time.sleep(SAMPLE_S)
    if proc.returncode != 0:
        raise SystemExit(f"bench_placement: {' '.join(cmd[2:5])} failed: {proc.stderr.strip()[-300:]}")
    return {tag: (runnable[tag], shared[tag] / runnable[tag]) for tag in runnable}


def calibration_against_run(free_path: str, work: Path) -> pd.DataFrame:
    scenario, jobs = _jobs(free_path)
    cal = work / "profiles"
    cal.mkdir()
    geodt = [sys.executable, "-m", "geodt"]
    batch = str(scenario.training.batch_size)
    in_cal = colocation([*geodt, "calibrate", "scenario", "--scenario", free_path, "--batch", batch,
                         "--repeats", "60", "--out-dir", str(cal)], len(jobs))
    scenario_copy = with_profiles(Path(free_path).stem, cal, work)
    in_run = colocation([*geodt, "validate", str(scenario_copy), "--strategy", "measured-steps",
                         "--out", str(work / "run"), "--threads", "1"], len(jobs))
    rows = []
    for rank, (node, j, *_rest) in enumerate(jobs):
        cal_n, cal_share = in_cal.get(f"geodt-cal-{rank}", (0, float("nan")))
        run_n, run_share = in_run.get(f"geodt-{node}-{j}", (0, float("nan")))
        rows.append({"node": node, "device": j, "calibration_samples": cal_n, "calibration_shared": cal_share,
                     "run_samples": run_n, "run_shared": run_share})
    return pd.DataFrame(rows)


def steady(steps: pd.DataFrame) -> pd.DataFrame:
    """Per device and mode: the median over sessions of each session's steady step, and its spread."""
    s = steps[steps.t_s >= STEADY_AFTER_S].groupby(["mode", "session", "node", "device"]).step_s.median()
    g = s.groupby(["node", "device", "mode"])
    out = pd.DataFrame({"sessions": g.size(), "median_ms": 1e3 * g.median(),
                        "min_ms": 1e3 * g.min(), "max_ms": 1e3 * g.max()}).reset_index()
    pinned = out[out["mode"] == "pinned"].set_index(["node", "device"]).median_ms
    out["vs_pinned"] = out.median_ms / [pinned[(n, d)] for n, d in zip(out.node, out.device)]
    return out


def ahead(steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """How well a session's first EARLY_S seconds predict its steps after LATE_AFTER_S, in the same processes:
    per session and device late over early mean step, their median over devices (`common`: what every
    device moved by) and each device over it (`apart`); and a line counting the sessions within the round
    goal (common) and the idle goal (every device apart), the best a calibration made seconds before a run,
    in the run's own processes, could do on this machine."""
    rows = []
    for (session, mode), d in steps.groupby(["session", "mode"]):
        for (node, device), e in d.groupby(["node", "device"], sort=False):
            early, late = e[e.t_s < EARLY_S].step_s.mean(), e[e.t_s >= LATE_AFTER_S].step_s.mean()
            rows.append({"session": session, "mode": mode, "node": node, "device": device, "late_over_early": late / early})
    out = pd.DataFrame(rows)
    out["common"] = out.groupby("session").late_over_early.transform("median")
    out["apart"] = out.late_over_early / out.common
    per = out.groupby("session").agg(common=("common", "first"), apart=("apart", lambda a: (a - 1).abs().max()))
    common_ok, apart_ok = (per.common - 1).abs() <= ROUND_PCT / 100, per.apart <= IDLE_PCT / 100
    line = (f"the first {EARLY_S:g} s of a session against its steps after {LATE_AFTER_S:g} s: every device moved "
            f"alike within ±{ROUND_PCT:g}% in {int(common_ok.sum())} of {len(per)} sessions, each device apart "
            f"from that within {IDLE_PCT:g}% in {int(apart_ok.sum())}, both in {int((common_ok & apart_ok).sum())}")
    return out, line


def tables(steps: pd.DataFrame, shares: pd.DataFrame, env: str) -> dict[str, str]:
    """The files written beside steps.csv, and what is printed: table.md (env first), ahead.csv."""
    result = steady(steps)
    moved, line = ahead(steps)
    print(result.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(shares.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(line)
    return {"ahead.csv": moved.to_csv(index=False),
            "table.md": f"{env}\n\n{markdown(result)}\n\n{markdown(shares)}\n\n{line}\n"}


def main(argv: list[str] | None = None) -> int:
    fid = ROOT / "benchmarks" / "fidelity"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default=str(fid / "three-node.toml"))
    p.add_argument("--pinned", default=str(fid / "three-node-pinned.toml"))
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "predict-the-run" / "placement")
    p.add_argument("--tables-only", action="store_true",
                   help="measure nothing: recompute the tables from the steps.csv and colocation.csv in --out")
    args = p.parse_args(argv)
    if args.tables_only:
        steps, shares = pd.read_csv(args.out / "steps.csv"), pd.read_csv(args.out / "colocation.csv")
        env = (args.out / "table.md").read_text(encoding="utf-8").splitlines()[0]
        write_files(args.out, tables(steps, shares, env))
        return 0
    load_before = os.getloadavg()[0]
    steps = free_against_pinned(args.scenario, args.pinned, args.sessions, args.seconds)
    with tempfile.TemporaryDirectory(prefix="geodt-place-") as tmp:
        shares = calibration_against_run(args.scenario, Path(tmp))
    env = (f"{environment(load_before)}; {Path(args.scenario).name} free and {Path(args.pinned).name}, "
           f"{args.sessions} sessions × {args.seconds:g} s (steady: after {STEADY_AFTER_S:g} s)")
    write_files(args.out, {"steps.csv": steps.to_csv(index=False), "colocation.csv": shares.to_csv(index=False),
                           **tables(steps, shares, env)})
    print(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
