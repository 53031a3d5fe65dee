"""The figures of `geodt paper`, each returned as PNG bytes (stable: no software tag, no timestamps).

matplotlib is imported inside the functions (Agg backend), so importing this module is cheap.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from geodt.paper import facts
from geodt.paper.related import BatchFit, ShareCurves
from simulator.outputs.outputs import figure_bytes

DPI = 110
PAPER_COLOR, INFERRED_COLOR, CATALOG_COLOR = "#444444", "#1f77b4", "#d62728"
LONO_COLOR, CATALOG_BF16_COLOR = "#6baed6", "#8c564b"
COMPUTE_COLOR, IDLE_COLOR, SYNC_COLOR = "#2ca02c", "#ff7f0e", "#9467bd"


def agg_pyplot():
    """matplotlib.pyplot on the Agg backend (no display), with the figures' shared style."""
    # deferred: matplotlib (~0.5 s) only when a figure is drawn; geodt paper --help reads without it
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    # deferred: matplotlib (~0.5 s) only when a figure is drawn; geodt paper --help reads without it
    import matplotlib.pyplot as plt  # noqa: PLC0415
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "figure.titlesize": 13,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (deterministic: figure_bytes), then closed."""
    data = figure_bytes(fig, dpi=DPI)
    agg_pyplot().close(fig)
    return data


def _bar_labels(ax, bars, values, fmt="{:.1f}"):
    for bar, v in zip(bars, values):
        ax.annotate(fmt.format(v), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7)


def idle_per_node(table3: pd.DataFrame, c_checks: pd.DataFrame) -> bytes:
    """Idle per node and paper strategy. Top: the paper beside the inferred step times (linear;
    in-sample rows marked, C's leave-one-node-out prediction added). Bottom: the paper beside the
    catalog estimate in fp16 and bf16, on a log scale so that both the paper's seconds and the
    catalog's hundreds of seconds stay readable."""
    plt = agg_pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(15, 8.4))
    status = {"baseline": "in-sample: defines the step times", "A": "predicted",
              "B": "predicted (paper's batches 8 8 32 16)", "C": "in-sample: t_max fitted on it"}
    lono = c_checks.set_index("node")["lono_idle_s"]
    floor = 0.05
    for c, strategy in enumerate(facts.PAPER_STRATEGIES):
        part = table3[table3["strategy"] == strategy]
        x = np.arange(len(part))
        # top row: paper vs inferred (+ leave-one-node-out on C)
        ax = axes[0, c]
        series = [(part["paper_idle_s"], PAPER_COLOR, None), (part["inferred_idle_s"], INFERRED_COLOR, None)]
        if strategy == "C":
            series.append((lono.reindex(part["node"]).to_numpy(), LONO_COLOR, "//"))
        width = 0.8 / len(series)
        for k, (values, color, hatch) in enumerate(series):
            bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, values, width, color=color, hatch=hatch,
                          edgecolor="white" if hatch else None)
            _bar_labels(ax, bars, values)
        ax.set_xticks(x, part["node"])
        ax.set_title(f"{strategy}: {status[strategy]}", fontsize=9.5)
        ax.margins(y=0.15)
        # bottom row: paper vs catalog fp16 / bf16, log scale
        ax = axes[1, c]
        series = [(part["paper_idle_s"], PAPER_COLOR, None), (part["catalog_idle_s"], CATALOG_COLOR, None),
                  (part["catalog_bf16_idle_s"], CATALOG_BF16_COLOR, "xx")]
        width = 0.8 / len(series)
        for k, (values, color, hatch) in enumerate(series):
            values = np.asarray(values, float)
            bars = ax.bar(x + (k - 1) * width, np.maximum(values, floor), width, color=color, hatch=hatch,
                          edgecolor="white" if hatch else None)
            for bar, v in zip(bars, values):
                label = "0" if v == 0 else f"{v:.3g}" if v < 1000 else f"{v:,.0f}"
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=6.5,
                            rotation=90)
        ax.set_yscale("log")
        ax.set_ylim(floor, 2e4)
        ax.set_xticks(x, part["node"])
        ax.set_title(f"{strategy}: catalog estimate (no fit to the paper)", fontsize=9.5)
    axes[0, 0].set_ylabel("GPU idle over 10 syncs (s)")
    axes[1, 0].set_ylabel("GPU idle over 10 syncs (s, log;\n0 drawn at 0.05)")
    labels = ["paper 000, Table 3 (measured)", "geodt, step times inferred from the paper (fp16)",
              "geodt, C with t_max fitted on the other 3 nodes (leave-one-node-out prediction)",
              "geodt, GPU-catalog estimate, fp16 (OpenDiLoCo's default)", "geodt, GPU-catalog estimate, bf16"]
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, hatch=h, edgecolor="white")
               for c, h in ((PAPER_COLOR, None), (INFERRED_COLOR, None), (LONO_COLOR, "//"),
                            (CATALOG_COLOR, None), (CATALOG_BF16_COLOR, "xx"))]
    fig.legend(handles, labels, loc="upper center", ncol=2, frameon=False, bbox_to_anchor=(0.5, 0.955), fontsize=9)
    fig.suptitle("Idle time per node: paper 000 (Table 3) against geodt (top: inferred step times, linear; "
                 "bottom: catalog, log)")
    fig.tight_layout(h_pad=2.5)
    fig.subplots_adjust(top=0.84)
    return png_bytes(fig)


def timeline(timelines: dict[str, pd.DataFrame], subtitles: dict[str, str], rounds: int, title_note: str) -> bytes:
    """Compute, idle and sync per node for the first `rounds` rounds of each named strategy."""
    plt = agg_pyplot()
    names = list(timelines)
    end = max(float(t.loc[t["round"] == rounds - 1, "round_end_s"].max()) for t in timelines.values())
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 2.2 + 1.6 * len(names)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, name in zip(axes, names):
        frame = timelines[name]
        frame = frame[frame["round"] < rounds]
        nodes = list(dict.fromkeys(frame["node"]))
        for y, node in enumerate(nodes):
            for row in frame[frame["node"] == node].itertuples():
                start = row.round_start_s
                segments = [(start, row.compute_s, COMPUTE_COLOR),
                            (start + row.compute_s, row.idle_s, IDLE_COLOR),
                            (start + row.compute_s + row.idle_s, row.comm_s, SYNC_COLOR)]
                for left, width, color in segments:
                    ax.barh(y, width, left=left, height=0.7, color=color, edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(nodes)), nodes)
        ax.invert_yaxis()
        ax.set_title(f"{name}: {subtitles[name]}", loc="left")
        ax.set_xlim(0, end * 1.01)
    axes[-1].set_xlabel("wall-clock time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (COMPUTE_COLOR, IDLE_COLOR, SYNC_COLOR)]
    labels = ["compute (H inner steps)", "idle (waiting at the barrier)", "outer sync (WAN all-reduce + outer step)"]
    fig.legend(handles, labels,
               loc="upper center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.94))
    fig.suptitle(f"The first {rounds} DiLoCo rounds on the paper's cluster ({title_note})")
    fig.tight_layout()
    fig.subplots_adjust(top=0.83)
    return png_bytes(fig)


def batch_time(fit: BatchFit) -> bytes:
    """Paper 002: training time against batch size, the fit T(b) = α/b + β, and its error per point."""
    plt = agg_pyplot()
    b = np.array(facts.P002_BATCH, float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
    dense = np.geomspace(b.min() / 1.3, b.max() * 1.3, 200)
    left.plot(dense, (fit.alpha_s / dense + fit.beta_s) / 3600, color=INFERRED_COLOR,
              label="fit: T(b) = α / b + β\n"
                    f"α = {fit.alpha_s:,.0f} s·samples, β = {fit.beta_s:,.0f} s")
    left.plot(b, np.array(facts.P002_TIME_S) / 3600, "o", color=PAPER_COLOR, label="paper 002 (measured)")
    left.axhline(fit.beta_s / 3600, color="grey", ls=":", lw=1)
    left.annotate("floor β: the per-sample cost alone", (b.min(), fit.beta_s / 3600), xytext=(0, 4),
                  textcoords="offset points", ha="left", fontsize=8, color="grey")
    left.axvline(fit.break_even_batch, color="grey", ls="--", lw=1)
    left.annotate(f"b = α/β = {fit.break_even_batch:.0f}:\nfixed cost = per-sample cost",
                  (fit.break_even_batch, 0.5), xycoords=("data", "axes fraction"), xytext=(5, 0),
                  textcoords="offset points", va="top", fontsize=8, color="grey")
    left.set_xscale("log", base=2)
    left.set_xticks(b, [str(int(v)) for v in b])
    left.set_xlabel("batch size (per GPU, samples)")
    left.set_ylabel("training time (hours)")
    left.set_ylim(bottom=0)
    left.legend(loc="upper right", framealpha=1.0, edgecolor="white")
    left.set_title("ResNet-18 / CIFAR-10, Horovod on 4× T4")
    bars = right.bar([str(int(v)) for v in b], fit.error_pct, color=INFERRED_COLOR)
    _bar_labels(right, bars, fit.error_pct, "{:+.1f}%")
    right.axhline(0, color="black", lw=0.8)
    right.set_xlabel("batch size (per GPU, samples)")
    right.set_ylabel("fit − paper (% of paper's time)")
    right.set_title("error of the fit per point")
    right.margins(y=0.2)
    fig.suptitle("Paper 002: training time against batch size, fixed + per-sample step cost")
    fig.tight_layout()
    return png_bytes(fig)


def share_time(curves: ShareCurves) -> bytes:
    """Paper 001: one epoch's time against the share of data given to the A30 node, two readings."""
    plt = agg_pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.4))
    pct = curves.share * 100
    left.plot(pct, curves.ddp_s / 60, color=INFERRED_COLOR, lw=2, label="epoch time")
    left.set_title("one DDP job over both nodes\n"
                   f"(per step: slower node + {curves.allreduce_s * 1e3:.0f} ms all-reduce at 1 Gbit/s)")
    right.plot(pct, curves.separate_s / 60, color=CATALOG_COLOR, lw=2, label="epoch time (the slower node)")
    right.plot(pct, curves.node_a_s / 60, color=CATALOG_COLOR, lw=1, ls="--", label="node A (2× A30) on its share")
    right.plot(pct, curves.node_b_s / 60, color=CATALOG_COLOR, lw=1, ls=":", label="node B (4× Titan Xp) on the rest")
    right.set_title("each node a separate DDP job on its share\n(no traffic between the nodes)")
    for ax, curve, color in ((left, curves.ddp_s, INFERRED_COLOR), (right, curves.separate_s, CATALOG_COLOR)):
        share, best = curves.best(curve)
        ax.plot(share * 100, best / 60, "v", color=color, ms=9, label=f"best: {share * 100:.0f}% → {best / 60:.1f} min")
        ax.axvline(curves.uniform_share * 100, color="grey", ls="--", lw=1,
                   label=f"even split over the 6 GPUs ({curves.uniform_share * 100:.0f}%)")
        ax.set_xlabel("share of the training data given to node A (2× A30), %")
        ax.set_ylabel("time for one epoch of TinyShakespeare (min)")
        ax.set_xlim(0, 100)
        ax.set_ylim(0, curve.max() / 60 * 1.1)
        ax.legend(frameon=False, loc="lower right" if ax is left else "upper left", fontsize=8.5)
    half = int(np.argmin(np.abs(curves.share - 0.5)))
    ratio = curves.node_b_s[half] / curves.node_a_s[half]
    fig.text(0.5, 0.015, f"Paper 001 reports node B's run took {facts.P001_B_OVER_A_TIME:.0f}× as long as node A's. "
             f"This model, at equal data, has node B at {ratio:.2f}× node A's time: per GPU the catalog's FP32 "
             "Titan Xp is as fast as an A30, and node B has twice the GPUs.", ha="center", fontsize=8.5)
    fig.suptitle("Paper 001's setting modelled from the GPU catalog: minGPT gpt-mini (2.7M params, fp32), "
                 "node A = 2× A30, node B = 4× Titan Xp")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return png_bytes(fig)
