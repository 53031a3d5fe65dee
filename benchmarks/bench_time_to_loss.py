"""Time to loss, predicted against measured: the loss model fitted on one node mix, checked on another.

For each of two models (the `tiny` preset and benchmarks/time_to_loss/small.json), on this
machine's CPU, on real text (`--data python-stdlib`):

1. fit: `geodt calibrate convergence hetero-cpu` (four nodes) -> DIR/<model>/convergence.csv;
2. report: on a mix the fit never saw (benchmarks/time_to_loss/three-cpu.toml: three nodes,
   0.07 / 0.11 / 0.20 s a step), `geodt validate --emulate --target-loss L` for every strategy of
   STRATEGIES, L the fitted baseline curve's loss at half the baseline's tokens on that mix;
3. prints per model and strategy the time to L predicted and measured, the error, and whether
   the predicted best strategy is the measured best (or within 5% of it); writes DIR/time_to_loss.csv.

Timing is emulated (each inner step padded to the plan's step time, each sync to its comm_s), so
the time axis is the plan's schedule as the executor ran it, and what is tested is the loss model:
the loss is real training. Also: `geodt simulate paper` with and without --target-loss, the loss
model's cost in one run (goal: < 10%).

    python benchmarks/bench_time_to_loss.py --out out/bench-time-to-loss
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HERE = ROOT / "benchmarks" / "time_to_loss"
MODELS = {"tiny": [], "small": [f"model.preset={HERE / 'small.json'}"]}
REPORT_MIX = HERE / "three-cpu.toml"
STRATEGIES = ("baseline", "measured-steps", "measured-batch", "rebalance", "deadline")


def geodt(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "geodt", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"geodt {' '.join(args[:3])} ... failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return done.stdout


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def target_for(profile: Path, overrides: list[str]) -> float:
    """The fitted baseline curve's loss at half the report mix's baseline tokens (rounded to 0.01)."""
    from simulator.engine import simulate
    from simulator.loss_prediction import loss_setup, plan_rounds
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    scenario = load_scenario(str(REPORT_MIX), overrides + [f"training.convergence_profile={profile}"])
    plan = make_plan(scenario, "baseline")
    tokens = plan_rounds(plan, simulate(scenario, plan, "auto"))["tokens"].sum()
    return round(float(loss_setup(scenario).model.curve.loss(tokens / 2)), 2)


def run_model(name: str, overrides: list[str], out: Path) -> pd.DataFrame:
    profile = out / name / "convergence.csv"
    geodt("calibrate", "convergence", "hetero-cpu", "--out", str(profile), *sets(overrides))
    target = target_for(profile, overrides)
    rows = []
    for strategy in STRATEGIES:
        d = out / name / f"validate-{strategy}"
        geodt("validate", str(REPORT_MIX), "--strategy", strategy, "--emulate", "--no-progress", "--data", "python-stdlib",
              "--target-loss", str(target), "--out", str(d), "--checkpoint-every", "6",
              *sets(overrides + [f"training.convergence_profile={profile}"]))
        v = pd.read_csv(d / "validation.csv").iloc[0]
        rows.append({"model": name, "mix": "three-cpu", "strategy": strategy, "target_loss": target,
                     "predicted_s": v["predicted_time_to_target_s"], "measured_s": v["measured_time_to_target_s"],
                     "predicted_loss_end": v["predicted_loss_end"], "measured_loss_end": v["measured_loss_end"]})
        print(f"  {name} {strategy}: predicted {rows[-1]['predicted_s']:.2f} s, measured {rows[-1]['measured_s']:.2f} s",
              flush=True)
    return pd.DataFrame(rows)


def verdicts(table: pd.DataFrame) -> list[str]:
    lines = []
    table["error_pct"] = 100 * (table["predicted_s"] - table["measured_s"]) / table["measured_s"]
    for name, g in table.groupby("model", sort=False):
        err = g["error_pct"].abs()
        pick = g.loc[g["predicted_s"].idxmin()]
        best = g["measured_s"].min()
        ok = pick["measured_s"] <= best * 1.05
        lines.append(f"{name}: |error| median {err.median():.1f}% (goal 10%), worst {err.max():.1f}% (goal 20%); "
                     f"predicted best {pick['strategy']} measured {pick['measured_s']:.2f} s against the measured best "
                     f"{best:.2f} s ({g.loc[g['measured_s'].idxmin(), 'strategy']}): {'met' if ok else 'not met'}")
    return lines


def simulate_cost() -> str:
    """geodt simulate paper's wall time with --target-loss over without (each the best of 3)."""
    def best(*extra: str) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            geodt("simulate", "paper", "--out", str(ROOT / "out" / "bench-ttl-sim"), *extra)
            times.append(time.perf_counter() - start)
        return min(times)
    without, with_target = best(), best("--target-loss", "5.5")
    return (f"geodt simulate paper: {without:.2f} s, with --target-loss {with_target:.2f} s: "
            f"x{with_target / without:.3f} (goal < 1.10)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-time-to-loss")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    frames = []
    for name in args.models.split(","):
        print(f"{name}: fitting on hetero-cpu, reporting on three-cpu", flush=True)
        frames.append(run_model(name, MODELS[name], args.out))
    table = pd.concat(frames, ignore_index=True)
    lines = verdicts(table)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "time_to_loss.csv", index=False, float_format="%.4g")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}" if np.isfinite(v) else "never"))
    for line in lines + [simulate_cost()]:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
