"""Figures of a sweep (PNG): idle left per strategy, and which strategy wins where.

idle_left.png: per strategy, a box plot over scenarios of the idle that remains at the
baseline's token count, as a % of the baseline's idle (log scale; scenarios whose baseline
has no idle, all nodes alike, are left out and counted in the title); medians marked and labelled.
winners.png: a table-like heatmap, per bandwidth (columns): the % (and count) of scenarios each
strategy wins in each heterogeneity bin (the slowest node's step time over the fastest's at the
baseline batch); top row by tokens per second, bottom row by idle at the baseline's token count.
speedup.png: tokens per second over the baseline's, per strategy and bandwidth (log axis labelled at
1, 2 and 5 times each power of ten). In speedup.png and winners.png a strategy doing other work in
some scenarios (sweep.csv's `comparable` false) is named with a *, as in the findings.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.outputs.outputs import save_figure
from simulator.sweep.sweep_dataset import stats_of, winners  # noqa: F401 (winners: the rule, kept importable here)
from simulator.sweep.sweep_summary import OTHER_WORK_NOTE

HETERO_BINS = [1.0, 1.001, 1.5, 3.0, 10.0, np.inf]
HETERO_LABELS = ["alike", "<1.5x", "1.5-3x", "3-10x", ">10x"]


def _plt():
    import matplotlib  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn
    return plt


def _save(fig, path: Path) -> Path:
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def _colors(strategies) -> dict:
    cmap = _plt().get_cmap("tab10")
    return {s: cmap(i % 10) for i, s in enumerate(strategies)}


def idle_left_figure(data, path: Path) -> Path:
    """From sweep.csv loaded or its SweepStats (simulator/sweep/sweep_dataset.py), as every figure here."""
    plt = _plt()
    stats = stats_of(data)
    strategies = stats.strategies
    dropped = stats.baseline_no_idle
    floor = 1e-4
    known = {s: v[~np.isnan(v)] for s, v in stats.idle_left.items()}
    data = [np.clip(known[s] * 100, floor * 100, None) for s in strategies]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    # light box fills (one colour per strategy) under a black median bar with a white-edged diamond,
    # so the median reads on every box whatever its colour; its value is written beside it
    box = ax.boxplot(data, tick_labels=strategies, whis=(5, 95), showfliers=False, patch_artist=True,
                     medianprops={"color": "black", "lw": 2.2})
    for patch, s in zip(box["boxes"], strategies):
        patch.set_facecolor(_colors(strategies)[s])
        patch.set_alpha(0.35)
    for i, d in enumerate(data, start=1):
        if len(d):
            med = float(np.median(d))
            ax.plot([i], [med], marker="D", ms=5, color="black", mec="white", mew=0.8, zorder=5)
            ax.annotate(f"{med:.3g}%", (i + 0.25, med), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7.5, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    ax.set_yscale("log")
    ax.axhline(100, color="gray", lw=1, ls="--")
    ax.set_ylabel("idle left, % of baseline's\n(at the baseline's token count; log scale)")
    ax.set_title(f"Idle reduction vs baseline: {stats.scenarios_with_idle} scenarios "
                 f"(boxes: quartiles, whiskers: 5-95%, ◆ and label: median; {dropped} with no baseline idle left out;"
                 f" 0 shown at {floor * 100:g}%)", fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def winners_figure(data, path: Path) -> Path:
    """A table-like heatmap per criterion and bandwidth: % of scenarios each strategy wins, per heterogeneity bin.

    Every cell carries its number (and the count), so small shares stay readable; strategies that
    win nowhere under a criterion are left out of its row of panels and named in the title."""
    plt = _plt()
    stats = stats_of(data)
    strategies = stats.strategies
    bws = stats.bandwidths
    rows = [("tokens_per_s", "max", "most tokens/s"),
            ("idle_s_equal_tokens", "min", "least idle at equal tokens (ties: first listed; alike nodes all tie at 0)")]
    if "time_to_target_s" in stats.wins:  # geodt sweep --target-loss
        rows.append(("time_to_target_s", "min", ("earliest to the target loss (predicted; scenarios some strategy "
                                                "brings to it)")))
    hetero = {col: stats.wins[col].assign(hetero=pd.cut(stats.wins[col]["speed_ratio"], HETERO_BINS,
                                                        labels=HETERO_LABELS, right=False)) for col, _, _ in rows}
    wins = {(r, bw): hetero[col][hetero[col]["bandwidth_gbps"] == bw]
            for r, (col, best, _) in enumerate(rows) for bw in bws}
    shown = [[s for s in strategies if any((wins[(r, bw)]["strategy"] == s).any() for bw in bws)]
             for r in range(len(rows))]
    heights = [max(2, len(names)) for names in shown]
    # One subfigure per criterion, laid out by matplotlib (constrained): its heading above the
    # panels and the strategies that never win under it below them, each in space of its own,
    # whatever the number of bandwidths (hand-placed text used to overlap with two of them).
    fig = plt.figure(figsize=(4.6 * len(bws), 1.6 + 0.55 * sum(heights)), layout="constrained")
    subfigs = fig.subfigures(len(rows), 1, height_ratios=[h + 1.2 for h in heights], hspace=0.04)
    cmap = plt.get_cmap("Blues")
    for r, (_column, _best, title) in enumerate(rows):
        names = shown[r]
        axes = subfigs[r].subplots(1, len(bws), squeeze=False)[0]
        for c, bw in enumerate(bws):
            _winners_panel(axes[c], wins[(r, bw)], names, cmap, first=c == 0, marks=stats.other_work_mark)
            axes[c].set_title(f"{bw:g} Gbit/s", fontsize=9, loc="left")
            if r == len(rows) - 1:
                axes[c].set_xlabel("slowest / fastest node step time (baseline batch)", fontsize=8)
        subfigs[r].suptitle(title, x=0.01, ha="left", fontsize=10, fontweight="bold")
        never = [s for s in strategies if s not in names]
        if never:
            subfigs[r].supxlabel("never wins: " + ", ".join(never), x=0.99, ha="right", fontsize=8, color="grey")
    marked = any(stats.other_work_mark(s) for names in shown for s in names)
    fig.suptitle("Which strategy wins: % of the scenarios in each heterogeneity bin (count in brackets)"
                 + (f"\n{OTHER_WORK_NOTE}" if marked else ""), fontsize=11 if not marked else 10)
    out = _save(fig, path)
    plt.close(fig)
    return out


def _winners_panel(ax, win: pd.DataFrame, names: list[str], cmap, first: bool, marks=lambda s: "") -> None:
    """One criterion at one bandwidth: per strategy (rows) and heterogeneity bin, the % of scenarios won;
    marks(strategy): "*" where it does other work in some scenarios (the findings' mark), else ""."""
    counts = pd.crosstab(win["strategy"], win["hetero"]).reindex(
        index=names, columns=HETERO_LABELS).fillna(0).astype(int)
    totals = win["hetero"].value_counts().reindex(HETERO_LABELS).fillna(0).astype(int)
    share = counts / totals.replace(0, np.nan).to_numpy()[None, :] * 100
    ax.imshow(share.fillna(0).to_numpy(), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for y, name in enumerate(names):
        for x, label in enumerate(HETERO_LABELS):
            n, pct = counts.loc[name, label], share.loc[name, label]
            if n:
                ax.text(x, y, f"{pct:.0f}%\n({n})" if pct >= 1 else f"<1%\n({n})", ha="center",
                        va="center", fontsize=7.5, color="white" if pct > 60 else "black")
    ax.set_xticks(range(len(HETERO_LABELS)), [f"{lab}\nn={n}" for lab, n in zip(HETERO_LABELS, totals)], fontsize=8)
    ax.set_yticks(range(len(names)), [n + marks(n) for n in names] if first else [""] * len(names), fontsize=8.5)
    ax.set_xticks(np.arange(len(HETERO_LABELS) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(names) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=1.5)
    ax.tick_params(which="minor", length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def speedup_figure(data, path: Path) -> Path:
    plt = _plt()
    stats = stats_of(data)
    strategies = stats.strategies
    bws = stats.bandwidths
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(bws)
    cmap = plt.get_cmap("viridis")
    for k, bw in enumerate(bws):
        data = [stats.speedup.get((s, bw), np.zeros(0)) for s in strategies]
        pos = np.arange(len(strategies)) + (k - (len(bws) - 1) / 2) * width
        box = ax.boxplot(data, positions=pos, widths=width * 0.9, whis=(5, 95), showfliers=False, patch_artist=True,
                         medianprops={"color": "black", "lw": 2})  # black: an orange median vanishes in a yellow box
        for patch in box["boxes"]:
            patch.set_facecolor(cmap(k / max(1, len(bws) - 1)))
            patch.set_alpha(0.7)
        ax.plot([], [], color=cmap(k / max(1, len(bws) - 1)), lw=6, label=f"{bw:g} Gbit/s")
    ax.set_xticks(range(len(strategies)))
    ax.set_xticklabels([s + stats.other_work_mark(s) for s in strategies], rotation=30)
    _log_ticks(ax)
    ax.axhline(1, color="gray", lw=1, ls="--")
    ax.set_ylabel("tokens/s over the baseline's (log scale)")
    marked = any(stats.other_work.values())
    ax.set_title("Throughput vs baseline, per strategy and bandwidth (boxes: quartiles, black bar: median, "
                 "whiskers: 5-95%)" + (f"\n{OTHER_WORK_NOTE}" if marked else ""), fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def _log_ticks(ax) -> None:
    """A log y axis labelled at 1, 2 and 5 times each power of ten, as plain numbers (0.05, 0.5, 2):
    a range within a decade or two showed only 10^-1 and 10^0 before."""
    # deferred: matplotlib (~0.5 s) only when a figure is drawn
    from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: PLC0415

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def write_figures(data, out: Path) -> list[Path]:
    stats = stats_of(data)
    return [idle_left_figure(stats, out / "idle_left.png"), winners_figure(stats, out / "winners.png"),
            speedup_figure(stats, out / "speedup.png")]
