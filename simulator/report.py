"""The answer `geodt simulate` ends with: every strategy side by side, and which one to use and why.

Per strategy (metrics of `simulator.sweep_table.timeline_metrics`, the same as `geodt sweep --table`):
round_s = wall time / rounds; tokens_per_round (all nodes); tokens_per_s = the run's tokens /
wall time; speedup = tokens_per_s / the baseline's; idle_s = barrier idle summed over nodes and
rounds (docs/DESIGN.md, "Time accounting").

The rule (`recommend`): among the strategies that do the baseline's work, meaning the run's
tokens within ±TOKENS_BAND of the baseline's (a strategy that trains on more tokens per sync
changes the optimisation itself, so its throughput is not comparable), take the highest
tokens/s; strategies within TIE of it are a tie, which the least idle decides, then the order
the strategies were listed in. Tokens of the whole run, not per round: sync-ddp syncs every step
with the same total work.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from simulator.sweep_table import timeline_metrics

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


def answer_table(runs, baseline) -> tuple[pd.DataFrame, dict]:
    """One row per (plan, timeline) in runs, in order, and the baseline's metrics (the ratios' reference).

    baseline = (plan, timeline) of the baseline strategy.
    """
    base = timeline_metrics(*baseline)
    rows = pd.DataFrame([timeline_metrics(plan, timeline) for plan, timeline in runs])
    rows["tokens_vs_baseline"] = rows["tokens"] / base["tokens"]
    rows["speedup"] = rows["tokens_per_s"] / base["tokens_per_s"]
    rows["comparable"] = (rows["tokens_vs_baseline"] - 1).abs() <= TOKENS_BAND
    return rows[ANSWER_COLUMNS], base


def recommend(table: pd.DataFrame, base: dict) -> Recommendation:
    """The rule of the module docstring, with its reason in words and numbers."""
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
    lines = [head]
    for r in table.itertuples():
        lines.append(f"{r.strategy:<{width}}  {r.round_s:>9.2f}  {r.tokens_per_round:>12,}  "
                     f"{r.tokens_vs_baseline:>14.3f}{' ' if r.comparable else '*'} {r.tokens_per_s:>11,.0f}  "
                     f"{r.speedup:>7.2f}×  {r.idle_s:>10.2f}")
    return "\n".join(lines)


def format_answer(table: pd.DataFrame, base: dict) -> str:
    notes = [f"round_s: wall time / rounds; run tokens/base: the whole run's tokens / the baseline's (*: beyond "
             f"±{TOKENS_BAND:.0%}, other work);", "idle_s: barrier idle summed over nodes and rounds"]
    if base["strategy"] not in set(table["strategy"]):
        notes.append(f"baseline (for the ratios): {base['tokens_per_s']:,.0f} tokens/s, idle {base['idle_s']:.2f} s")
    return "\n".join([format_table(table), *notes, recommend(table, base).line()])


def answer(scenario, runs, engine: str = "simpy") -> str:
    """The text `geodt simulate` ends with; runs = [(plan, timeline or its RunTotals)], the baseline
    simulated if absent."""
    baseline = next(((p, t) for p, t in runs if p.strategy == "baseline"), None)
    if baseline is None:  # its totals only, chunk by chunk: no whole timeline of a long run in memory
        from simulator.engine import simulate_chunks
        from simulator.run_outputs import chunk_rounds
        from simulator.strategies import make_plan
        from simulator.totals import RunTotals

        plan = make_plan(scenario, "baseline")
        totals = RunTotals()
        simulate_chunks(scenario, plan, engine, lambda timeline, _: totals.add(timeline),
                        chunk_rounds(len(plan.nodes), 1))
        baseline = (plan, totals)
    return format_answer(*answer_table(runs, baseline))
