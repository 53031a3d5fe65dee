"""What `geodt sweep` prints at the end: per strategy and bandwidth, the findings of sweep.csv.

Per strategy: the median idle left (idle at the baseline's token count as a % of the baseline's
idle, over the scenarios whose baseline idles), and per bandwidth the median speed-up (tokens/s
over the baseline's) and the number of scenarios it wins by tokens/s (ties: the first strategy
in the CSV's order, as in winners.png); then the winner at each bandwidth in words. A speed-up
and a winner are marked * where the strategy does other work in some of those scenarios (its
run's tokens beyond ±5% of the baseline's: sweep.csv's `comparable`, the rule `geodt simulate`
marks with *), and a note under the table says so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.outputs.report import TOKENS_BAND
from simulator.sweep.sweep_dataset import stats_of

OTHER_WORK_NOTE = (f"*: other work in some or all of those scenarios (the run's tokens beyond ±{TOKENS_BAND:.0%} "
                   "of the baseline's, as geodt simulate marks it): that speed-up is not like for like")


def findings_text(data) -> str:
    """From sweep.csv loaded, or its SweepStats (simulator/sweep/sweep_dataset.py: read part by part)."""
    stats = stats_of(data)
    strategies = stats.strategies
    bws = stats.bandwidths
    won = stats.wins["tokens_per_s"]
    rows = []
    for strategy in strategies:
        left = pd.Series(stats.idle_left[strategy]).median()
        row = {"strategy": strategy, "idle left": "-" if pd.isna(left) else f"{100 * left:.1f}%"}
        for bw in bws:
            values = stats.speedup.get((strategy, bw), np.zeros(0))
            row[f"speed-up {bw:g} Gbit/s"] = f"{pd.Series(values).median():.2f}x{stats.other_work_mark(strategy, bw)}"
        for bw in bws:
            row[f"wins {bw:g} Gbit/s"] = int(((won["strategy"] == strategy) & (won["bandwidth_gbps"] == bw)).sum())
        rows.append(row)
    scenarios = stats.scenarios
    width = max(len("strategy"), *map(len, strategies))
    numbers = pd.DataFrame(rows).drop(columns="strategy").to_string(index=False).splitlines()
    lines = [(f"Over {scenarios:,} scenarios, per strategy: median idle left at the baseline's token count (% of the "
             "baseline's idle), median speed-up in tokens/s over the baseline, scenarios won by tokens/s:")]
    lines += [f"{name:<{width}} {line}" for name, line in zip(["strategy", *strategies], numbers)]
    if any(stats.other_work.values()):
        lines.append(OTHER_WORK_NOTE)
    best = []
    for bw in bws:
        counts = won.loc[won["bandwidth_gbps"] == bw, "strategy"].astype(str).value_counts()
        best.append(f"at {bw:g} Gbit/s {counts.index[0]}{stats.other_work_mark(counts.index[0], bw)} "
                    f"({100 * counts.iloc[0] / counts.sum():.0f}% of {counts.sum():,})")
    lines.append("Most tokens/s: " + "; ".join(best))
    if "time_to_target_s" in stats.wins:  # geodt sweep --target-loss
        first = stats.wins["time_to_target_s"]
        earliest = []
        for bw in bws:
            counts = first.loc[first["bandwidth_gbps"] == bw, "strategy"].astype(str).value_counts()
            earliest.append(f"at {bw:g} Gbit/s {counts.index[0]} ({100 * counts.iloc[0] / counts.sum():.0f}% of "
                            f"{counts.sum():,} that reach it)" if len(counts) else f"at {bw:g} Gbit/s none reaches it")
        lines.append("Earliest to the target loss (predicted): " + "; ".join(earliest))
    return "\n".join(lines)
