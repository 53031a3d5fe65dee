"""One scenario, every strategy: the metrics of `simulator.sweep.sweep` computed from simulated timelines.

This is the reference path (make_plan + simulate); `geodt sweep --table` writes it, and the
tests compare the sweep's fast path with it. table.csv also has `comparable` after speedup
(simulator/outputs/report.py's rule, added by simulator/sweep/sweep_cli.py: report.py builds on this module),
and format_markdown marks the speed-up of a strategy that does other work with *.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.models.totals import RunTotals

TABLE_COLUMNS = ["strategy", "tokens_per_round", "tokens_vs_baseline", "round_s", "wall_s", "comm_s", "idle_s",
                 "idle_floor_s", "idle_vs_floor", "idle_s_equal_tokens", "idle_left", "utilization",
                 "tokens_per_s", "speedup", "note"]


def timeline_metrics(plan, timeline) -> dict:
    """The sweep's metrics (see simulator.sweep.sweep) from one simulated timeline, or its totals
    (simulator/models/totals.py RunTotals, accumulated as `geodt simulate` writes the timeline)."""
    run = timeline if isinstance(timeline, RunTotals) else RunTotals.of(timeline)
    rounds = run.rounds
    compute, idle, comm = (float(v) for v in run.sums)
    wall = run.wall_s
    # the tokens the rounds trained on (an adaptive plan's vary round by round), else the plan's
    tokens = run.tokens if run.node_tokens is not None else plan.tokens_per_round * rounds
    return {"strategy": plan.strategy, "tokens_per_round": round(tokens / rounds), "tokens": tokens,
            "round_s": wall / rounds, "wall_s": wall, "comm_s": plan.comm_s, "idle_s": idle,
            # the one-step bound (CSV name kept): see format_markdown and simulator.sweep.sweep
            "idle_floor_s": rounds * sum(n.step_s for n in plan.nodes),
            "utilization": compute / (compute + idle + comm), "tokens_per_s": tokens / wall, "note": plan.note}


def table_frame(scenario, plans, timelines) -> pd.DataFrame:
    """One row per strategy; the first plan must be the baseline (the reference of the ratios)."""
    rows = pd.DataFrame([timeline_metrics(p, t) for p, t in zip(plans, timelines)])
    base = rows.iloc[0]
    rows["tokens_vs_baseline"] = rows["tokens_per_round"] / base["tokens_per_round"]
    rows["idle_vs_floor"] = rows["idle_s"] / rows["idle_floor_s"]
    rows["idle_s_equal_tokens"] = rows["idle_s"] * base["tokens"] / rows["tokens"]
    rows["idle_left"] = rows["idle_s_equal_tokens"] / base["idle_s"] if base["idle_s"] > 0 else float("nan")
    rows["speedup"] = rows["tokens_per_s"] / base["tokens_per_s"]
    return rows[TABLE_COLUMNS]


def format_markdown(scenario, table: pd.DataFrame, other_work_note: str = "") -> str:
    """The table as Markdown, with the definitions under it; where the table has `comparable`, a
    strategy that does other work has its speed-up marked * and other_work_note under the table."""
    marks = ["" if ok else "*" for ok in table["comparable"]] if "comparable" in table else [""] * len(table)
    head = ("| strategy | tokens/round vs baseline | round (s) | idle (s) | one-step bound (s) | idle / bound "
            "| idle at baseline's tokens, % of baseline's | utilization | tokens/s | speed-up |")
    lines = [(f"# Every strategy on `{scenario.name}` ({len(scenario.nodes)} nodes, "
             f"{scenario.network.bandwidth_gbps:g} Gbit/s, {scenario.training.rounds} rounds, SimPy engine)"), "",
             head, "|" + "---|" * 10]
    for r, mark in zip(table.itertuples(), marks):
        lines.append(f"| {r.strategy} | {r.tokens_vs_baseline:.3f} | {r.round_s:.2f} | {r.idle_s:.2f} "
                     f"| {r.idle_floor_s:.2f} | {r.idle_vs_floor:.2f} | {100 * r.idle_left:.1f}% "
                     f"| {r.utilization:.3f} | {r.tokens_per_s:,.0f} | {r.speedup:.2f}x{mark} |")
    if any(marks) and other_work_note:
        lines += ["", other_work_note]
    lines += ["", "idle: GPU idle at the sync barrier, summed over nodes and rounds (docs/DESIGN.md). one-step bound",
              "(CSV: idle_floor_s): one inner step per node per round at the plan's own batches, a bound from above:",
              "a plan whose nodes all finish within one of their own steps of the slowest idles less than this, so",
              "idle / bound below 1 means balanced to the step (whole steps cannot do much better), above 1 not.",
              "Idle at baseline's tokens scales idle to the baseline's token count (strategies that change H or b",
              "change the work per round). Round: wall time / rounds (sync-ddp: one step and its all-reduce).",
              "", "Plans:", ""]
    lines += [f"- {r.strategy}: {r.note}" for r in table.itertuples() if r.note]
    if "time_to_target_s" in table:
        lines += ["", (f"Predicted loss (simulator/models/loss_prediction.py), "
                       f"target {scenario.training.target_loss:g}:"), ""]
        lines += [f"- {r.strategy}: loss {r.loss_end:.3f} at the end, target "
                  + (f"at {r.time_to_target_s:,.1f} s" if np.isfinite(r.time_to_target_s) else "never reached")
                  for r in table.itertuples()]
    return "\n".join(lines) + "\n"
