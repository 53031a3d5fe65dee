"""Rounds that adapt while they run, under an injected drift (a benchmark, not a test).

For each strategy (baseline, measured-steps, rebalance, deadline) runs `geodt validate` on
`hetero-cpu` with one node slowed 20% from mid-run (`nodes.<node>.drift = [{kind = "step",
...}]`; the executor injects it: `--emulate` pads that node's steps by the factor, a real run
would lower its CPU quota) and compares per node, summed over the rounds from the slowdown on,
the simulator's prediction with the run: compute, idle and tokens, and idle per node and round
in the node's own (drifted) inner steps, the issue's goal (below one step for rebalance and
deadline while the static plan's grows). Then loss against wall-clock time per strategy
beside the predicted tokens per second (time_to_loss.png).

Emulated (the default here): every inner step is padded to the plan's step_s × drift, so the
run checks the schedule and its decisions (which steps each adaptive round took, from the
times it measured), and its loss is real training on that schedule. Without --emulate the
nodes need cpu_quota and the machine idle enough for the quotas to bind.

    python benchmarks/bench_adaptive.py [--rounds 12] [--out results/adaptive]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("baseline", "measured-steps", "rebalance", "deadline")
KEEP = ("plan.csv", "timeline.csv", "trace.csv", "validation.csv")


def run(strategy: str, args, work: Path) -> Path:
    out = work / strategy
    drift = f'nodes.{args.node}.drift=[{{kind="step", round={args.rounds // 2}, factor={args.factor}}}]'
    cmd = [sys.executable, "-m", "geodt", "validate", args.scenario, "--strategy", strategy, "--no-progress",
           "--set", f"training.rounds={args.rounds}", "--set", drift, "--out", str(out)]
    if args.emulate:
        cmd += ["--emulate", "--time-scale", str(args.time_scale)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_adaptive: {strategy}: geodt validate failed:\n{proc.stderr[-2000:]}")
    return out


def per_node(strategy: str, d: Path, change: int, time_scale: float) -> pd.DataFrame:
    """Per node, from the slowdown's round on: predicted and measured compute, idle, tokens, idle in steps."""
    plan = pd.read_csv(d / "plan.csv").set_index("node")
    pred, meas = pd.read_csv(d / "timeline.csv"), pd.read_csv(d / "trace.csv")
    meas[["compute_s", "idle_s", "comm_s"]] /= time_scale
    rows = []
    for node in plan.index:
        p = pred[(pred["node"] == node) & (pred["round"] >= change)]
        m = meas[(meas["node"] == node) & (meas["round"] >= change)]
        step = plan.at[node, "step_s"]  # the idle unit: the node's own step (× its drift, for the drifted node)
        factor = DRIFT.get(node, 1.0)  # every row here is from the slowdown on
        rows.append({"strategy": strategy, "node": node,
                     "predicted_compute_s": p["compute_s"].sum(), "measured_compute_s": m["compute_s"].sum(),
                     "predicted_idle_s": p["idle_s"].sum(), "measured_idle_s": m["idle_s"].sum(),
                     "predicted_tokens": int(p["tokens"].sum()), "measured_tokens": int(m["tokens"].sum()),
                     "predicted_idle_steps_per_round": float((p["idle_s"].to_numpy() / (step * factor)).mean()),
                     "measured_idle_steps_per_round": float((m["idle_s"].to_numpy() / (step * factor)).mean()),
                     "overrun_steps": int(m["overrun_steps"].sum())})
    return pd.DataFrame(rows)


DRIFT: dict[str, float] = {}


def loss_curve(d: Path, time_scale: float) -> pd.DataFrame:
    """Mean loss over nodes per round against the round's end (wall-clock seconds, scenario scale)."""
    trace = pd.read_csv(d / "trace.csv")
    by = trace.groupby("round").agg(loss=("loss", "mean"), end_s=("round_end_s", "max"), tokens=("tokens", "sum"))
    by["end_s"] /= time_scale
    by["tokens"] = by["tokens"].cumsum()
    return by.reset_index()


def plot(curves: dict, rates: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    for name, c in curves.items():
        ax1.plot(c["end_s"], c["loss"], marker="o", ms=3, label=f"{name} (predicted {rates[name]:,.0f} tokens/s)")
        ax2.plot(c["tokens"], c["loss"], marker="o", ms=3, label=name)
    ax1.set_xlabel("wall-clock time at the round's end (s)")
    ax1.set_ylabel("training loss (mean over nodes)")
    ax1.set_title("loss against time")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("tokens trained (all nodes)")
    ax2.set_title("loss against tokens")
    fig.suptitle(title)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="hetero-cpu")
    p.add_argument("--node", default="medium", help="the node that slows down (default medium)")
    p.add_argument("--factor", type=float, default=1.2, help="its step-time multiplier from mid-run (default 1.2)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--real", dest="emulate", action="store_false", help="no --emulate (needs cpu_quota nodes)")
    p.add_argument("--out", default="results/adaptive")
    args = p.parse_args()
    DRIFT[args.node] = args.factor
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    change = args.rounds // 2
    tables, curves, rates = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as tmp:
        for strategy in STRATEGIES:
            print(f"bench_adaptive: {strategy} ...", file=sys.stderr, flush=True)
            d = run(strategy, args, Path(tmp))
            scale = args.time_scale if args.emulate else 1.0
            tables.append(per_node(strategy, d, change, scale))
            curves[strategy] = loss_curve(d, scale)
            pred = pd.read_csv(d / "timeline.csv")
            rates[strategy] = pred["tokens"].sum() / pred["round_end_s"].max()
            (out / strategy).mkdir(exist_ok=True)
            for name in KEEP:
                shutil.copyfile(d / name, out / strategy / name)
    table = pd.concat(tables, ignore_index=True)
    tmp_csv = out / ".adaptive.csv.tmp"
    table.to_csv(tmp_csv, index=False, float_format="%.6g")
    tmp_csv.replace(out / "adaptive.csv")
    mode = "emulated" if args.emulate else "measured"
    plot(curves, rates, out / "time_to_loss.png",
         f"{args.scenario}: {args.node} {args.factor:g}x slower from round {change} ({mode})")
    summary = table.groupby("strategy", sort=False)[["predicted_idle_steps_per_round",
                                                     "measured_idle_steps_per_round"]].max()
    summary["final_loss"] = [curves[s]["loss"].iloc[-1] for s in summary.index]
    summary["wall_s"] = [curves[s]["end_s"].iloc[-1] for s in summary.index]
    summary["tokens"] = [curves[s]["tokens"].iloc[-1] for s in summary.index]
    summary["predicted_tokens_per_s"] = [rates[s] for s in summary.index]
    summary["measured_tokens_per_s"] = summary["tokens"] / summary["wall_s"]
    print(f"{mode}; from round {change} on, the worst node's idle per round in its own inner steps:")
    print(summary.to_string(float_format=lambda v: f"{v:,.3f}"))
    print(table.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
