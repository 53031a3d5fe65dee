"""`geodt simulate`'s loss.png: each strategy's predicted loss against wall-clock time, and the target."""
from __future__ import annotations

import io

import numpy as np


def loss_figure(losses: dict, setup) -> bytes:
    """PNG bytes (no timestamp or software tag: the same inputs give the same bytes)."""
    # lazy: startup time (matplotlib)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    colors = plt.get_cmap("tab20").colors
    for i, (name, pred) in enumerate(losses.items()):
        curve = pred["curve"]
        label = name if setup.target is None or not np.isfinite(pred["time_to_target_s"]) else \
            f"{name} (target at {pred['time_to_target_s']:,.0f} s)"
        ax.plot(curve["end_s"], curve["loss"], marker="o", ms=2.5, lw=1.2, label=label, color=colors[(2 * i) % 20
                                                                                                   + (2 * i) // 20])
    if setup.target is not None:
        ax.axhline(setup.target, color="black", lw=0.8, ls="--", label=f"target {setup.target:g}")
    # the first round's loss (from the untrained model) would flatten everything after it
    later = [p["curve"]["loss"].iloc[min(1, len(p["curve"]) - 1)] for p in losses.values()]
    ax.set_ylim(top=min(max(later), setup.model.curve.ceiling) * 1.05)
    ax.set_xlabel("wall-clock time (s, simulated)")
    ax.set_ylabel("predicted training loss (nats/token)")
    ax.set_title("predicted loss against time, per strategy", fontsize=10)
    ax.text(0.0, -0.16, setup.model.curve.source[:140], transform=ax.transAxes, fontsize=6.5, va="top")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
