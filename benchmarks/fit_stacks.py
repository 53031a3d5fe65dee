"""facts/stack_fits.csv: each fitted stack's act_bytes_scale, fitted to its published rows marked `fit`.

A stack other than geodt's own step is priced as the lean step with its activation and loss traffic
B_act times one factor (facts/stacks.py). This fits that factor, per stack, to the rows of
benchmarks/estimate/published_throughput.csv whose `stack` is it and whose `fit` is `fit`: the
value on a grid of GRID_STEP from 1 to GRID_MAX that minimises the sum of squared log errors of
the estimated tokens/s (bench_estimate.row_estimate). Rows marked `held-out` are not read here;
benchmarks/bench_bands.py reports whether they land inside the band the fit rows give.

    python benchmarks/fit_stacks.py [--check]

Writes facts/stack_fits.csv (temp name, then rename) and prints each fit; --check writes nothing
and exits 1 if the committed file differs from what the published rows give.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_estimate import published_rows, row_estimate, write_or_check

from facts.stacks import FIT_COLUMNS, FITS_CSV, FITTED_STACKS

ROOT = Path(__file__).resolve().parents[1]
GRID_STEP, GRID_MAX = 0.01, 8.0
RECORD = "benchmarks/estimate/published_throughput.csv"


def log_sq_error(rows: list[dict], scale: float) -> float:
    """Σ log(estimate / measured)² over rows, priced with act_bytes_scale = scale."""
    return sum(math.log(row_estimate(r, scale) / float(r["tokens_per_s_per_gpu"])) ** 2 for r in rows)


def fit_scale(rows: list[dict]) -> float:
    """The grid value of act_bytes_scale with the least log_sq_error over rows."""
    grid = [round(1.0 + GRID_STEP * i, 2) for i in range(round((GRID_MAX - 1.0) / GRID_STEP) + 1)]
    return min(grid, key=lambda k: log_sq_error(rows, k))


def fit_rows() -> list[dict]:
    """One facts/stack_fits.csv row per fitted stack."""
    rows = published_rows()
    out = []
    for stack in FITTED_STACKS:
        mine = [r for r in rows if r["stack"] == stack]
        fit = [r for r in mine if r["fit"] == "fit"]
        if not fit:
            raise SystemExit(f"stack {stack}: no published row marked fit in {RECORD}")
        out.append({"stack": stack, "act_bytes_scale": fit_scale(fit), "fit_rows": len(fit),
                    "held_out_rows": sum(r["fit"] == "held-out" for r in mine),
                    "record": f"{RECORD} (stack {stack}, rows marked fit)"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file; write nothing")
    args = parser.parse_args(argv)
    rows = fit_rows()
    for r in rows:
        print(f"{r['stack']}: act_bytes_scale {r['act_bytes_scale']:.2f} ({r['fit_rows']} rows fitted, "
              f"{r['held_out_rows']} held out)")
    text = pd.DataFrame(rows, columns=FIT_COLUMNS).to_csv(index=False, lineterminator="\n")
    return write_or_check(FITS_CSV, text, args.check, "the published rows")


if __name__ == "__main__":
    sys.exit(main())
