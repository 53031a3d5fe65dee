"""The answer `geodt simulate` ends with: every strategy side by side, and which one to use and why.

Per strategy (metrics of `simulator.outputs.sweep_table.timeline_metrics`, the same as `geodt sweep --table`):
round_s = wall time / rounds; tokens_per_round (all nodes); tokens_per_s = the run's tokens /
wall time; speedup = tokens_per_s / the baseline's; idle_s = barrier idle summed over nodes and
rounds (docs/DESIGN.md, "Time accounting").

With the loss model's prediction per strategy (simulator/models/loss_prediction.py) the rule is the
least time to a loss, whatever the tokens (the loss weighs a strategy's other work): to the target
(`[training] target_loss`, `--target-loss`), else to the baseline's predicted end loss (the same model
quality; tokens/s stays a column). Strategies whose times differ by less than the loss band (each
one's time band, the spread its effects' fits leave) are a tie, named as one; the least time is
picked, and an exact tie goes to the simpler strategy (`simplicity`: rebalance before quorum).

Without the loss model (`answer` without losses) the throughput rule decides (`recommend`): among
the strategies that do the baseline's work, meaning the run's
tokens within ±TOKENS_BAND of the baseline's (a strategy that trains on more tokens per sync
changes the optimisation itself, so its throughput is not comparable), take the highest
tokens/s; strategies within TIE of it are a tie, which the least idle decides, then the order
the strategies were listed in. Tokens of the whole run, not per round: sync-ddp syncs every step
with the same total work.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.engines.engine import simulate_chunks
from simulator.models.totals import RunTotals
from simulator.outputs.run_outputs import chunk_rounds
from simulator.outputs.sweep_table import timeline_metrics
from simulator.strategies import BARRIERLESS, STRATEGIES, make_plan

TOKENS_BAND = 0.05  # run tokens within ±5% of the baseline's count as the baseline's work
TIE = 0.01  # tokens/s within 1% of the best are a tie, decided by idle
ANSWER_COLUMNS = ["strategy", "round_s", "tokens_per_round", "tokens", "tokens_vs_baseline", "tokens_per_s",
                  "speedup", "idle_s", "comparable"]


@dataclass(frozen=True)
class Recommendation:
    strategy: str | None  # None: no strategy qualifies
    reason: str

    def line(self) -> str:
        return f"recommended: {self.strategy} — {self.reason}" if self.strategy else f"no recommendation: {self.reason}"


def answer_table(runs, baseline, losses: dict | None = None, bands: dict | None = None,
                 staleness: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """One row per (plan, timeline) in runs, in order, and the baseline's metrics (the ratios' reference).

    baseline = (plan, timeline) of the baseline strategy; losses: strategy -> the loss model's
    prediction (loss_end, time_to_target_s), which adds those columns; bands: strategy -> its
    error band in % (simulator/models/provenance.py), which adds band_pct; staleness: strategy -> (mean, p90)
    of its merges' staleness in global updates, which adds staleness_mean and staleness_p90.
    """
    base = timeline_metrics(*baseline)
    rows = pd.DataFrame([timeline_metrics(plan, timeline) for plan, timeline in runs])
    rows["tokens_vs_baseline"] = rows["tokens"] / base["tokens"]
    rows["speedup"] = rows["tokens_per_s"] / base["tokens_per_s"]
    rows["comparable"] = does_baseline_work(rows["tokens_vs_baseline"])
    columns = list(ANSWER_COLUMNS)
    if losses:
        for column in ("loss_end", "loss_band", "time_to_target_s", "time_band_s", "time_beyond_run", "target_loss"):
            rows[column] = [losses[s].get(column, float("nan")) for s in rows["strategy"]]
        rows["uncalibrated"] = [", ".join(losses[s].get("uncalibrated", ())) for s in rows["strategy"]]
        columns += ["loss_end", "loss_band", "time_to_target_s", "time_band_s", "time_beyond_run", "target_loss",
                    "uncalibrated"]
    if staleness:
        rows["staleness_mean"] = [staleness[s][0] for s in rows["strategy"]]
        rows["staleness_p90"] = [staleness[s][1] for s in rows["strategy"]]
        columns += ["staleness_mean", "staleness_p90"]
    if bands:
        rows["band_pct"] = [bands[s] for s in rows["strategy"]]
        columns.append("band_pct")
    return rows[columns], base


def recommend_by_target(table: pd.DataFrame, base: dict, target: float, implicit: bool = False) -> Recommendation:
    """The least predicted time to the target loss; those within the loss band of it a tie (module docstring)."""
    goal = (f"the baseline's predicted loss at its last token, {target:.3f} (the same model quality)" if implicit
            else f"loss {target:g}")
    reach = table[np.isfinite(table["time_to_target_s"])]
    if reach.empty:
        low = table.loc[table["loss_end"].idxmin()]
        return Recommendation(None, f"no strategy reaches {goal} in this run (predicted); the lowest at "
                                    f"the end is {low['strategy']}'s {low['loss_end']:.3f}: more rounds, or a "
                                    "higher target")
    best = reach["time_to_target_s"].min()
    exact = reach[reach["time_to_target_s"] <= best * (1 + 1e-12)]
    pick = exact.loc[exact["strategy"].map(simplicity).idxmin()]  # an exact tie: the simpler
    band = reach["time_band_s"].fillna(0.0) if "time_band_s" in reach else 0.0 * reach["time_to_target_s"]
    tied = reach[reach["time_to_target_s"] - best <= np.maximum(band, float(band[pick.name]))]
    why = f"ranked by the predicted time to {goal}: {pick['time_to_target_s']:,.1f} s"
    if len(tied) > 1:
        why += f" (a tie within the loss band: {' ≈ '.join(tied['strategy'])}"
        why += (f"; equal times: {pick['strategy']}, the simpler)" if len(exact) > 1 else
                f"; {pick['strategy']} the least time)")
    if pick.get("time_beyond_run", False):
        why += " (beyond the simulated rounds, carried on at its mean tokens/s)"
    if "baseline" in set(table["strategy"]) and pick["strategy"] != "baseline":
        b = table[table["strategy"] == "baseline"].iloc[0]
        why += (f", {pick['time_to_target_s'] / b['time_to_target_s']:.2f}× the baseline's"
                if np.isfinite(b["time_to_target_s"]) else ", the baseline never reaches it")
    why += f"; {pick['tokens_per_s']:,.0f} tokens/s, {pick['speedup']:.2f}× the baseline's"
    if pick.get("uncalibrated", ""):
        why += f" (its loss assumes no effect of {pick['uncalibrated']}: not calibrated)"
    fastest = table.loc[table["tokens_per_s"].idxmax()]
    if fastest["strategy"] != pick["strategy"]:
        when = fastest["time_to_target_s"]
        why += (f"; {fastest['strategy']} has the most tokens/s ({fastest['speedup']:.2f}×) but reaches the loss "
                + (f"at {when:,.1f} s" if np.isfinite(when) else "never"))
    return Recommendation(str(pick["strategy"]), why)


def simplicity(strategy: str) -> int:
    """The order of the registries (barrier strategies, then those without: rebalance before quorum); an
    unknown name (a test's) after them all."""
    order = [*STRATEGIES, *BARRIERLESS]
    return order.index(strategy) if strategy in order else len(order)


def recommend(table: pd.DataFrame, base: dict, target: float | None = None) -> Recommendation:
    """The rule of the module docstring, with its reason in words and numbers."""
    if target is not None and "time_to_target_s" in table:
        return recommend_by_target(table, base, target)
    if "target_loss" in table and np.isfinite(table["target_loss"].astype(float)).any():
        # times to the baseline's loss at its last token (loss_prediction.at_baseline_loss), listed or not
        return recommend_by_target(table, base, float(table["target_loss"].dropna().iloc[0]), implicit=True)
    band = f"run tokens within ±{TOKENS_BAND:.0%}"
    comparable = table[table["comparable"]]
    if comparable.empty:
        return Recommendation(None, f"no strategy here does the baseline's work ({band} of the baseline's); "
                                    f"compare tokens/s by hand")
    best_rate = comparable["tokens_per_s"].max()
    tied = comparable[comparable["tokens_per_s"] >= best_rate * (1 - TIE)]
    pick = tied.loc[tied["idle_s"].idxmin()] if len(tied) > 1 else tied.iloc[0]
    if len(tied) > 1:
        others = ", ".join(s for s in tied["strategy"] if s != pick["strategy"])
        why = (f"least idle of the fastest doing the baseline's work ({band}; "
               f"{others} within {TIE:.0%} of its tokens/s)")
    elif len(comparable) > 1:
        why = f"most tokens/s of those doing the baseline's work ({band})"
    else:
        why = f"the only one doing the baseline's work ({band})"
    why += (f": {pick['tokens_per_s']:,.0f} tokens/s, {pick['speedup']:.2f}× the baseline's; "
            f"idle {pick['idle_s']:.2f} s against {base['idle_s']:.2f} s")
    faster = table[~table["comparable"] & (table["tokens_per_s"] > pick["tokens_per_s"])]
    if not faster.empty:
        top = faster.loc[faster["tokens_per_s"].idxmax()]
        why += (f"; {top['strategy']} is faster ({top['speedup']:.2f}×) but trains on "
                f"{top['tokens_vs_baseline']:.2f}× the baseline's tokens")
    return Recommendation(str(pick["strategy"]), why)


def format_table(table: pd.DataFrame) -> str:
    """The compact per-strategy table (one line each)."""
    width = max(8, *(len(s) for s in table["strategy"]))
    head = (f"{'strategy':<{width}}  {'round_s':>9}  {'tokens/round':>12}  {'run tokens/base':>15} "
            f"{'tokens/s':>11}  {'speed-up':>8}  {'idle_s':>10}")
    losses = "loss_end" in table
    if losses:
        head += f"  {'loss_end':>15}  {'to_target_s':>11}"
    stale = "staleness_mean" in table
    if stale:
        head += f"  {'stale mean/p90':>14}"
    if "band_pct" in table:
        head += f"  {'band':>6}"
    lines = [head]
    for r in table.itertuples():
        line = (f"{r.strategy:<{width}}  {r.round_s:>9.2f}  {r.tokens_per_round:>12,}  "
                f"{r.tokens_vs_baseline:>14.3f}{' ' if r.comparable else '*'} {r.tokens_per_s:>11,.0f}  "
                f"{r.speedup:>7.2f}×  {r.idle_s:>10.2f}")
        if losses:
            reach = r.time_to_target_s
            loss = f"{r.loss_end:.3f}" + (f" ±{r.loss_band:.3f}" if np.isfinite(r.loss_band) else "")
            line += f"  {loss:>15}  " + (f"{'-':>11}" if np.isnan(reach) else
                                                 f"{'never':>11}" if np.isinf(reach) else f"{reach:>11,.1f}")
        if stale:
            line += f"  {f'{r.staleness_mean:.2f}/{r.staleness_p90:.1f}':>14}"
        if "band_pct" in table:
            line += f"  {'±' + format(r.band_pct, '.0f') + '%':>6}"
        lines.append(line)
    return "\n".join(lines)


def format_answer(table: pd.DataFrame, base: dict, target: float | None = None, loss_note: str = "",
                  band_note: str = "") -> str:
    notes = [(f"round_s: wall time / rounds; run tokens/base: the whole run's tokens / the baseline's (*: beyond "
             f"±{TOKENS_BAND:.0%}, other work);"), "idle_s: barrier idle summed over nodes and rounds"]
    if "loss_end" in table:
        notes.append("loss_end: predicted training loss at the end (mean of the last rounds) ± its band; to_target_s: "
                     + (f"wall-clock seconds to loss {target:g}" if target is not None else
                        "wall-clock seconds to the baseline's predicted loss at its last token (no target_loss given)"))
        if loss_note:
            notes.append(loss_note)
    if "staleness_mean" in table:
        notes.append("without a barrier (async, quorum): idle_s is the wait in the server's queue (async) or for the "
                     "round's close (quorum); stale mean/p90: global updates applied between a node's pull and its "
                     "merge (0 with a barrier)")
    if band_note:
        notes.append(band_note)
    if base["strategy"] not in set(table["strategy"]):
        notes.append(f"baseline (for the ratios): {base['tokens_per_s']:,.0f} tokens/s, idle {base['idle_s']:.2f} s")
    return "\n".join([format_table(table), *notes, recommend(table, base, target).line()])


def answer(scenario, runs, engine: str = "simpy", losses: dict | None = None, target: float | None = None,
           loss_note: str = "", bands: dict | None = None, band_note: str = "", staleness: dict | None = None) -> str:
    """The text `geodt simulate` ends with; runs = [(plan, timeline or its RunTotals)], the baseline
    simulated if absent; losses: the loss model's predictions per strategy, bands: their error
    bands (answer_table), band_note: the line saying what the bands rest on; staleness: (mean, p90) per
    strategy, shown where a strategy has no barrier."""
    baseline = next(((p, t) for p, t in runs if p.strategy == "baseline"), None)
    if baseline is None:  # its totals only, chunk by chunk: no whole timeline of a long run in memory
        plan = make_plan(scenario, "baseline")
        totals = RunTotals()
        simulate_chunks(scenario, plan, engine, lambda timeline, _: totals.add(timeline),
                        chunk_rounds(len(plan.nodes), 1))
        baseline = (plan, totals)
    return format_answer(*answer_table(runs, baseline, losses, bands, staleness), target, loss_note, band_note)


def does_baseline_work(run_tokens_vs_baseline):
    """The `comparable` rule: a run whose tokens (the whole run's, over the baseline's) are within
    ±TOKENS_BAND of the baseline's does its work; beyond, it does other work, and its speed-up is not
    like for like. One rule for `geodt simulate`'s answer and `geodt sweep`'s outputs (sweep.csv,
    table.csv and what they print): an array (or Series) of ratios to one of booleans."""
    return np.abs(np.asarray(run_tokens_vs_baseline, dtype=float) - 1) <= TOKENS_BAND
