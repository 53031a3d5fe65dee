"""Figures of a sweep (PNG): idle left per strategy, and which strategy wins where.

idle_left.png: per strategy, a box plot over scenarios of the idle that remains at the
baseline's token count, as a % of the baseline's idle (log scale; scenarios whose baseline
has no idle, all nodes alike, are left out and counted in the title).
winners.png: the share of scenarios each strategy wins, by bandwidth (columns) and by
heterogeneity (x: the slowest node's step time over the fastest's at the baseline batch);
top row by tokens per second, bottom row by idle at the baseline's token count.
speedup.png: tokens per second over the baseline's, per strategy and bandwidth.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.outputs import save_figure

HETERO_BINS = [1.0, 1.001, 1.5, 3.0, 10.0, np.inf]
HETERO_LABELS = ["alike", "<1.5x", "1.5-3x", "3-10x", ">10x"]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def _colors(strategies) -> dict:
    cmap = _plt().get_cmap("tab10")
    return {s: cmap(i % 10) for i, s in enumerate(strategies)}


def idle_left_figure(frame: pd.DataFrame, path: Path) -> Path:
    plt = _plt()
    strategies = list(dict.fromkeys(frame["strategy"]))
    have = frame[frame["idle_left"].notna()]
    dropped = frame.loc[frame["strategy"] == "baseline", "idle_left"].isna().sum()
    floor = 1e-4
    data = [np.clip(have.loc[have["strategy"] == s, "idle_left"].to_numpy() * 100, floor * 100, None)
            for s in strategies]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    box = ax.boxplot(data, tick_labels=strategies, whis=(5, 95), showfliers=False, patch_artist=True)
    for patch, s in zip(box["boxes"], strategies):
        patch.set_facecolor(_colors(strategies)[s])
        patch.set_alpha(0.6)
    for i, d in enumerate(data, start=1):
        if len(d):
            ax.text(i, np.median(d) * 1.25, f"{np.median(d):.3g}%", ha="center", fontsize=8)
    ax.set_yscale("log")
    ax.axhline(100, color="gray", lw=1, ls="--")
    ax.set_ylabel("idle left, % of baseline's\n(at the baseline's token count; log scale)")
    ax.set_title(f"Idle reduction vs baseline: {have['scenario_id'].nunique()} scenarios "
                 f"(boxes: quartiles, whiskers: 5-95%; {dropped} with no baseline idle left out;"
                 f" 0 shown at {floor * 100:g}%)", fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def _winners(frame: pd.DataFrame, column: str, best: str) -> pd.DataFrame:
    """One row per scenario: its winner by `column` (ties: the first strategy in the table's order)."""
    order = {s: i for i, s in enumerate(dict.fromkeys(frame["strategy"]))}
    ranked = frame.assign(_o=frame["strategy"].map(order))
    ranked = ranked.sort_values(["scenario_id", column, "_o"], ascending=[True, best == "min", True])
    return ranked.groupby("scenario_id", sort=True).head(1)


def winners_figure(frame: pd.DataFrame, path: Path) -> Path:
    plt = _plt()
    strategies = list(dict.fromkeys(frame["strategy"]))
    colors = _colors(strategies)
    bws = sorted(frame["bandwidth_gbps"].unique())
    frame = frame.assign(hetero=pd.cut(frame["speed_ratio"], HETERO_BINS, labels=HETERO_LABELS, right=False))
    rows = [("tokens_per_s", "max", "fastest (tokens/s)"),
            ("idle_s_equal_tokens", "min", "least idle at equal tokens\n(ties go to the first strategy listed: alike nodes all tie at 0)")]
    fig, axes = plt.subplots(len(rows), len(bws), figsize=(4.2 * len(bws), 7.5), sharey=True, squeeze=False)
    for r, (column, best, title) in enumerate(rows):
        for c, bw in enumerate(bws):
            ax = axes[r, c]
            win = _winners(frame[frame["bandwidth_gbps"] == bw], column, best)
            share = pd.crosstab(win["hetero"], win["strategy"], normalize="index").reindex(
                index=HETERO_LABELS, columns=strategies).fillna(0)
            counts = win["hetero"].value_counts().reindex(HETERO_LABELS).fillna(0).astype(int)
            bottom = np.zeros(len(share))
            for s in strategies:
                if share[s].sum() > 0:
                    ax.bar(range(len(share)), share[s], bottom=bottom, color=colors[s], label=s)
                    bottom += share[s].to_numpy()
            ax.set_xticks(range(len(share)))
            ax.set_xticklabels([f"{lab}\nn={n}" for lab, n in zip(HETERO_LABELS, counts)], fontsize=8)
            ax.set_title(f"{bw:g} Gbit/s: {title}", fontsize=9)
            if c == 0:
                ax.set_ylabel("share of scenarios won")
            if r == len(rows) - 1:
                ax.set_xlabel("slowest / fastest node step time (baseline batch)", fontsize=8)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend([handles[s] for s in strategies if s in handles], [s for s in strategies if s in handles],
               loc="lower center", ncol=min(6, len(handles)), fontsize=8, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Which strategy wins, by bandwidth and heterogeneity", fontsize=11)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out = _save(fig, path)
    plt.close(fig)
    return out


def speedup_figure(frame: pd.DataFrame, path: Path) -> Path:
    plt = _plt()
    strategies = list(dict.fromkeys(frame["strategy"]))
    bws = sorted(frame["bandwidth_gbps"].unique())
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(bws)
    cmap = plt.get_cmap("viridis")
    for k, bw in enumerate(bws):
        sub = frame[frame["bandwidth_gbps"] == bw]
        data = [sub.loc[sub["strategy"] == s, "speedup"].to_numpy() for s in strategies]
        pos = np.arange(len(strategies)) + (k - (len(bws) - 1) / 2) * width
        box = ax.boxplot(data, positions=pos, widths=width * 0.9, whis=(5, 95), showfliers=False, patch_artist=True)
        for patch in box["boxes"]:
            patch.set_facecolor(cmap(k / max(1, len(bws) - 1)))
            patch.set_alpha(0.7)
        ax.plot([], [], color=cmap(k / max(1, len(bws) - 1)), lw=6, label=f"{bw:g} Gbit/s")
    ax.set_xticks(range(len(strategies)))
    ax.set_xticklabels(strategies, rotation=30)
    ax.set_yscale("log")
    ax.axhline(1, color="gray", lw=1, ls="--")
    ax.set_ylabel("tokens/s over the baseline's (log scale)")
    ax.set_title("Throughput vs baseline, per strategy and bandwidth (boxes: quartiles, whiskers: 5-95%)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def write_figures(frame: pd.DataFrame, out: Path) -> list[Path]:
    return [idle_left_figure(frame, out / "idle_left.png"), winners_figure(frame, out / "winners.png"),
            speedup_figure(frame, out / "speedup.png")]
