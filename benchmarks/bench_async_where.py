"""results/async-where/: where rounds without a barrier reach a target loss first (issue 40; predicted).

For the paper's cluster and the 1B mixed fleet (benchmarks/time_to_loss_at_scale.py's scenarios and
target: the baseline's predicted loss at 60% of its run), over WAN bandwidths and per-step jitter,
`geodt simulate` with the barrier strategies and `async`, `quorum`; per case the best barrier
strategy's time to the target against async's and quorum's, and async's staleness. Async wins where
the idle it removes is worth more than the loss its staleness costs (these models lie outside the
built-in convergence profile's span, so the literature's: none, Liu et al. 2024's delayed Nesterov
and dynamic local updates; simulator/models/loss_literature.py) and its server keeps up (load: its
syncs over the slowest round's compute; above 1 the nodes queue). Nothing here is measured at this scale: catalog step times, the literature prior's
curve; the README says so.

    python benchmarks/bench_async_where.py [--out results/async-where]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from simulator.cli import simulate_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from time_to_loss_at_scale import SCENARIOS, target_of

from geodt.paper.fmt import markdown
from simulator.outputs.outputs import figure_bytes, write_bytes, write_csv, write_text

ROOT = Path(__file__).resolve().parents[1]

BARRIER = ("baseline", "hybrid", "rebalance", "deadline", "streaming")
WITHOUT = ("async", "quorum")
BANDWIDTHS_GBPS = (0.1, 1.0, 10.0, 100.0)
JITTER_CVS = (0.0, 0.3, 0.6)
COLUMNS = ["scenario", "bandwidth_gbps", "jitter_cv", "target_loss", "best_barrier", "best_barrier_s", "async_s",
           "async_vs_best", "quorum_s", "quorum_vs_best", "async_staleness_mean", "async_idle_s", "best_barrier_idle_s"]


def case(name: str, bandwidth: float, cv: float, target: float, work: Path) -> dict:
    """One `geodt simulate` of every strategy; the row of COLUMNS."""
    source, overrides, _ = SCENARIOS[name]
    sets = [*overrides, f"network.bandwidth_gbps={bandwidth:g}", f"simulation.jitter_cv={cv:g}"]
    out = work / f"{name}-{bandwidth:g}-{cv:g}"
    argv = [source, "--target-loss", f"{target:g}", "--out", str(out), *[a for s in sets for a in ("--set", s)]]
    for strategy in (*BARRIER, *WITHOUT):
        argv += ["--strategy", strategy]
    with contextlib.redirect_stdout(io.StringIO()):
        if simulate_main(argv) != 0:
            raise SystemExit(f"bench_async_where: geodt simulate {' '.join(argv)} failed")
    by = pd.read_csv(out / "summary.csv").groupby("strategy").agg(
        t=("time_to_target_s", "first"), idle=("idle_s", "sum"), stale=("staleness_mean", "first"))
    barrier = by.loc[list(BARRIER)]
    best = barrier["t"].idxmin()
    t_best = float(barrier.loc[best, "t"])
    return {"scenario": name, "bandwidth_gbps": bandwidth, "jitter_cv": cv, "target_loss": target,
            "best_barrier": best, "best_barrier_s": t_best, "async_s": float(by.loc["async", "t"]),
            "async_vs_best": float(by.loc["async", "t"]) / t_best, "quorum_s": float(by.loc["quorum", "t"]),
            "quorum_vs_best": float(by.loc["quorum", "t"]) / t_best,
            "async_staleness_mean": float(by.loc["async", "stale"]), "async_idle_s": float(by.loc["async", "idle"]),
            "best_barrier_idle_s": float(barrier.loc[best, "idle"])}


def verdict(row) -> str:
    """Whether async reaches the target first, and by how much."""
    if not np.isfinite(row.async_s):
        return "async never reaches the target in the run"
    ratio = row.async_vs_best
    if ratio < 1:
        return f"async first, {100 * (1 - ratio):.0f}% sooner than {row.best_barrier}"
    return f"{row.best_barrier} first: async {100 * (ratio - 1):.0f}% later"


def plot(table: pd.DataFrame, path: Path) -> None:
    """async's and quorum's time to target over the best barrier strategy's, per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, table["scenario"].nunique(), figsize=(11, 4), constrained_layout=True, squeeze=False)
    for ax, (name, g) in zip(axes[0], table.groupby("scenario", sort=False)):
        x = np.arange(len(g))
        ax.bar(x - 0.2, g["async_vs_best"].clip(upper=3), 0.4, label="async")
        ax.bar(x + 0.2, g["quorum_vs_best"].clip(upper=3), 0.4, label="quorum")
        ax.axhline(1, color="grey", lw=1, ls="--")
        ax.set_xticks(x, [f"{b:g}\n{c:g}" for b, c in zip(g["bandwidth_gbps"], g["jitter_cv"])], fontsize=8)
        ax.set_xlabel("WAN bandwidth (Gbit/s) / per-step jitter (cv)", fontsize=8)
        ax.set_ylabel("time to target / best barrier strategy's (capped at 3)")
        ax.set_title(f"{name}: below 1, no barrier reaches the target first", fontsize=9)
        ax.legend(fontsize=8)
    write_bytes(path, figure_bytes(fig, dpi=110))
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "async-where")
    args = parser.parse_args()

    grid = [(name, b, cv) for name in SCENARIOS for b in BANDWIDTHS_GBPS for cv in JITTER_CVS]
    targets = {name: target_of(*SCENARIOS[name][:2]) for name in SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="geodt-async-where-") as tmp:
        rows = [case(name, b, cv, targets[name], Path(tmp))
                for name, b, cv in tqdm(grid, desc="simulations", unit="case", file=sys.stderr)]
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["verdict"] = [verdict(r) for r in table.itertuples()]
    write_csv(table, args.out / "table.csv")
    plot(table, args.out / "async-where.png")
    text = (f"`python benchmarks/bench_async_where.py` on {date.today()} ({platform.machine()}, Python "
            f"{platform.python_version()}); predicted, nothing measured at this scale.\n\n"
            + markdown(table, default_digits=2) + "\n")
    write_text(args.out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
