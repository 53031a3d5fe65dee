"""Benchmark of the real executor's costs (prints figures; no assertions).

1. Overhead per inner step: the executor's round loop (LR schedule, data position, timers,
   loss accumulation) against a plain training loop of the same model on the same batches,
   both calling train.step.train_step. Goal: at most 3 %. Measured interleaved
   (A, B, A, B, ...) so drift on a shared machine hits both; medians reported.
2. Sync: the all-reduce inside the executor's outer sync against a bare dist.all_reduce of
   the same number of fp32 values, two gloo processes on this machine. Goal: at least 0.8
   of its speed. The whole sync (pseudo-gradient, all-reduce, divide, outer Nesterov step,
   copy into the model) is printed too, and each encoded average (real/core/sync.py: fp16/int8
   payloads, ring/partitioned) with the bytes it sends.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_real.py [--step-preset tiny] [--sync-preset llama-60m]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from facts.presets import load_arch
from formats.scenario import DilocoConfig
from real.core.config import load_plan, load_run_spec
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_inputs(d: Path, preset: str, seq_len: int, batch: int, steps: int, rounds: int, nodes: int) -> None:
    (d / "scenario.toml").write_text(
        f'name = "bench"\nseed = 0\n[model]\npreset = "{preset}"\nseq_len = {seq_len}\ndtype = "fp32"\n'
        f"[training]\nrounds = {rounds}\n[diloco]\ninner_lr = 1e-3\nwarmup_steps = 10\n")
    rows = [f"bench,n{i},1,{batch},{steps},0.1,{batch * steps * seq_len},0.0" for i in range(nodes)]
    (d / "plan.csv").write_text("strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s\n"
                                + "\n".join(rows) + "\n")


def bench_inner_step(preset: str, seq_len: int, batch: int, steps: int, repeats: int, threads: int) -> None:
    import torch
    import torch.distributed as dist

    from real.process.worker import ExecOptions, Node
    from train.step import train_step

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write_inputs(d, preset, seq_len, batch, steps, repeats + 1, 1)
        spec = load_run_spec(d / "scenario.toml")
        plan = load_plan(d / "plan.csv").resolved(spec.training.rounds)
        node = Node(0, 1, 0, spec, plan, ExecOptions(out_dir=str(d / "out"), checkpoint=False), "gloo")
        node.warm_up()
        model, opt, shard = node.model, node.optimizer, node.shard

        def plain() -> float:
            start = time.perf_counter()
            position = node.data_position
            for _ in range(steps):
                train_step(model, opt, shard.batch(position, batch), "fp32")
                position += batch
            return (time.perf_counter() - start) / steps

        plain()  # warm
        t0 = time.perf_counter()
        plain_s, exec_s, round_s = [], [], []
        for r in range(repeats):
            plain_s.append(plain())
            row = node.run_round(r, t0)
            exec_s.append(row["compute_s"] / steps)
            round_s.append((row["round_end_s"] - row["round_start_s"]) / steps)
    dist.destroy_process_group()
    p, e, w = statistics.median(plain_s), statistics.median(exec_s), statistics.median(round_s)
    overhead = 100 * (e - p) / p
    print(f"inner step ({preset}, seq {seq_len}, batch {batch}, {steps} steps x {repeats} repeats, "
          f"{threads} thread(s)):")
    print(f"  plain loop     {p * 1e3:8.3f} ms/step  (spread {min(plain_s) * 1e3:.3f}..{max(plain_s) * 1e3:.3f})")
    print(f"  executor       {e * 1e3:8.3f} ms/step  (spread {min(exec_s) * 1e3:.3f}..{max(exec_s) * 1e3:.3f})")
    print(f"  overhead       {overhead:+8.2f} %   goal <= 3 %: {'met' if overhead <= 3 else 'NOT met'}")
    print(f"  (whole round incl. barrier + outer sync, 1 node: {w * 1e3:.3f} ms/step)")


def _sync_worker(rank: int, port: int, preset: str, repeats: int, threads: int) -> None:
    import torch
    import torch.distributed as dist

    from real.core.diloco import OuterState, outer_sync

    torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=120))
    model = build_model(load_arch(preset), 128, seed=0)
    state = OuterState(list(model.parameters()))
    spec = DilocoConfig()
    bare_buf = torch.randn(state.global_flat.numel())
    inside: list[float] = []

    def timed_all_reduce(t):
        start = time.perf_counter()
        dist.all_reduce(t)
        inside.append(time.perf_counter() - start)

    bare, whole = [], []
    for _i in range(repeats + 1):  # the first of each is a warm-up
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(bare_buf)
        bare.append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        outer_sync(state, spec, 1.0, 2.0, timed_all_reduce)
        whole.append(time.perf_counter() - start)
    if rank == 0:
        n = state.global_flat.numel()
        b, a, w = statistics.median(bare[1:]), statistics.median(inside[1:]), statistics.median(whole[1:])
        print(f"sync ({preset}: {n / 1e6:.1f} M fp32 values = {4 * n / 1e6:.0f} MB, 2 gloo processes, "
              f"{repeats} repeats):")
        print(f"  bare dist.all_reduce          {b * 1e3:9.2f} ms  ({4 * n / b / 1e9:.2f} GB/s)")
        print(f"  executor's all-reduce         {a * 1e3:9.2f} ms  ({4 * n / a / 1e9:.2f} GB/s)")
        print(f"  speed ratio (bare / executor) {b / a:9.3f}     goal >= 0.8: {'met' if b / a >= 0.8 else 'NOT met'}")
        print(f"  whole outer sync              {w * 1e3:9.2f} ms  (all-reduce + pseudo-gradient, "
              f"outer step, copy: ratio to bare {b / w:.3f})")
    from real.core.sync import CrossNodeSync

    for dtype in ("fp32", "fp16", "int8"):
        for collective, links in (("ring", [1.0, 1.0]), ("partitioned", [1.0, 3.0])):
            sync = CrossNodeSync(dist.group.WORLD, 2, rank, bare_buf.numel(), dtype, collective, links)
            times, sent = [], 0
            for _ in range(repeats + 1):
                buf = bare_buf.clone()
                dist.barrier()
                start = time.perf_counter()
                _, sent = sync.average(buf, 2.0)
                times.append(time.perf_counter() - start)
            if rank == 0:
                print(f"  {collective:<11} {dtype}: {statistics.median(times[1:]) * 1e3:9.2f} ms, "
                      f"{sent / 1e6:.1f} MB sent by rank 0")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-preset", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sync-preset", default="llama-60m")
    parser.add_argument("--sync-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    bench_inner_step(args.step_preset, args.seq_len, args.batch, args.steps, args.repeats, args.threads)
    import torch.multiprocessing as mp

    mp.start_processes(_sync_worker, args=(_free_port(), args.sync_preset, args.sync_repeats, args.threads),
                       nprocs=2, join=True, start_method="spawn")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
