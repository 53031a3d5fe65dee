"""Why a device steps slower in a run than in its calibration: its step timed under each of the run's conditions.

Every CPU device of a scenario runs in its own process under its node's limits (as `geodt
calibrate scenario` and real/ place them), all at once, and times blocks of inner steps under
one condition after another, the conditions interleaved (A B C D E A B C D E ...) so that the
machine's drift over minutes falls on every condition alike:

- calibration: one random batch reused, steps back to back (calibrate/harness.py's loop)
- data: each step's batch read from the run's data shard, the learning rate set and the loss
  summed, as real/rounds/rounds.py's InnerSteps does
- rounds: + every H steps the round's end: the weights copied out and an outer Nesterov step
  over every parameter (real/core/diloco.py's arithmetic), and a pause as long as the sync
- gloo: + the pseudo-gradient all-reduced over gloo among the scenario's processes at every
  round's end (the pause stays: the all-reduce on loopback is short)
- checkpoint: + the model and optimizer state written with torch.save in a background thread
  after every round, as the executor's checkpoint writer does

    python benchmarks/bench_interference.py [--scenario benchmarks/fidelity/two-node.toml]
        [--blocks 6] [--local-steps 16] [--sync-s 0.3] [--out results/interference]

Prints, per device and condition, the median step and its ratio to the calibration's, and the
first step of a round against the rest; writes steps.csv (every timed step) and table.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from facts.presets import load_arch
from real.core.data import make_shard
from simulator.scenario import load_scenario
from train.cpulimit import apply_cpu_limits, device_cores
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ["calibration", "data", "rounds", "gloo", "checkpoint"]


def _outer_step(model, anchor, momentum, lr: float = 0.7, beta: float = 0.9) -> None:
    """The round's end as real/core/diloco.py does it: pseudo-gradient, Nesterov outer step, reset."""
    import torch

    with torch.no_grad():
        for p, a, m in zip(model.parameters(), anchor, momentum):
            delta = a - p
            m.mul_(beta).add_(delta)
            a.sub_(lr * (delta + beta * m))
            p.copy_(a)


def _device(rank: int, world: int, jobs: list, setup: dict, store: str, queue) -> None:
    import torch
    import torch.distributed as dist

    from train.step import make_optimizer, random_batch, train_step

    node, j, gpus, cores, quota = jobs[rank]
    cleanup = apply_cpu_limits(device_cores(cores, gpus, j), quota, f"geodt-intf-{rank}")
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        arch = load_arch(setup["preset"])
        model = build_model(arch, setup["seq_len"], 0)
        model.train()
        optimizer = make_optimizer(model)
        anchor = [p.detach().clone() for p in model.parameters()]
        momentum = [torch.zeros_like(p) for p in model.parameters()]
        shard = make_shard(None, seed=0, vocab_size=arch.vocab_size, seq_len=setup["seq_len"], shard=rank,
                           shards=world)
        fixed = random_batch(arch.vocab_size, setup["batch"], setup["seq_len"], "cpu")
        ckpt = Path(setup["ckpt_dir"]) / f"rank{rank}.pt"
        position, writer, rows = 0, None, []
        for _ in range(3):  # warm-up, untimed
            train_step(model, optimizer, fixed, setup["dtype"])
        for block in range(setup["blocks"]):
            for condition in CONDITIONS:
                dist.barrier()
                loss_sum = torch.zeros(())
                for step in range(setup["local_steps"]):
                    t0 = time.perf_counter()
                    if condition == "calibration":
                        train_step(model, optimizer, fixed, setup["dtype"])
                    else:
                        for group in optimizer.param_groups:
                            group["lr"] = 1e-3
                        batch = shard.batch(position, setup["batch"])
                        position += setup["batch"]
                        loss_sum += train_step(model, optimizer, batch, setup["dtype"])
                    rows.append((rank, node, j, block, condition, step, time.perf_counter() - t0))
                if condition in ("rounds", "gloo", "checkpoint"):
                    _outer_step(model, anchor, momentum)
                    if condition != "rounds":
                        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                        dist.all_reduce(flat)
                    time.sleep(setup["sync_s"])
                if condition == "checkpoint":
                    if writer is not None:
                        writer.join()
                    state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                             "optimizer": optimizer.state_dict()}
                    writer = threading.Thread(target=torch.save, args=(state, ckpt))
                    writer.start()
        if writer is not None:
            writer.join()
        dist.barrier()
        queue.put(rows)
        dist.destroy_process_group()
    finally:
        cleanup()


def measure(scenario_path: str, blocks: int, local_steps: int, sync_s: float) -> pd.DataFrame:
    import torch.multiprocessing as mp

    scenario = load_scenario(scenario_path, without_profiles=True)
    jobs = [(n.name, j, n.gpu_count, n.cpu_cores, n.cpu_quota) for n in scenario.nodes for j in range(n.gpu_count)]
    with tempfile.TemporaryDirectory(prefix="geodt-intf-") as tmp:
        setup = {"preset": scenario.model.preset, "seq_len": scenario.model.seq_len, "dtype": scenario.model.dtype,
                 "batch": scenario.training.batch_size, "blocks": blocks, "local_steps": local_steps,
                 "sync_s": sync_s, "ckpt_dir": tmp}
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_device, args=(r, len(jobs), jobs, setup, f"{tmp}/store", queue))
                 for r in range(len(jobs))]
        for p in procs:
            p.start()
        rows = [r for _ in procs for r in queue.get()]
        for p in procs:
            p.join()
    return pd.DataFrame(rows, columns=["rank", "node", "device", "block", "condition", "step", "step_s"])


def table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per device and condition: median step, its ratio to the calibration's, first step vs the rest."""
    out = []
    for (node, device), d in steps.groupby(["node", "device"], sort=False):
        base = d[d.condition == "calibration"].step_s.median()
        for condition in CONDITIONS:
            c = d[d.condition == condition]
            out.append({"node": node, "device": device, "condition": condition,
                        "median_ms": 1e3 * c.step_s.median(), "vs_calibration": c.step_s.median() / base,
                        "first_step_ms": 1e3 * c[c.step == 0].step_s.median(),
                        "other_steps_ms": 1e3 * c[c.step > 0].step_s.median()})
    return pd.DataFrame(out)


def markdown(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns)
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    return "\n".join([head] + ["| " + " | ".join(c) + " |" for c in cells])


def environment(load_before: float) -> str:
    """The machine, the time and the load around a measurement, for its table's first line."""
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{datetime.now(timezone.utc).isoformat(timespec='minutes')}, load {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after")


def write_files(out: Path, files: dict[str, str]) -> None:
    """Each file whole or not at all (a temporary name, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        tmp = out / f".{name}.tmp{os.getpid()}"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default=str(ROOT / "benchmarks" / "fidelity" / "two-node.toml"))
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--local-steps", type=int, default=16)
    p.add_argument("--sync-s", type=float, default=0.3)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "interference")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    steps = measure(args.scenario, args.blocks, args.local_steps, args.sync_s)
    result = table(steps)
    print(result.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    env = (f"{environment(load_before)}; {Path(args.scenario).name}, {args.blocks} blocks × "
           f"{len(CONDITIONS)} conditions × {args.local_steps} steps, sync pause {args.sync_s} s")
    write_files(args.out, {"steps.csv": steps.to_csv(index=False), "table.md": f"{env}\n\n{markdown(result)}\n"})
    print(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
