"""`geodt simulate`'s loss.png: each strategy's predicted loss against wall-clock time, and the target.

The axes show what the strategies can be compared on (issue 58): the loss from the lowest
predicted point (or the target, if lower) up to ln(vocabulary), the loss of a uniform guess, or
the highest first point below it (the first rounds' predictions of the untrained model lie above
and flattened every curve); time up to the longest run that ends within SHARED_RUN_FACTOR of the
median run's end, so that one long run (sync-ddp's, ~15x the others') does not squeeze the rest,
the figure naming each curve it cuts and where that one ends.
"""
from __future__ import annotations

import math

import numpy as np

from simulator.outputs.outputs import agg_figure, laid_out_png

SHARED_RUN_FACTOR = 3.0  # runs ending beyond 3x the median run's end are cut at the longest of the others


def loss_figure(losses: dict, setup, vocab_size: int | None = None) -> bytes:
    """PNG bytes (no timestamp or software tag: the same inputs give the same bytes)."""
    return laid_out_png(loss_figure_axes(losses, setup, vocab_size, layout=False))


def loss_limits(losses: dict, floor: float, target: float | None, ceiling: float,
                vocab_size: int | None) -> tuple[tuple[float, float], float | None]:
    """((bottom, top) of the loss axis, the right end of the time axis or None: every run whole).

    top: ln(vocab_size) (or the curve's ceiling without one), or the highest first point of a
    curve below it when all start lower; right: the module docstring's; bottom: the lowest point
    shown or the target, whichever is lower (the curve's floor when no point is shown)."""
    cap = math.log(vocab_size) if vocab_size else ceiling
    starts = []
    for pred in losses.values():
        loss = np.asarray(pred["curve"]["loss"], dtype=float)
        below = loss[loss <= cap] if np.isfinite(cap) else loss[min(1, len(loss) - 1):]
        if len(below):
            starts.append(float(below[0]))
    top = min(cap, max(starts)) if starts else cap
    ends = np.array([float(np.max(p["curve"]["end_s"])) for p in losses.values() if len(p["curve"])])
    shared = ends[ends <= SHARED_RUN_FACTOR * np.median(ends)].max() if len(ends) else None
    right = shared if shared is not None and ends.max() > shared else None
    shown = [np.asarray(p["curve"]["loss"], dtype=float)[np.asarray(p["curve"]["end_s"]) <= (right or np.inf)]
             for p in losses.values()]
    lowest = min((float(v.min()) for v in shown if len(v)), default=np.inf)
    bottom = lowest if np.isfinite(lowest) else floor
    if target is not None:
        bottom = min(bottom, target)
    if not np.isfinite(top) or top <= bottom:
        top = bottom + 1.0
    pad = 0.04 * (top - bottom)
    return (bottom - pad, top + pad), right


def loss_figure_axes(losses: dict, setup, vocab_size: int | None = None, layout: bool = True):
    """The matplotlib figure of loss_figure (for tests: its limits and texts); layout: tight_layout applied
    (loss_figure lays it out itself, as it writes it)."""
    from matplotlib import colormaps  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn

    fig = agg_figure(figsize=(8, 4.5), dpi=110)
    ax = fig.subplots()
    colors = colormaps["tab20"].colors
    for i, (name, pred) in enumerate(losses.items()):
        curve = pred["curve"]
        label = name if setup.target is None or not np.isfinite(pred["time_to_target_s"]) else \
            f"{name} (target at {pred['time_to_target_s']:,.0f} s)"
        ax.plot(curve["end_s"], curve["loss"], marker="o", ms=2.5, lw=1.2, label=label, color=colors[(2 * i) % 20
                                                                                                   + (2 * i) // 20])
    if setup.target is not None:
        ax.axhline(setup.target, color="black", lw=0.8, ls="--", label=f"target {setup.target:g}")
    (bottom, top), right = loss_limits(losses, setup.floor, setup.target, setup.model.curve.ceiling, vocab_size)
    ax.set_ylim(bottom, top)
    title = "predicted loss against time, per strategy"
    if vocab_size:
        title += f" (loss axis up to ln {vocab_size:,} = {math.log(vocab_size):.2f}, a uniform guess, at most)"
    ax.set_xlim(left=0)  # time from the start of the run
    if right is not None:
        ax.set_xlim(0, right)
        cut = [f"{name} to {float(np.max(p['curve']['end_s'])):,.0f} s" for name, p in losses.items()
               if float(np.max(p["curve"]["end_s"])) > right]
        title += (f"\ntime axis: up to {right:,.0f} s (runs beyond {SHARED_RUN_FACTOR:g}x the median run cut: "
                  f"{', '.join(cut[:3])}{f' and {len(cut) - 3} more' if len(cut) > 3 else ''})")
    ax.set_xlabel("wall-clock time (s, simulated)")
    ax.set_ylabel("predicted training loss (nats/token)")
    ax.set_title(title, fontsize=8.5)
    ax.text(0.0, -0.16, setup.model.curve.source[:140], transform=ax.transAxes, fontsize=6.5, va="top")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    if layout:
        fig.tight_layout()
    return fig
