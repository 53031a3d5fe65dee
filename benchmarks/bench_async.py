"""Rounds without a barrier (async, quorum) measured against their prediction (issue 40; a benchmark, not a test).

Three parts, each a `geodt validate` of real processes on this machine:

1. Timing, real runs (nothing padded): two device mixes of benchmarks/fidelity/ (two-node: a
   1-device and a 2-device node; three-node), their devices calibrated together right before each
   run (bench_fidelity.fresh_profiles; `--committed-profiles` skips that), strategies `async` and
   `quorum` beside `baseline`. Per node: predicted against measured compute, wait (idle), sync and round, and the
   mean staleness of its merges; the goals: round within 5% (per node, as `validate`'s verdict),
   the run's mean staleness within 10%.
2. The shaped WAN (root: every node in a network namespace, real/wan/wan.py): hetero-cpu `async` and
   `quorum` emulated (steps and syncs padded to the plan's, the transfers real), as a check that the
   server's point-to-point traffic runs over shaped links and keeps the schedule.
3. Loss: hetero-cpu emulated on real text (`--target-loss`, the built-in convergence profile's
   corpus), strategies async, quorum, baseline, rebalance, deadline and streaming: the measured time to the
   target and loss at the end against the loss model's prediction, and the measured loss against
   the schedule's time (loss.png).

Writes results/async/{timing.csv, loss.csv, table.md, loss.png} and prints the tables.

    python benchmarks/bench_async.py [--committed-profiles] [--no-wan] [--target-loss 4.0] [--rounds 8]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_fidelity import _run, run_case

from facts.fidelity import ROUND_MEDIAN, STALENESS
from geodt.paper.fmt import markdown
from simulator.outputs.outputs import figure_bytes, write_bytes, write_csv, write_text

ROOT = Path(__file__).resolve().parents[1]
MIXES = ("two-node", "three-node")
TIMING_STRATEGIES = ("async", "quorum", "baseline")
LOSS_STRATEGIES = ("async", "quorum", "baseline", "rebalance", "deadline", "streaming")
TIMING_COLUMNS = ["mix", "strategy", "node", "predicted_compute_s", "measured_compute_s", "predicted_idle_s",
                  "measured_idle_s", "predicted_comm_s", "measured_comm_s", "predicted_round_s", "measured_round_s",
                  "round_error_pct", "error_pct_of_round", "predicted_staleness_mean", "measured_staleness_mean",
                  "predicted_run_staleness_mean", "measured_run_staleness_mean", "final_loss", "verdict"]
LOSS_COLUMNS = ["strategy", "predicted_loss_end", "measured_loss_end", "predicted_time_to_target_s",
                "measured_time_to_target_s", "loss_model_time_to_target_s", "measured_run_staleness_mean",
                "overrun_steps", "inner_steps"]


def timing(work: Path, calibrate: bool) -> pd.DataFrame:
    """Part 1: every mix × TIMING_STRATEGIES, one real validate each (calibrated right before)."""
    frames = []
    cases = [(mix, s) for mix in MIXES for s in TIMING_STRATEGIES]
    for k, (mix, strategy) in enumerate(tqdm(cases, desc="timing runs", unit="run", file=sys.stderr)):
        frame = run_case(mix, strategy, work / f"timing{k}", calibrate=calibrate)
        frames.append(frame.assign(mix=mix))
    return pd.concat(frames, ignore_index=True).reindex(columns=TIMING_COLUMNS)


def validate(work: Path, name: str, args: list[str]) -> Path:
    """`geodt validate hetero-cpu ARGS --out work/name`; its output folder."""
    out = work / name
    _run([sys.executable, "-m", "geodt", "validate", "hetero-cpu", *args, "--out", str(out), "--threads", "1"])
    return out


def shaped_wan(work: Path) -> pd.DataFrame | None:
    """Part 2: hetero-cpu async and quorum emulated over the shaped WAN; None without root."""
    if os.geteuid() != 0:
        print("bench_async: the shaped WAN needs root (network namespaces); part 2 skipped", file=sys.stderr)
        return None
    frames = []
    for strategy in ("async", "quorum"):
        out = validate(work, f"wan-{strategy}", ["--strategy", strategy, "--emulate", "--wan", "shaped"])
        frames.append(pd.read_csv(out / "validation.csv").assign(mix="hetero-cpu, shaped WAN (emulated)",
                                                                 strategy=strategy))
    return pd.concat(frames, ignore_index=True).reindex(columns=TIMING_COLUMNS)


def loss(work: Path, target: float, rounds: int) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Part 3: per strategy, the loss model's prediction against the run; and each run's trace."""
    rows, traces = [], {}
    for strategy in tqdm(LOSS_STRATEGIES, desc="loss runs", unit="run", file=sys.stderr):
        out = validate(work, f"loss-{strategy}", ["--strategy", strategy, "--emulate", "--target-loss", str(target),
                                                  "--set", f"training.rounds={rounds}"])
        table, trace = pd.read_csv(out / "validation.csv"), pd.read_csv(out / "trace.csv")
        # overruns: emulated steps whose real compute outlasted the plan's step (the schedule slips)
        rows.append(table.iloc[0].reindex(LOSS_COLUMNS).to_dict() | {
            "strategy": strategy, "overrun_steps": int(trace["overrun_steps"].sum()),
            "inner_steps": int(trace["local_steps"].sum())})
        traces[strategy] = trace
    return pd.DataFrame(rows, columns=LOSS_COLUMNS), traces


def plot_loss(traces: dict[str, pd.DataFrame], table: pd.DataFrame, target: float, path: Path) -> None:
    """Measured loss (the nodes' inner-step mean weighted by tokens) at each round's end, per strategy,
    with the measured and predicted times to the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for k, (strategy, trace) in enumerate(traces.items()):
        g = trace.assign(w=trace["loss"] * trace["tokens"]).groupby("round")
        color = f"C{k}"
        ax.plot(g["round_end_s"].max(), g["w"].sum() / g["tokens"].sum(), marker="o", ms=3, color=color,
                label=strategy)
        row = table[table["strategy"] == strategy].iloc[0]
        if pd.notna(row["predicted_time_to_target_s"]) and row["predicted_time_to_target_s"] != float("inf"):
            ax.axvline(row["predicted_time_to_target_s"], color=color, ls=":", lw=1)
    ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("schedule time (s; emulated: each step and sync padded to the plan's)")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title("hetero-cpu, real training on python-stdlib: measured loss; dotted: predicted time to target")
    ax.legend(fontsize=8)
    write_bytes(path, figure_bytes(fig, dpi=110))
    plt.close(fig)


def timing_summary(table: pd.DataFrame) -> list[str]:
    """Per mix and strategy: the round errors against the goal and the staleness error."""
    lines = []
    for (mix, strategy), g in table.groupby(["mix", "strategy"], sort=False):
        worst = g["round_error_pct"].abs().max()
        line = (f"{mix} {strategy}: round error worst {worst:.1f}% (goal ±{ROUND_MEDIAN.limit_pct:g}% per node), "
                f"idle worst {g['error_pct_of_round'].abs().max():.1f}% of round")
        p, m = g["predicted_run_staleness_mean"].iloc[0], g["measured_run_staleness_mean"].iloc[0]
        if pd.notna(m) and p > 0:
            line += (f"; staleness {p:.2f} predicted, {m:.2f} measured ({100 * (m - p) / p:+.1f}%, goal "
                     f"±{STALENESS.limit_pct:g}%)")
        elif pd.notna(m):  # nothing predicted stale: the goal's percentage has no base
            line += f"; staleness 0 predicted, {m:.2f} measured (not judged)"
        lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "async")
    parser.add_argument("--committed-profiles", action="store_true",
                        help="use the mixes' committed profiles instead of calibrating right before each run")
    parser.add_argument("--no-wan", action="store_true", help="leave out part 2 (the shaped WAN)")
    parser.add_argument("--target-loss", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each loss run (part 3)")
    args = parser.parse_args()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="geodt-async-") as tmp:
        work = Path(tmp)
        frames = [timing(work, calibrate=not args.committed_profiles)]
        if not args.no_wan:
            wan = shaped_wan(work)
            frames += [wan] if wan is not None else []
        timing_table = pd.concat(frames, ignore_index=True)
        loss_table, traces = loss(work, args.target_loss, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(timing_table, args.out / "timing.csv")
    write_csv(loss_table, args.out / "loss.csv")
    plot_loss(traces, loss_table, args.target_loss, args.out / "loss.png")
    machine = (f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, Python "
               f"{platform.python_version()}, started {started}")
    shown = timing_table.drop(columns=["predicted_run_staleness_mean", "measured_run_staleness_mean"])
    text = "\n".join([f"# bench_async ({machine})", "", "## Timing (parts 1 and 2)", "",
                      markdown(shown, default_digits=3), "", *timing_summary(timing_table), "",
                      f"## Loss (part 3: hetero-cpu emulated, target {args.target_loss:g}, {args.rounds} rounds)", "",
                      markdown(loss_table, default_digits=3), ""])
    write_text(args.out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
