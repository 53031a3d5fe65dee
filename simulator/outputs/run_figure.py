"""`geodt simulate`'s and `geodt plan`'s idle.png: where each node waits, per strategy, and when.

Top: each node's idle seconds over the whole run, a bar per strategy (the totals of summary.csv).
Below: the first rounds of one or two plans as a timeline per node (compute, then waiting for the
slowest node, then the sync), like a Gantt chart; with several strategies, the first given and
the one that idles least. Rows of the timeline are timeline.csv's (compute_s, idle_s, comm_s from
round_start_s): a Streaming DiLoCo round's syncs overlap its compute, so there the bars show the
round's sums in that order, not the overlap.

Drawn in time and memory bounded whatever the node count: each colour of the timeline is one
PolyCollection (not a patch per node-segment), and above SHOWN_NODES_MAX nodes the figure shows
only the EDGE_NODES slowest and EDGE_NODES fastest nodes (the bars: by the first strategy's idle,
least idle the slowest; each Gantt panel: by compute in its rounds), plus a panel of the
distribution over every node (a box per strategy), and says so in its titles. summary.csv and
the timeline keep every node.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.outputs.outputs import agg_figure, laid_out_png

GANTT_ROUNDS = 3  # rounds drawn in the timeline: enough to see the pattern repeat
PARTS = (("compute_s", "compute", "tab:blue"), ("idle_s", "idle (waiting)", "tab:red"), ("comm_s", "sync", "tab:gray"))
SHOWN_NODES_MAX = 32  # up to this many nodes, every node is drawn; above, the edges and a distribution
EDGE_NODES = 8  # above SHOWN_NODES_MAX: this many slowest and this many fastest nodes


def idle_figure(runs: list[tuple[str, list[str], np.ndarray, pd.DataFrame]]) -> bytes:
    """PNG bytes from (strategy, node names, idle seconds per node, the run's first rounds'
    timeline rows) per strategy. No timestamp or software tag: the same inputs give the same bytes."""
    return laid_out_png(idle_figure_axes(runs, layout=False))


def edge_nodes(idle_s: np.ndarray, edge: int = EDGE_NODES) -> np.ndarray:
    """Indices of the `edge` slowest nodes (least idle: the others wait for them), then the `edge`
    fastest (most idle), each group in that order; every index when there are at most 2 x edge.
    Ties keep the nodes' order (stable sort)."""
    idle_s = np.asarray(idle_s, dtype=float)
    order = np.argsort(idle_s, kind="stable")
    if len(order) <= 2 * edge:
        return order
    return np.concatenate([order[:edge], order[-edge:]])


def idle_figure_axes(runs: list[tuple[str, list[str], np.ndarray, pd.DataFrame]], layout: bool = True):
    """The matplotlib figure of idle_figure (for tests: its axes, titles and artists); layout: tight_layout
    applied (idle_figure lays it out itself, as it writes it)."""
    from matplotlib import colormaps  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn

    shown = _gantt_runs(runs)
    nodes = list(runs[0][1])
    summarised = len(nodes) > SHOWN_NODES_MAX
    picked = edge_nodes(runs[0][2]) if summarised else np.arange(len(nodes))
    rows = len(picked)
    height_ratios = [1.2] + ([1.0] if summarised else []) + [0.4 + 0.06 * rows] * len(shown)
    fig = agg_figure(figsize=(9, 1.2 + 2.4 * sum(height_ratios)), dpi=100)
    axes = fig.subplots(len(height_ratios), 1, squeeze=False, height_ratios=height_ratios)
    colors = colormaps["tab20"].colors
    _bars(axes[0, 0], runs, [nodes[i] for i in picked], colors, len(nodes) if summarised else 0)
    if summarised:
        _distribution(axes[1, 0], runs, colors)
    for ax, (strategy, names, _, head) in zip(axes[1 + summarised:, 0], shown):
        _gantt(ax, strategy, list(names), _first_rounds(head), summarised)
    if layout:
        fig.tight_layout()
    return fig


def _gantt_runs(runs):
    if len(runs) == 1:
        return runs
    least = min(runs, key=lambda r: float(np.sum(r[2])))
    return [runs[0]] if least is runs[0] else [runs[0], least]


def _bars(ax, runs, nodes: list[str], colors, of_nodes: int) -> None:
    """Idle per node per strategy for `nodes` (of_nodes > 0: the edges of that many, said in the title)."""
    width = 0.8 / len(runs)
    where = {name: k for k, name in enumerate(nodes)}
    for i, (strategy, names, idle_s, _) in enumerate(runs):
        keep = [(where[n], v) for n, v in zip(names, np.asarray(idle_s, dtype=float)) if n in where]
        x = np.array([k for k, _ in keep], dtype=float) + (i - (len(runs) - 1) / 2) * width
        ax.bar(x, [v for _, v in keep], width, label=strategy, color=colors[i % len(colors)])
    ax.set_xticks(np.arange(len(nodes)), nodes, fontsize=7, rotation=30 if len(nodes) > 8 else 0)
    ax.set_ylabel("idle over the run (s)")
    title = "idle per node, per strategy"
    if of_nodes:
        half = len(nodes) // 2
        title += (f":\nthe {half} slowest (least idle) and {len(nodes) - half} fastest (most idle) of {of_nodes:,} "
                  f"nodes by {runs[0][0]}'s idle (every node: below, and in summary.csv)")
        ax.axvline(half - 0.5, color="black", lw=0.8, ls=":")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside: over the bars it hid some
    ax.grid(axis="y", alpha=0.3)


def _distribution(ax, runs, colors) -> None:
    """Every node's idle, a box per strategy (whiskers: min and max), so no node goes unseen."""
    data = [np.asarray(idle_s, dtype=float) for _, _, idle_s, _ in runs]
    box = ax.boxplot(data, whis=(0, 100), showfliers=False, patch_artist=True, medianprops={"color": "black"})
    for i, patch in enumerate(box["boxes"]):
        patch.set_facecolor(colors[i % len(colors)])
    ax.set_xticks(np.arange(1, len(runs) + 1), [r[0] for r in runs], fontsize=7, rotation=30 if len(runs) > 6 else 0)
    ax.set_ylabel("idle over the run (s)")
    ax.set_title(f"idle of all {len(runs[0][1]):,} nodes, per strategy (box: quartiles and median, whiskers: "
                 "min and max)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)


def _first_rounds(head: pd.DataFrame) -> pd.DataFrame:
    return head[head["round"].to_numpy() < head["round"].min() + GANTT_ROUNDS]


def _gantt(ax, strategy: str, names: list[str], rows: pd.DataFrame, summarised: bool) -> None:
    """The rounds in `rows` per node, one PolyCollection per part; summarised: only the EDGE_NODES
    nodes that compute most in these rounds (the slowest), then the EDGE_NODES that compute least."""
    # deferred: matplotlib (~0.5 s) only when a figure is drawn
    from matplotlib.collections import PolyCollection  # noqa: PLC0415

    node = rows["node"].astype(str).to_numpy()
    if summarised:
        compute = pd.Series(rows["compute_s"].to_numpy(dtype=float)).groupby(node).sum()
        compute = compute.reindex(names, fill_value=0.0).to_numpy()
        shown = [names[i] for i in edge_nodes(-compute)]
    else:
        shown = names
    y = pd.Series(node).map(pd.Series(np.arange(len(shown)), index=pd.Index(shown, dtype=object)))
    keep = y.notna().to_numpy()
    rows, y = rows[keep], y[keep].to_numpy(dtype=float)
    start = rows["round_start_s"].to_numpy(dtype=float)
    for column, label, color in PARTS:
        x0, x1, y0, y1 = start, start + rows[column].to_numpy(dtype=float), y - 0.35, y + 0.35
        verts = np.stack([np.stack([x0, y0], 1), np.stack([x0, y1], 1), np.stack([x1, y1], 1),
                          np.stack([x1, y0], 1)], axis=1)
        ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none", label=label))
        start = x1
    if len(rows) and start.max() > rows["round_start_s"].min():
        ax.set_xlim(float(rows["round_start_s"].min()), float(start.max()))
    ax.set_ylim(len(shown) - 0.5, -0.5)  # the first name on top
    ax.set_yticks(range(len(shown)), shown, fontsize=7)
    ax.set_xlabel("time (s, simulated)")
    title = f"{strategy}: the first {rows['round'].nunique()} rounds"
    if summarised:
        title += (f", its {EDGE_NODES} slowest (most compute) and {EDGE_NODES} fastest of {len(names):,} nodes"
                  if len(shown) < len(names) else "")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
