"""geodt's plan on torchft: the exported plan's run against equal sync_every, predicted against measured.

For each strategy (default: measured-steps, the exported plan, and baseline, every replica with the
same sync_every, what torchft users do today): `geodt plan SCENARIO --strategy S --export torchft DIR
--emulate --time-scale X` on a free loopback port, DIR/run_all.sh (torchft's lighthouse and one
process per replica group, torchft's own DiLoCo on gloo, CPU), then `geodt validate --trace DIR`.
Prints per replica the predicted and measured idle and round (measured ÷ X: the scenario's
seconds) and the idle error in % of the round, then each run's idle summed over replicas and their
ratio. Emulated (sleep-padded) steps and syncs: a schedule check of torchft against the prediction,
which keeps the figures meaningful on a loaded machine as long as no step overruns (the table counts
overruns). Goals: idle within 6% of the round per replica, round within 5%, the exported plan's
idle at most a third of equal sync_every's.

    PYTHONPATH=. python benchmarks/bench_torchft_export.py [--scenario hetero-cpu] [--time-scale 5]
        [--rounds 6] [--out results/torchft]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
GEODT = [sys.executable, "-m", "geodt"]
IDLE_GOAL_PCT, ROUND_GOAL_PCT, IDLE_RATIO_GOAL = 6.0, 5.0, 1 / 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export(scenario: str, strategy: str, out: Path, time_scale: float, rounds: int | None) -> None:
    """geodt plan ... --export torchft out --emulate (raises with its stderr on failure)."""
    cmd = [*GEODT, "plan", scenario, "--strategy", strategy, "--export", "torchft", str(out), "--emulate",
           "--time-scale", str(time_scale), "--lighthouse", f"127.0.0.1:{free_port()}"]
    if rounds is not None:
        cmd += ["--set", f"training.rounds={rounds}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def run_export(out: Path, timeout_s: float) -> float:
    """out/run_all.sh in its own process group; the whole group is stopped on a timeout (the lighthouse
    and every replica). Returns the wall seconds; raises on failure or timeout."""
    start = time.perf_counter()
    log = (out / "run.log").open("w")
    proc = subprocess.Popen([str(out / "run_all.sh")], stdout=log, stderr=subprocess.STDOUT, env=_env(),
                            start_new_session=True)
    try:
        status = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"{out / 'run_all.sh'}: still running after {timeout_s:g} s (log: {out / 'run.log'})") \
            from None
    finally:
        log.close()
        try:  # whatever the script left behind in its group (nothing, when it ended cleanly)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if status != 0:
        raise RuntimeError(f"{out / 'run_all.sh'}: exit status {status} (log: {out / 'run.log'})")
    return time.perf_counter() - start


def validate(out: Path):
    """geodt validate --trace out; its validation.csv as a DataFrame."""
    done = subprocess.run([*GEODT, "validate", "--trace", str(out)], capture_output=True, text=True, env=_env())
    if done.returncode != 0:
        raise RuntimeError(f"geodt validate --trace {out}: {done.stderr.strip()}")
    table = pd.read_csv(out / "validation" / "validation.csv")
    trace = pd.concat([pd.read_csv(p) for p in sorted((out / "traces").glob("*.csv"))])
    overruns = trace.groupby("node")["overrun_steps"].sum()  # steps slower than their padding
    return table.assign(overrun_steps=table["node"].map(overruns).astype(int))


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHON"] = sys.executable
    return env


def table(results: dict) -> str:
    """The printed table: per strategy and replica, predicted against measured."""
    lines = [(f"{'strategy':<15} {'replica':<8} {'idle_pred_s':>11} {'idle_meas_s':>11} {'idle_err_%round':>15} "
              f"{'round_pred_s':>12} {'round_meas_s':>12} {'round_err_%':>11} {'overruns':>8}")]
    for strategy, v in results.items():
        for r in v.itertuples():
            lines.append(f"{strategy:<15} {r.node:<8} {r.predicted_idle_s:>11.3f} {r.measured_idle_s:>11.3f} "
                         f"{r.error_pct_of_round:>15.2f} {r.predicted_round_s:>12.3f} {r.measured_round_s:>12.3f} "
                         f"{r.round_error_pct:>11.2f} {int(r.overrun_steps):>8}")
    return "\n".join(lines)


def verdicts(results: dict, exported: str, equal: str) -> list[str]:
    out = []
    for strategy, v in results.items():
        worst_idle, worst_round = v["error_pct_of_round"].abs().max(), v["round_error_pct"].abs().max()
        out.append(f"{strategy}: idle predicted {v['predicted_idle_s'].sum():.3f} s, measured "
                   f"{v['measured_idle_s'].sum():.3f} s over replicas; worst |idle error| {worst_idle:.2f}% of round "
                   f"(goal ≤ {IDLE_GOAL_PCT:g}), worst |round error| {worst_round:.2f}% (goal ≤ {ROUND_GOAL_PCT:g})")
    if exported in results and equal in results:
        ratio = results[exported]["measured_idle_s"].sum() / results[equal]["measured_idle_s"].sum()
        out.append(f"measured idle, {exported} ÷ {equal} (equal sync_every): {ratio:.3f} "
                   f"(goal ≤ {IDLE_RATIO_GOAL:.3f}: {'met' if ratio <= IDLE_RATIO_GOAL else 'not met'})")
    return out


class _NoManager:
    """What the recorder wraps on torchft's Manager (never called: no sync in this loop)."""

    def start_quorum(self, *args, **kwargs):
        return None

    def should_commit(self, *args, **kwargs):
        return True


def recorder_overhead(steps: int = 20000, repeats: int = 5) -> tuple[float, float]:
    """(the recorder's seconds per inner step, the tiny model's step in seconds). The recorder's cost is
    measured on an optimizer step of a 2 × 2 layer (no compute to hide it: a difference of medians
    of interleaved loops, with and without it); the tiny model's step (batch 4 × 64 tokens, one
    thread) is what it is compared with. On a loaded host the difference of two model loops is
    noise many times the recorder's few microseconds; this isolates them."""
    import torch

    sys.path.insert(0, str(ROOT / "train"))
    from torchft_recorder import RoundRecorder  # train/'s torchft scripts (torch): on the path from here on
    from torchft_train import build_model

    torch.set_num_threads(1)
    layer = torch.nn.Linear(2, 2)
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            bare = torch.optim.SGD(layer.parameters(), lr=0.1)
            t0 = time.perf_counter()
            for _ in range(steps):
                bare.step()
            plain.append((time.perf_counter() - t0) / steps)
            opt = torch.optim.SGD(layer.parameters(), lr=0.1)
            rec = RoundRecorder(tmp, "n", "bench", sync_every=10, batch_size=4, seq_len=64).attach(_NoManager(), opt)
            rec.start()
            t0 = time.perf_counter()
            for _ in range(steps):
                with rec.step():
                    opt.step()
            recorded.append((time.perf_counter() - t0) / steps)
            rec.close()
    arch = {"vocab_size": 1024, "hidden_size": 64, "ffn_size": 256, "num_layers": 2, "num_heads": 2,
            "num_kv_heads": 2, "tie_embeddings": False, "rope_theta": 10000.0, "seq_len": 64}
    model = build_model(arch, 0)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(1024, (4, 64), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(40):
        t0 = time.perf_counter()
        inner.zero_grad()
        model(input_ids=tokens, labels=tokens).loss.backward()
        inner.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(recorded) - statistics.median(plain), statistics.median(times)


def _overhead_line() -> str:
    cost_s, step_s = recorder_overhead()
    return (f"recorder overhead: {1e6 * cost_s:.1f} µs per inner step against the tiny model's {1e3 * step_s:.1f} ms "
            f"step: {100 * cost_s / step_s:.3f}% (goal ≤ 1%); load average {os.getloadavg()[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="hetero-cpu")
    parser.add_argument("--strategies", nargs=2, default=["measured-steps", "baseline"], metavar=("EXPORTED", "EQUAL"))
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", help="copy each run's folder here (plan, launch files, traces, validation; not the "
                                      "two scripts, copies of train/torchft_*.py)")
    parser.add_argument("--overhead-only", action="store_true", help="only the recorder's overhead per step")
    args = parser.parse_args(argv)
    if args.overhead_only:
        print(_overhead_line())
        return 0
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_torchft_") as tmp:
        for strategy in args.strategies:
            run = Path(tmp) / strategy
            export(args.scenario, strategy, run, args.time_scale, args.rounds)
            wall = run_export(run, args.timeout)
            results[strategy] = validate(run)
            print(f"{strategy}: torchft run of {len(results[strategy])} replica groups took {wall:.1f} s "
                  f"(startup included); load average {os.getloadavg()[0]:.1f}", flush=True)
            if args.out:
                dest = Path(args.out) / strategy
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(run, dest, ignore=shutil.ignore_patterns("__pycache__", "idle.png", "*.py"))
    print(f"\n{args.scenario}, emulated at time scale {args.time_scale:g} (times in the scenario's seconds, "
          f"summed over the rounds)\n{table(results)}")
    for line in verdicts(results, *args.strategies):
        print(line)
    print(_overhead_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
