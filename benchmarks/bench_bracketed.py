"""Real runs bracketed by a calibration before and after: does the run follow the machine, and which device drifts.

For each of --runs runs: `geodt calibrate scenario` of the scenario's devices at its batch (--passes
passes), `geodt validate` of the scenario on those profiles (--strategy, a real run), then the same
calibration again. Per run and node: the step before and after (ms, `step_s_mean`), the run's
measured compute over its prediction from the calibration before (`run_over_before`), the round and
idle errors as bench_fidelity.py signs them, `after_over_before`, and the run over the mean of the
two calibrations (`run_over_mid`, which no prediction made before the run can have).

    python benchmarks/bench_bracketed.py [--scenario benchmarks/fidelity/three-node.toml] [--runs 5]
        [--passes 3] [--strategy measured-steps] [--out results/predict-the-run/bracketed]

Writes bracketed.csv, and per run its validation.csv and both calibrations; prints how many runs met
each fidelity goal and, per run, the fastest device's run_over_before over the others' mean.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_fidelity import _run, scenario_with_profiles  # noqa: E402
from facts.fidelity import IDLE_WORST, ROUND_MEDIAN  # noqa: E402

ROUND_PCT, IDLE_PCT = ROUND_MEDIAN.limit_pct, IDLE_WORST.limit_pct

def bracketed_run(scenario: Path, batch: int, passes: int, strategy: str, keep: Path, work: Path) -> None:
    for side in ("before", "after"):
        (keep / side).mkdir(parents=True)
    calibrate = ("calibrate", "scenario", "--scenario", str(scenario), "--batch", str(batch), "--repeats", "20",
                 "--passes", str(passes))
    geodt = [sys.executable, "-m", "geodt"]
    _run([*geodt, *calibrate, "--out-dir", str(keep / "before")])
    copy = scenario_with_profiles(scenario, keep / "before", work / scenario.name)
    _run([*geodt, "validate", str(copy), "--strategy", strategy, "--out", str(work / "run"), "--threads", "1"])
    _run([*geodt, *calibrate, "--out-dir", str(keep / "after")])
    shutil.copy(work / "run" / "validation.csv", keep / "validation.csv")


def _step_ms(profile: Path, batch: int) -> float:
    rows = pd.read_csv(profile)
    return 1e3 * float(rows[rows.batch_size == batch].step_s_mean.iloc[0])


def table(out: Path, runs: int, batch: int) -> pd.DataFrame:
    rows = []
    for k in range(1, runs + 1):
        run = out / f"run{k}"
        for r in pd.read_csv(run / "validation.csv").itertuples():
            before, after = (_step_ms(run / side / f"{r.node}-0.csv", batch) for side in ("before", "after"))
            run_over_before = r.measured_compute_s / r.predicted_compute_s
            rows.append({"run": k, "node": r.node, "before_ms": before, "after_ms": after,
                         "run_over_before": run_over_before,
                         "round_err_pct": 100 * (r.predicted_round_s - r.measured_round_s) / r.measured_round_s,
                         "idle_err_pct_of_round": 100 * (r.measured_idle_s - r.predicted_idle_s) / r.measured_round_s,
                         "after_over_before": after / before,
                         "run_over_mid": run_over_before * 2 * before / (before + after)})
    return pd.DataFrame(rows)


def verdicts(frame: pd.DataFrame) -> list[str]:
    g = frame.groupby("run")
    rounds = int((g.round_err_pct.apply(lambda s: s.abs().max()) <= ROUND_PCT).sum())
    idle = int((g.idle_err_pct_of_round.apply(lambda s: s.abs().max()) <= IDLE_PCT).sum())
    fast = []
    for _, d in g:
        first = d.before_ms.idxmin()
        fast.append(d.run_over_before[first] / d.run_over_before.drop(first).mean())
    corr = np.corrcoef(frame.run_over_before, frame.after_over_before)[0, 1]
    return [(f"round within ±{ROUND_PCT:g}%: {rounds} of {len(g)} runs; worst idle within {IDLE_PCT:g}% of the "
            f"round: {idle} of {len(g)}"),
            (f"the fastest device's run/before over the others' mean, per run: {', '.join(f'{v:.3f}' for v in fast)} "
            f"(median {np.median(fast):.3f})"),
            f"correlation of run/before with after/before over {len(frame)} node rows: {corr:.2f}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, default=ROOT / "benchmarks" / "fidelity" / "three-node.toml")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--strategy", default="measured-steps")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "predict-the-run" / "bracketed")
    args = p.parse_args(argv)
    scenario = args.scenario.resolve()
    batch = load_scenario(str(scenario), without_profiles=True).training.batch_size
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent))
    try:
        for k in tqdm(range(1, args.runs + 1), desc="bracketed runs", unit="run", file=sys.stderr):
            with tempfile.TemporaryDirectory(prefix="geodt-brk-") as work:
                bracketed_run(scenario, batch, args.passes, args.strategy, staging / f"run{k}", Path(work))
        frame = table(staging, args.runs, batch)
        frame.to_csv(staging / "bracketed.csv", index=False)
        if args.out.exists():
            shutil.rmtree(args.out)
        os.replace(staging, args.out)  # the whole set or nothing
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(frame.round(3).to_string(index=False))
    print("\n".join(verdicts(frame)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
