"""Rounds that adapt while they run, under a REAL drift: one node's CPU quota lowered mid-run.

For each strategy (baseline, measured-steps, rebalance, deadline) runs `geodt validate` (real:
nothing padded) on a scenario of CPU devices made by quotas (default benchmarks/fidelity/
quota-mix.toml: `fast` 0.9 of core 0, `slow` 0.45 of core 1), with `nodes.<node>.drift = [{kind
= "step", round = R/2, factor = 1.2}]`: at that round's start the node's process lowers its own
cgroup quota to quota / 1.2 (real/process/worker.py, train/cpulimit.py). Right before each run the
scenario's devices are calibrated together under their quotas at the scenario's batch (`geodt
calibrate scenario --scenario`, as benchmarks/bench_fidelity.py does; every plan here runs at that
batch: the adaptive strategies change H_i, not b_i), and the plan comes from those profiles; then
again with the node's quota divided by 1.2, and the simulator predicts the run with that node's
steps as much longer from the drift's round as that calibration measured (the drift's `factor`,
its `cpu_quota_factor` 1.2: a quota / 1.2 does not make a step 1.2× longer, simulator/models/drift.py).

`--wan shaped` (root): every node in a network namespace of its own with its link shaped by tbf
(real/wan/wan.py) at --bandwidth-gbps; the host's costs from `geodt calibrate network` once, the
links calibrated on the shaped WAN right before each run (bench_fidelity.py's links_profile).

Writes <out>/adaptive.csv (per repeat, strategy and node, from the drift's round on: predicted
and measured compute, idle, tokens, and idle per round in the node's own inner steps, the
issue's goal; also before the drift and `_settled` from the round after it; round, compute,
idle and tokens errors), <out>/summary.csv (per strategy, median over repeats), <out>/runs.csv (per
run: load average before and after, each node's calibrated step and its measured mean step before
and after the drift), <out>/<strategy>/ (the first repeat's plan, timeline, trace, validation) and
<out>/time_to_loss.png (first repeat), and prints the tables.

    python benchmarks/bench_adaptive_real.py [--repeats 3] [--wan shaped] [--out results/adaptive-real]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_adaptive as ba  # noqa: E402  (per_node, loss_curve, plot: one implementation)
import bench_fidelity as bf  # noqa: E402  (with_profiles, host_network_profile, links_profile)

CAL_REPEATS = 20  # timed steps per device in each calibration (bench_fidelity's)


def run_cmd(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        raise SystemExit(f"bench_adaptive_real: {what} failed ({proc.returncode}): {tail}")


def calibrated(scenario: str, batch: int, work: Path, node: str, quota_factor: float) -> tuple[Path, float]:
    """The scenario with its devices' profiles measured just now, together, under their quotas;
    and the drift's step-time factor, measured likewise with `node`'s quota divided by quota_factor
    (the slowdown that quota gives, which is not quota_factor: simulator/models/drift.py)."""
    path = bf.SCENARIOS / f"{scenario}.toml"
    quota = {n.name: n.cpu_quota for n in load_scenario(str(path), without_profiles=True).nodes}[node]
    steps = []
    for folder, sets in (("profiles", []), ("profiles-drifted", ["--set", f"nodes.{node}.cpu_quota={quota / quota_factor!r}"])):
        (work / folder).mkdir()
        run_cmd([sys.executable, "-m", "geodt", "calibrate", "scenario", "--scenario", str(path), "--batch", str(batch),
                 "--repeats", str(CAL_REPEATS), "--out-dir", str(work / folder), *sets], "geodt calibrate scenario")
        profile = next(p for p in (work / folder).glob("*.csv") if p.stem.rsplit("-", 1)[0] == node)
        steps.append(float(pd.read_csv(profile)["step_s_mean"].iloc[0]))
    return bf.with_profiles(scenario, work / "profiles", work), steps[1] / steps[0]


def wan_sets(args, host: Path) -> list[str]:
    return [f"network.bandwidth_gbps={args.bandwidth_gbps!r}", 'network.payload_dtype="fp32"',
            'network.collective="ring"', f'network.profile="{host}"']


def step_means(trace: pd.DataFrame, change: int) -> dict:
    """Each node's mean inner step (compute_s / steps) before and from the drift's round (round 0 left out: warm-up)."""
    t = trace[trace["round"] > 0]
    out = {}
    for node, rows in t.groupby("node"):
        before, after = rows[rows["round"] < change], rows[rows["round"] >= change]
        out[f"{node}_step_before_s"] = before["compute_s"].sum() / before["local_steps"].sum()
        out[f"{node}_step_after_s"] = after["compute_s"].sum() / after["local_steps"].sum()
    return out


def more_columns(d: Path, table: pd.DataFrame, change: int, factor: float, node: str) -> pd.DataFrame:
    """Per node, beside ba.per_node's: idle per round in the node's own steps before the drift
    (rounds 1 .. change − 1; round 0 is the warm-up) and settled (from round change + 1: the
    first round an adaptive plan can re-plan from the slowed steps it measured; no strategy
    foresees the slowdown's own round), and the rounds' time from the drift on (round error,
    idle error in % of the round: the fidelity goals of bench_fidelity.py)."""
    plan = pd.read_csv(d / "plan.csv").set_index("node")
    pred, meas = pd.read_csv(d / "timeline.csv"), pd.read_csv(d / "trace.csv")
    extra: dict[str, list] = {}
    for name, frame in (("predicted", pred), ("measured", meas)):
        frame = frame.assign(round_s=frame["round_end_s"] - frame["round_start_s"])
        for n in table["node"]:
            rows = frame[frame["node"] == n]
            before, after = rows[(rows["round"] > 0) & (rows["round"] < change)], rows[rows["round"] > change]
            step = plan.at[n, "step_s"]
            extra.setdefault(f"{name}_idle_steps_per_round_before", []).append(float((before["idle_s"] / step).mean()))
            extra.setdefault(f"{name}_idle_steps_per_round_settled", []).append(
                float((after["idle_s"] / (step * (factor if n == node else 1.0))).mean()))
            extra.setdefault(f"{name}_round_s", []).append(float(rows[rows["round"] >= change]["round_s"].sum()))
    out = table.assign(**extra)
    out["round_err_pct"] = 100 * (out.predicted_round_s - out.measured_round_s) / out.measured_round_s
    out["compute_err_pct"] = 100 * (out.predicted_compute_s - out.measured_compute_s) / out.measured_compute_s
    out["idle_err_pct_of_round"] = 100 * (out.measured_idle_s - out.predicted_idle_s) / out.measured_round_s
    out["tokens_err_pct"] = 100 * (out.predicted_tokens - out.measured_tokens) / out.measured_tokens
    return out


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per strategy over its repeats: the worst node's idle per round in its own steps (before the
    drift, from it on, settled), median over repeats, and the errors' median and worst over node rows."""
    idle = [f"{w}_idle_steps_per_round{s}" for s in ("_before", "", "_settled") for w in ("predicted", "measured")]
    worst_node = table.groupby(["strategy", "repeat"], sort=False)[idle].max()
    out = worst_node.groupby(level=0, sort=False).median()
    g = table.groupby("strategy", sort=False)
    worst = lambda s: float(s.loc[s.abs().idxmax()])
    for col in ("round_err_pct", "compute_err_pct", "idle_err_pct_of_round", "tokens_err_pct"):
        out[f"{col}_median"] = g[col].median()
        out[f"{col}_worst"] = g[col].apply(worst)
    return out


def run_one(strategy: str, args, work: Path, host: Path | None) -> tuple[Path, dict]:
    """One calibrated, real validate run of `strategy` with the drift; returns its folder and its runs.csv row."""
    work.mkdir(parents=True)
    batch = load_scenario(str(bf.SCENARIOS / f"{args.scenario}.toml"), without_profiles=True).training.batch_size
    sets = [f"training.rounds={args.rounds}"]
    if host is not None:
        net = wan_sets(args, host)
        profile = bf.links_profile(bf.SCENARIOS / f"{args.scenario}.toml", net, "fp32", "ring", host, work,
                                   repeats=args.link_repeats)
        sets += [*net[:-1], f'network.profile="{profile}"']
    load_cal = os.getloadavg()[0]
    path, factor = calibrated(args.scenario, batch, work, args.node, args.factor)
    drift = (f'nodes.{args.node}.drift=[{{kind="step", round={args.rounds // 2}, factor={factor!r}, '
             f'cpu_quota_factor={args.factor!r}}}]')
    out = work / "run"
    cmd = [sys.executable, "-m", "geodt", "validate", str(path), "--strategy", strategy, "--no-progress",
           "--threads", "1", "--out", str(out), "--set", drift]
    for text in sets:
        cmd += ["--set", text]
    load_before = os.getloadavg()[0]
    run_cmd(cmd + (["--wan", "shaped"] if host is not None else []), f"geodt validate --strategy {strategy}")
    row = {"strategy": strategy, "load1_at_calibration": load_cal, "load1_before": load_before,
           "load1_after": os.getloadavg()[0], "drift_factor_calibrated": factor}
    for csv in sorted((work / "profiles").glob("*.csv")):
        row[f"{csv.stem.rsplit('-', 1)[0]}_calibrated_step_s"] = float(pd.read_csv(csv)["step_s_median"].iloc[0])
    row.update(step_means(pd.read_csv(out / "trace.csv"), args.rounds // 2))
    return out, row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="quota-mix", help="a scenario of benchmarks/fidelity/ with cpu_quota nodes")
    p.add_argument("--node", default="slow", help="the node whose quota drops mid-run (default slow)")
    p.add_argument("--factor", type=float, default=1.2, help="its quota is divided by this from mid-run (default 1.2)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--wan", choices=("loopback", "shaped"), default="loopback")
    p.add_argument("--bandwidth-gbps", type=float, default=0.016, help="shaped WAN: each node's link (default 16 Mbit/s)")
    p.add_argument("--link-repeats", type=int, default=8, help="shaped WAN: repeats per size of each link calibration")
    p.add_argument("--out", default="results/adaptive-real")
    args = p.parse_args()

    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    change = args.rounds // 2
    tables, runs, curves, rates = [], [], {}, {}
    jobs = [(r, s) for r in range(args.repeats) for s in ba.STRATEGIES]
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-real-") as tmp:
        host = bf.host_network_profile(Path(tmp)) if args.wan == "shaped" else None
        for k, (r, strategy) in enumerate(tqdm(jobs, desc="adaptive-real", unit="run", file=sys.stderr)):
            d, row = run_one(strategy, args, Path(tmp) / f"run{k}", host)
            ba.DRIFT[args.node] = row["drift_factor_calibrated"]  # the idle unit: the node's drifted step
            table = ba.per_node(strategy, d, change, 1.0).assign(repeat=r)
            tables.append(more_columns(d, table, change, row["drift_factor_calibrated"], args.node))
            runs.append({"repeat": r, **row, "wall_s": pd.read_csv(d / "trace.csv")["round_end_s"].max()})
            if r == 0:
                curves[strategy] = ba.loss_curve(d, 1.0)
                pred = pd.read_csv(d / "timeline.csv")
                rates[strategy] = pred["tokens"].sum() / pred["round_end_s"].max()
                (out / strategy).mkdir(exist_ok=True)
                for name in ba.KEEP:
                    shutil.copyfile(d / name, out / strategy / name)
    table = pd.concat(tables, ignore_index=True)
    runs_frame = pd.DataFrame(runs)
    for name, frame in (("adaptive.csv", table), ("runs.csv", runs_frame)):
        tmp_csv = out / f".{name}.tmp"
        frame.to_csv(tmp_csv, index=False, float_format="%.6g")
        tmp_csv.replace(out / name)
    where = "shaped WAN" if args.wan == "shaped" else "loopback"
    ba.plot(curves, rates, out / "time_to_loss.png",
            f"{args.scenario} ({where}): {args.node}'s CPU quota / {args.factor:g} from round {change} (real runs)")
    summ = summary(table)
    tmp_csv = out / ".summary.csv.tmp"
    summ.to_csv(tmp_csv, float_format="%.6g")
    tmp_csv.replace(out / "summary.csv")
    print(f"real, {where}, {args.repeats} repeat(s); the worst node's idle per round in its own inner steps "
          f"(median over repeats): before the drift (rounds 1-{change - 1}), from it (round {change} on), settled "
          f"(round {change + 1} on); errors over node rows from round {change} on (signed: median, worst):")
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(summ.T.to_string(float_format=lambda v: f"{v:,.2f}"))
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    print(runs_frame.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
