"""`geodt simulate`'s and `geodt plan`'s idle.png: where each node waits, per strategy, and when.

Left: each node's idle seconds over the whole run, a bar per strategy (the totals of summary.csv).
Right: the first rounds of one or two plans as a timeline per node (compute, then waiting for the
slowest node, then the sync), like a Gantt chart; with several strategies, the first given and
the one that idles least. Rows of the timeline are timeline.csv's (compute_s, idle_s, comm_s from
round_start_s): a Streaming DiLoCo round's syncs overlap its compute, so there the bars show the
round's sums in that order, not the overlap.
"""
from __future__ import annotations

import io

import numpy as np
import pandas as pd

GANTT_ROUNDS = 3  # rounds drawn in the timeline: enough to see the pattern repeat
PARTS = (("compute_s", "compute", "tab:blue"), ("idle_s", "idle (waiting)", "tab:red"), ("comm_s", "sync", "tab:gray"))


def idle_figure(runs: list[tuple[str, list[str], np.ndarray, pd.DataFrame]]) -> bytes:
    """PNG bytes from (strategy, node names, idle seconds per node, the run's first rounds'
    timeline rows) per strategy. No timestamp or software tag: the same inputs give the same bytes."""
    # lazy: startup time (matplotlib)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = _gantt_runs(runs)
    nodes = runs[0][1]
    height = max(3.2, 0.9 + 0.28 * len(nodes) * len(shown))
    fig, axes = plt.subplots(1 + len(shown), 1, figsize=(9, height + 0.35 * len(nodes) * len(runs) ** 0.5),
                             dpi=100, squeeze=False, height_ratios=[1.2] + [1] * len(shown))
    _bars(axes[0, 0], runs, plt.get_cmap("tab20").colors)
    for ax, (strategy, names, _, head) in zip(axes[1:, 0], shown):
        _gantt(ax, strategy, names, head)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _gantt_runs(runs):
    if len(runs) == 1:
        return runs
    least = min(runs, key=lambda r: float(np.sum(r[2])))
    return [runs[0]] if least is runs[0] else [runs[0], least]


def _bars(ax, runs, colors) -> None:
    nodes = runs[0][1]
    width = 0.8 / len(runs)
    x = np.arange(len(nodes))
    for i, (strategy, names, idle_s, _) in enumerate(runs):
        where = {name: k for k, name in enumerate(nodes)}
        ax.bar([where.get(n, 0) + (i - (len(runs) - 1) / 2) * width for n in names], idle_s, width,
               label=strategy, color=colors[i % len(colors)])
    ax.set_xticks(x, nodes, fontsize=7, rotation=30 if len(nodes) > 8 else 0)
    ax.set_ylabel("idle over the run (s)")
    ax.set_title("idle per node, per strategy", fontsize=10)
    ax.legend(fontsize=7, ncol=min(len(runs), 5))
    ax.grid(axis="y", alpha=0.3)


def _gantt(ax, strategy: str, names: list[str], head: pd.DataFrame) -> None:
    rows = head[head["round"] < head["round"].min() + GANTT_ROUNDS]
    for y, name in enumerate(names):
        mine = rows[rows["node"].astype(str) == name]
        start = mine["round_start_s"].to_numpy(dtype=float)
        for column, label, color in PARTS:
            width = mine[column].to_numpy(dtype=float)
            ax.barh(y, width, left=start, color=color, height=0.7, label=label if y == 0 else None)
            start = start + width
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s, simulated)")
    ax.set_title(f"{strategy}: the first {rows['round'].nunique()} rounds", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
