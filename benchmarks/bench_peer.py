"""geodt beside torchft 0.2.0 on the same work: does a peer pay more?

Two CPU replicas (one process each, gloo), the same model preset, initial weights (seed), data
shards, inner steps H, rounds, inner AdamW and learning-rate schedule (train/step.py,
real/core/diloco.py) and outer Nesterov SGD. geodt runs as `python -m real` with its default
settings (checkpoints included: the Young/Daly cadence); torchft as this file's `--torchft`
command: a lighthouse and two replicas, each a Manager (quorum every sync, gloo) around
torchft.local_sgd.DiLoCo with the whole model as its one fragment. Each command runs in a
subprocess and is measured from outside:

    whole command wall   from start to exit (start-up, training, teardown)
    training wall        geodt: the trace's last round end (from the barrier before round 0);
                         torchft: each replica's loop, from the same warm-up on, the longest
    CPU-seconds          user + sys of every process of the command's tree (psutil, sampled)
    peak memory          the largest sum of RSS over the process tree (psutil, sampled 20 times a second)

and the ratios geodt/torchft are printed with their goals (whole command, training wall and CPU
<= 1.0, peak memory <= 1.1), the machine (cores, load average before and after, versions)
beside them. Writes DIR/peer.csv (whole or not at all) and DIR/README.md. Whether both end with
the same weights is printed: their largest difference.

    python benchmarks/bench_peer.py [--out results/peer] [--preset llama-60m] [--rounds 4] [--steps 10]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import psutil

from facts.presets import load_arch
from real.core.config import load_run_spec
from real.core.data import make_shard
from train.models import build_model

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"whole_wall": 1.0, "training_wall": 1.0, "cpu_s": 1.0, "peak_rss": 1.1}


def scenario_text(preset: str, seq_len: int, rounds: int) -> str:
    return f"""name = "peer"
seed = 7
[model]
preset = "{preset}"
seq_len = {seq_len}
dtype = "fp32"
[training]
rounds = {rounds}
[diloco]
inner_lr = 2e-3
weight_decay = 0.1
warmup_steps = 2
outer_lr = 0.7
outer_momentum = 0.9
"""


def plan_text(batch: int, steps: int, seq_len: int) -> str:
    rows = [f"peer,{name},1,{batch},{steps},0.01,{batch * steps * seq_len},0.0" for name in ("a", "b")]
    return "\n".join(["strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s", *rows]) + "\n"


def measured(cmd: list[str], env: dict) -> dict:
    """Run `cmd` to its end; its wall seconds, CPU-seconds of its process tree and peak summed RSS.

    CPU is each process's own user + system time as last sampled (20 times a second), summed over every
    process the tree held: RUSAGE_CHILDREN counts only descendants their parents reaped, and a forkserver
    (geodt's workers' parent, real/process/launch.py) outlives a `python -m real` that leaves by os._exit,
    so its workers' time was never counted (geodt 1.7 CPU-s for a 77 s run). What a process uses after
    its last sample (at most 50 ms) is not counted, on either side."""
    log = tempfile.TemporaryFile("w+")  # not a pipe: a chatty child must never block on a full one
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    peak, root, cpu_by_process = 0, psutil.Process(proc.pid), {}
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        rss = 0
        for process in tree:
            try:
                with process.oneshot():
                    times, rss = process.cpu_times(), rss + process.memory_info().rss
                cpu_by_process[(process.pid, process.create_time())] = times.user + times.system
            except psutil.Error:
                continue
        peak = max(peak, rss)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    log.seek(0)
    output = log.read()
    if proc.returncode:
        raise SystemExit(f"bench_peer: {' '.join(cmd[:4])}... exited {proc.returncode}:\n{output[-3000:]}")
    cpu = sum(cpu_by_process.values())
    return {"whole_wall": wall, "cpu_s": cpu, "peak_rss": peak, "output": output}


# --- torchft's side: a lighthouse and two replicas -------------------------------------------------

def torchft_replica(args) -> None:
    """One torchft replica: Manager + DiLoCo around geodt's model, data and inner step."""
    import torch
    from torch.distributed import TCPStore
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    from real.core.diloco import inner_lr
    from train.step import make_optimizer, train_step

    torch.set_num_threads(args.threads)
    spec = load_run_spec(args.scenario)
    d, arch, i = spec.diloco, load_arch(spec.model.preset), args.replica
    model = build_model(arch, spec.model.seq_len, seed=spec.seed)
    model.train()
    inner = make_optimizer(model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)
    outer = torch.optim.SGD(model.parameters(), lr=d.outer_lr, momentum=d.outer_momentum, nesterov=True)
    shard = make_shard(None, seed=spec.seed, vocab_size=arch.vocab_size, seq_len=spec.model.seq_len, shard=i, shards=2)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=120)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=2, use_async_quorum=False,
                      load_state_dict=lambda s: (model.load_state_dict(s["model"]), inner.load_state_dict(s["inner"])),
                      state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
                      replica_id=f"peer{i}", store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout)
    batch = torch.zeros((args.batch, spec.model.seq_len), dtype=torch.long)
    model(input_ids=batch, labels=batch).loss.backward()  # the warm-up geodt makes before round 0
    model.zero_grad(set_to_none=True)
    total = spec.training.rounds * args.steps
    start = time.perf_counter()
    with DiLoCo(manager, [model], inner, outer, sync_every=args.steps):
        for step in range(total):
            for group in inner.param_groups:
                group["lr"] = inner_lr(step, d, total)
            train_step(model, inner, shard.batch(step * args.batch, args.batch), "fp32")
    training_s = time.perf_counter() - start
    out = Path(args.out)
    (out / f"replica{i}.json").write_text(json.dumps({"training_wall": training_s, "steps": manager.current_step()}))
    if i == 0:
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out / "final_weights.pt")
    manager.shutdown(wait=False)


def torchft_run(args) -> None:
    """The torchft command: a lighthouse in this process, the two replicas as child processes."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    common = [sys.executable, __file__, "--scenario", args.scenario, "--out", args.out, "--batch", str(args.batch),
              "--steps", str(args.steps), "--threads", str(args.threads), "--lighthouse", lighthouse.address()]
    procs = [subprocess.Popen([*common, "--replica", str(i)]) for i in (0, 1)]
    codes = [p.wait() for p in procs]
    lighthouse.shutdown()
    if any(codes):
        raise SystemExit(f"torchft replicas exited {codes}")


# --- the comparison --------------------------------------------------------------------------------

def machine() -> dict:
    import torch
    import torchft  # noqa: F401

    return {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "torch_version": torch.__version__, "torchft_version": version("torchft"), "platform": platform.platform()}


def compare(args) -> int:
    import torch

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    threads = args.threads or max(1, (os.cpu_count() or 2) // 2)  # geodt's own default: cores / processes
    with tempfile.TemporaryDirectory(prefix="geodt-peer-") as tmp:
        tmp = Path(tmp)
        (tmp / "scenario.toml").write_text(scenario_text(args.preset, args.seq_len, args.rounds))
        (tmp / "plan.csv").write_text(plan_text(args.batch, args.steps, args.seq_len))
        (tmp / "torchft").mkdir()
        host = machine()
        ft = measured([sys.executable, __file__, "--torchft", "--scenario", str(tmp / "scenario.toml"),
                       "--out", str(tmp / "torchft"), "--batch", str(args.batch), "--steps", str(args.steps),
                       "--threads", str(threads)], env)
        ft["training_wall"] = max(json.loads((tmp / "torchft" / f"replica{i}.json").read_text())["training_wall"]
                                  for i in (0, 1))
        ours = measured([sys.executable, "-m", "real", "--plan", str(tmp / "plan.csv"), "--scenario",
                         str(tmp / "scenario.toml"), "--out", str(tmp / "geodt"), "--no-progress",
                         "--threads", str(threads)], env)
        ours["training_wall"] = float(pd.read_csv(tmp / "geodt" / "trace.csv")["round_end_s"].max())
        a = torch.load(tmp / "geodt" / "final_weights.pt", weights_only=True)
        b = torch.load(tmp / "torchft" / "final_weights.pt", weights_only=True)
        same = max(float((a[k] - b[k]).abs().max()) for k in a) if a.keys() == b.keys() else float("nan")
        cadence = [line for line in ours["output"].splitlines() if "a checkpoint every" in line]
    host["load_1m_after"] = round(os.getloadavg()[0], 2)
    rows = [{"measure": key, "geodt": ours[key], "torchft": ft[key], "ratio": ours[key] / ft[key], "goal": goal,
             "meets": ours[key] / ft[key] <= goal} for key, goal in GOALS.items()]
    table = pd.DataFrame(rows)
    for key, value in host.items():
        table[key] = value
    table["preset"], table["rounds"], table["H"], table["batch"], table["threads"] = (
        args.preset, args.rounds, args.steps, args.batch, threads)
    table["weights_max_abs_diff"] = same
    print(table[["measure", "geodt", "torchft", "ratio", "goal", "meets"]].to_string(index=False))
    print(f"machine: {json.dumps(host)}; final weights' largest difference: {same:.3g}")
    if cadence:
        print(cadence[0])
    write(Path(args.out), table, host, same, cadence, args, threads)
    return 0


def write(out: Path, table, host: dict, same: bool, cadence: list[str], args, threads: int) -> None:
    """DIR/peer.csv and DIR/README.md, each written whole (temp name, rename)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".peer.csv.tmp{os.getpid()}"
    table.to_csv(tmp, index=False)
    os.replace(tmp, out / "peer.csv")
    lines = ["# geodt beside torchft 0.2.0 (benchmarks/bench_peer.py)", "",
             (f"Two CPU replicas, preset {args.preset}, seq_len {args.seq_len}, batch {args.batch}, H = {args.steps}, "
             f"{args.rounds} rounds, {threads} torch thread(s) a process; geodt with its default settings."), "",
             "| measure | geodt | torchft | geodt/torchft | goal |", "|---|---|---|---|---|"]
    for row in table.itertuples():
        unit = (lambda v: f"{v / 2**30:.2f} GiB") if row.measure == "peak_rss" else (lambda v: f"{v:.2f} s")
        lines.append(f"| {row.measure} | {unit(row.geodt)} | {unit(row.torchft)} | {row.ratio:.2f} | "
                     f"<= {row.goal} {'(met)' if row.meets else '(missed)'} |")
    lines += ["", f"Final weights' largest difference (geodt - torchft): {same:.3g}. " + (cadence[0] if cadence else ""), "",
              f"Machine: {json.dumps(host)}", "",
              ("One run of each, torchft first, on a machine shared with other work (the load average is "
              "above): the ratios carry that noise. torchft's teardown (Manager shutdown, lighthouse) is in its "
              "whole-command wall; each side's training wall excludes start-up."), ""]
    tmp = out / f".README.md.tmp{os.getpid()}"
    tmp.write_text("\n".join(lines))
    os.replace(tmp, out / "README.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "peer"))
    parser.add_argument("--preset", default="llama-60m")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="inner steps H a round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads a process (0: cores / 2)")
    # the torchft command and its replicas (this file runs itself)
    parser.add_argument("--torchft", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replica", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replica is not None:
        torchft_replica(args)
        return 0
    if args.torchft:
        torchft_run(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
