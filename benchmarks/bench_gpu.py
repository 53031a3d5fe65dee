"""Everything a lent GPU should check, in one prepared command (346 s of stages on one H200, 2026-11-27).

    PYTHONPATH=. python benchmarks/bench_gpu.py --out $OUT/gpu      # on the GPU machine
    PYTHONPATH=. python benchmarks/bench_gpu.py --analyse benchmarks/estimate/h200   # anywhere: the
                                                 # estimate and memory model against existing profiles

Stages, each a subprocess with its own time limit, each a row of the table printed last:
1. the CUDA tests (`pytest -m cuda`, and the compiled step equals the eager one);
2. `geodt calibrate device` of llama-150m and llama-1b, seq 1024, bf16: the eager step with
   `--batch auto` (to the largest batch that fits), the compiled step at the batches of
   ../shared/gpu's lean table (150m at 32, 1b at 16: each batch compiles afresh, 35-75 s);
   the profiles stay in OUT (with their warm-up and the host's outer step);
3. the estimate (simulator/models/estimate.py: eager and lean steps) and the memory model
   (simulator/models/memory.py: the planner's largest batch) against those profiles, and MFU;
4. a single-node `geodt validate` of llama-150m timed by its own eager profile (wall clock
   predicted and measured);
5. a short nccl run (two nodes, one process per GPU) when the machine has two GPUs, else
   skipped and said so.
Nothing here is timed as a test; the table holds what the stages printed and measured.
`--budget-s` (default 480) bounds the stages together, so that the analysis and the table still
come within one device call (10 minutes, install and copying back included): a stage gets at
most what is left, and one that would start with less than MIN_STAGE_S left is skipped, said so.
OUT keeps the validate run's checkpoints (GBs): bring back its CSVs, not the folder
(benchmarks/estimate/h200-2026-11-27/README.md has the command that ran).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from facts.presets import load_arch
from simulator.models.estimate import Shape, estimate_step
from simulator.models.memory import reserve_bytes, step_memory_bytes
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {"llama-150m": 32, "llama-1b": 16}  # compiled batch: ../shared/gpu/README.md's lean table
MIN_STAGE_S = 20  # a stage started with less would be cut off before its first measurement
PEAK_TFLOPS = 989.4  # H100/H200 SXM dense bf16, the MFU denominator of ../shared/gpu/README.md


def stages(out: Path, python: str = sys.executable) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit in seconds) of every GPU stage, in order."""
    calibrate = [python, "-m", "geodt", "calibrate", "device", "--device", "cuda:0", "--seq-len", "1024",
                 "--dtype", "bf16", "--repeats", "5", "--warmup", "2"]
    runs = [("cuda tests", [python, "-m", "pytest", "-q", "-m", "cuda", "tests/test_calibrate_cli.py",
                            "tests/test_real_nodes.py", "tests/test_step_compile.py"], 120)]
    for model, batch in MODELS.items():
        runs.append((f"calibrate {model} eager", calibrate + ["--model", model, "--batch", "auto", "--compile", "off",
                                                              "--out", str(out / f"{model}-eager.csv")], 120))
        runs.append((f"calibrate {model} compiled", calibrate + ["--model", model, "--batch", str(batch),
                                                                 "--compile", "on",
                                                                 "--out", str(out / f"{model}-compiled.csv")], 150))
    scenario = out / "gpu1.toml"
    runs.append(("validate gpu1", [python, "-m", "geodt", "validate", str(scenario), "--strategy", "baseline",
                                   "--no-emulate", "--out", str(out / "validate-gpu1")], 90))
    runs.append(("nccl run", [python, "-m", "geodt", "run", str(out / "nccl2.toml"), "--strategy", "baseline",
                              "--out", str(out / "run-nccl")], 90))
    return runs


def write_scenarios(out: Path, gpu_key: str = "h200") -> None:
    """gpu1.toml (one node of this GPU timed by the eager profile just measured) and nccl2.toml (two nodes)."""
    common = ('[model]\npreset = "llama-150m"\nseq_len = 1024\ndtype = "bf16"\n'
              '[training]\nrounds = 4\nlocal_steps = 20\nbatch_size = 32\ncompile = "off"\n'
              '[network]\nbandwidth_gbps = 1.0\nlatency_ms = 1.0\n')
    (out / "gpu1.toml").write_text('name = "gpu1"\nseed = 0\n' + common
                                   + f'[[nodes]]\nname = "gpu"\ngpus = {{ "{gpu_key}" = 1 }}\nprofile = "llama-150m-eager.csv"\n')
    (out / "nccl2.toml").write_text('name = "nccl2"\nseed = 0\n' + common.replace("rounds = 4", "rounds = 2")
                                    + "".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ "{gpu_key}" = 1 }}\n' for i in range(2)))


def analyse(directory: Path) -> list[dict]:
    """Per profile in `directory`: the estimate's error per timed batch >= 8, the planner's largest
    batch against the measured largest, and the best MFU (torch-free: runs on any machine)."""
    rows = []
    for path in sorted(directory.glob("*.csv")):
        frame = pd.read_csv(path)
        if "step_s_median" not in frame.columns or frame.empty:
            continue
        compiled = bool(frame["compiled"].iloc[0]) if "compiled" in frame.columns else False
        model, dtype, gpu = frame["model"].iloc[0], frame["dtype"].iloc[0], frame["gpu_key"].iloc[0] or "h200"
        arch, seq = load_arch(model), int(frame["seq_len"].iloc[0])
        est = estimate_step(gpu, dtype, seq, shape=Shape.of(arch), step="lean" if compiled else "eager")
        timed = frame[~frame["oom"].astype(str).str.lower().eq("true")]
        mean = timed["step_s_mean"].fillna(timed["step_s_median"])
        errors = [est.step_s(b) / t - 1 for b, t in zip(timed["batch_size"], mean) if b >= 8]
        flops = 6 * (arch.params - arch.vocab_size * arch.hidden_size) + 6 * arch.num_layers * seq * arch.hidden_size
        mfu = max(b * seq / t * flops / (PEAK_TFLOPS * 1e12) for b, t in zip(timed["batch_size"], mean))
        scenario = load_scenario("paper", [f"model.preset={model}", f"model.dtype={dtype}", f"model.seq_len={seq}"])
        memory = float(frame["mem_total_bytes"].iloc[0])
        planned = 0
        while step_memory_bytes(scenario, planned + 1) <= memory - reserve_bytes(memory):
            planned += 1
        warm = frame["warmup_s"].dropna() if "warmup_s" in frame.columns else []
        rows.append({"stage": f"analyse {path.name}", "ok": max(map(abs, errors), default=0) <= 0.10,
                     "figures": f"estimate {min(errors, default=0):+.1%}..{max(errors, default=0):+.1%} at b>=8; "
                                f"largest batch planned {planned}, measured {int(timed['batch_size'].max())}"
                                f"{' (no OOM seen)' if not frame['oom'].astype(str).str.lower().eq('true').any() else ''}; "
                                f"MFU {mfu:.1%}" + (f"; warm-up up to {max(warm):.1f} s" if len(warm) else "")})
    return rows


def run_stage(name: str, command: list[str], limit_s: int, log: Path) -> dict:
    """Run one stage with its time limit; its output into LOG; a table row."""
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with log.open("a") as handle:
        handle.write(f"\n=== {name}: {' '.join(command)}\n")
        handle.flush()
        try:
            code = subprocess.run(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    tail = log.read_text().splitlines()[-1:] or [""]
    return {"stage": name, "ok": code == 0, "figures": f"exit {code} in {time.perf_counter() - start:.0f} s; {tail[0][:110]}"}


def run_all(runs: list[tuple[str, list[str], int]], budget_s: float, gpus: int, log: Path) -> list[dict]:
    """Every stage in order within budget_s together (module docstring); a table row each."""
    rows, end = [], time.monotonic() + budget_s
    for name, command, limit in runs:
        left = int(end - time.monotonic())
        if name == "nccl run" and gpus < 2:
            rows.append({"stage": name, "ok": True, "figures": "skipped: one GPU (nccl needs a GPU per process)"})
        elif left < MIN_STAGE_S:
            rows.append({"stage": name, "ok": False, "figures": f"skipped: {left} s of --budget-s left"})
        else:
            rows.append(run_stage(name, command, min(limit, left), log))
            print(f"{name}: {'ok' if rows[-1]['ok'] else 'FAILED'} ({rows[-1]['figures']})", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    width = max(len(r["stage"]) for r in rows)
    print(f"\n{'stage':{width}s}  ok    figures")
    for r in rows:
        print(f"{r['stage']:{width}s}  {'yes' if r['ok'] else 'NO ':3s}   {r['figures']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="directory for the profiles, runs and log (on the GPU machine: under $OUT)")
    p.add_argument("--analyse", type=Path, metavar="DIR", help="only the estimate and memory model against DIR's profiles")
    p.add_argument("--dry-run", action="store_true", help="print the stages' commands, run nothing")
    p.add_argument("--budget-s", type=int, default=480, help="seconds for all stages together [480]")
    args = p.parse_args(argv)
    if args.analyse:
        print_table(analyse(args.analyse))
        return 0
    if args.out is None:
        p.error("--out is required (or --analyse DIR)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        for name, command, limit in stages(args.out):
            print(f"{name} ({limit} s): {' '.join(command)}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; expected a GPU machine (or --analyse DIR / --dry-run)", file=sys.stderr)
        return 2
    from calibrate.harness import gpu_key_for

    write_scenarios(args.out, gpu_key_for(torch.cuda.get_device_name(0)) or "h100-sxm")
    rows = run_all(stages(args.out), args.budget_s, torch.cuda.device_count(), args.out / "bench_gpu.log")
    rows += analyse(args.out)
    print_table(rows)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
