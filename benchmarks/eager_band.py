"""Why the catalog band of geodt's eager step is ±25%: its H200 rows against what could be fitted.

The band (facts/error_bands.csv, catalog-eager) is the largest |error| of the estimate over the
eager rows of benchmarks/estimate/h200*/ (bench_estimate.h200_rows), the worst at batch 1 where
the host dispatching the step's ops bounds it. This prints, from those rows and nothing else:

- the floor: the rows the estimate prices alike (bench_estimate.priced_alike) and how far off
  one value of them must be;
- the best constant added to every eager estimate (a fixed per-step cost), chosen on all rows;
- the estimate from idle (what simulator/models/estimate.py prices: one step from an idle host
  and device) against the calibration's own timing, `repeats` steps back to back from idle with
  no sync between them (calibrate/harness.py: CUDA events; train_step returns the loss
  unsynchronised), each step's end to the next's: the optimizer's device tail runs under the
  next step's dispatch from the second step on;
- fitted on one day's rows and held out on the other's (a day is its folder: h200 is
  2026-11-26): the host's seconds per op in either timing (a grid, least squares of log error,
  as benchmarks/fit_stacks.py fits), and a partial
  overlap of the host's time H and the device's D, (H^p + D^p)^(1/p): each fit's band (its
  rows' worst) and the held-out day's worst, and how many land inside.

    python benchmarks/eager_band.py

Writes nothing; docs/MODELS.md ("The stack being priced") quotes it.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_estimate import h200_rows, priced_alike

from facts.presets import load_arch
from simulator.models.estimate import HOST_S_PER_OP, Shape, estimate_step, pipeline_block

HOST_GRID_S = np.round(np.arange(10.0, 25.0001, 0.1), 1) * 1e-6
OVERLAP_GRID = np.round(np.arange(1.0, 30.0001, 0.05), 2)
CONSTANT_GRID_S = np.round(np.arange(-30.0, 30.0001, 0.1), 1) * 1e-3


@dataclass
class Row:
    """One eager H200 row with what the timings need: its ops' device seconds in dispatch order."""

    label: str
    day: str
    repeats: int
    measured_s: float
    estimate_s: float
    device_s: np.ndarray  # (N,) the step's ops (micro-step, then optimizer), each op's device seconds

    def step_s(self, host_s_per_op: float, back_to_back: bool) -> float:
        """One step from idle, or the mean of `repeats` steps back to back from idle as events time
        them (step k from max(step k−1's end, the host's time when it records k's start))."""
        busy, lead = pipeline_block(self.device_s, host_s_per_op)
        if not back_to_back:
            return float(lead)
        end = host = total = 0.0
        for _ in range(self.repeats):
            start = max(end, host)
            end = max(end + busy, host + lead)
            host += len(self.device_s) * host_s_per_op
            total += end - start
        return total / self.repeats

    def overlap_s(self, p: float, host_s_per_op: float = HOST_S_PER_OP) -> float:
        host, device = len(self.device_s) * host_s_per_op, float(self.device_s.sum())
        return (host ** p + device ** p) ** (1.0 / p)


def eager_rows() -> list[Row]:
    out = []
    for r in h200_rows():
        if r["step"] != "eager":
            continue
        est = estimate_step("h200", r["dtype"], r["seq_len"], shape=Shape.of(load_arch(r["model"])), step="eager")
        pipe, b = est.pipeline, float(r["batch"])
        raw = pipe.op_seconds(np.array([b]))[0, :pipe.ops.micro_ops]
        micro = est.weights_s + est.launch_s + est.sample_s * b
        opt = pipe.optimizer_op_seconds
        device = np.concatenate([raw * (micro / raw.sum()), opt * (est.optimizer_s / opt.sum())])
        out.append(Row(f"{r['model']} {r['dtype']} b{r['batch']}", r["source"].split("/")[0], r["repeats"],
                       r["measured_s"], r["estimate_s"], device))
    return out


def errors(rows: list[Row], price, *args) -> np.ndarray:
    """Signed % error of `price(row, *args)` against each row's measurement."""
    return np.array([100.0 * (price(r, *args) / r.measured_s - 1.0) for r in rows])


def fit(rows: list[Row], grid, price) -> float:
    """The grid value with the least Σ log(price / measured)² over rows."""
    return float(min(grid, key=lambda x: sum(math.log(price(r, x) / r.measured_s) ** 2 for r in rows)))


def held_out(rows: list[Row]) -> list[dict]:
    """Each fit on one day's rows, tested on the other day's."""
    out = []
    days = sorted({r.day for r in rows})
    prices = {"host s/op, from idle": (HOST_GRID_S, lambda r, h: r.step_s(h, False)),
              "host s/op, back to back": (HOST_GRID_S, lambda r, h: r.step_s(h, True)),
              "overlap (H^p + D^p)^(1/p)": (OVERLAP_GRID, lambda r, p: r.overlap_s(p))}
    for name, (grid, price) in prices.items():
        for day in days:
            mine = [r for r in rows if r.day == day]
            other = [r for r in rows if r.day != day]
            x = fit(mine, grid, price)
            band = float(np.abs(errors(mine, price, x)).max())
            test = np.abs(errors(other, price, x))
            out.append({"model": name, "fit_day": day, "value": x, "band_pct": band, "held_out_worst_pct": float(test.max()),
                        "inside": int((test <= band).sum()), "held_out": len(other)})
    return out


def best_constant(rows: list[Row]) -> tuple[float, float]:
    """(seconds, worst |error| %) of the constant added to every estimate that minimises the worst."""
    worst = [(float(np.abs(errors(rows, lambda r, c: r.estimate_s + c, c)).max()), float(c)) for c in CONSTANT_GRID_S]
    band, c = min(worst)
    return c, band


def main() -> int:
    rows = eager_rows()
    now = errors(rows, lambda r: r.estimate_s)
    print(f"catalog-eager: {len(rows)} rows, worst |error| {np.abs(now).max():.1f}% (the band)")
    for g in priced_alike([r for r in h200_rows() if r["step"] == "eager"])[:3]:
        print(f"  priced alike: {g['model']} {g['dtype']} batch {','.join(map(str, g['batches']))}: "
              f"{1e3 * g['lo_s']:.1f}-{1e3 * g['hi_s']:.1f} ms measured, one estimate >= {100 * g['floor']:.1f}% off")
    c, band = best_constant(rows)
    print(f"best constant per-step term (all rows, in sample): {1e3 * c:+.1f} ms, worst |error| {band:.1f}%")
    back = errors(rows, Row.step_s, HOST_S_PER_OP, True)
    print(f"\n{'row':24s} {'day':16s} {'measured':>9s} {'from idle':>10s} {'back to back':>13s}")
    for r, a, b in zip(rows, now, back):
        if r.measured_s < 0.2:  # the host-bound end; above it the two agree within 0.5%
            print(f"{r.label:24s} {r.day:16s} {1e3 * r.measured_s:7.1f}ms {a:+9.1f}% {b:+12.1f}%")
    print(f"all rows: from idle worst {np.abs(now).max():.1f}%, back to back worst {np.abs(back).max():.1f}% "
          f"(host {HOST_S_PER_OP * 1e6:.0f} µs an op)")
    print("\nfitted on one day, held out on the other")
    for f in held_out(rows):
        print(f"  {f['model']:28s} fit {f['fit_day']:16s} -> {f['value']:.6g}: band {f['band_pct']:.1f}%, held out "
              f"worst {f['held_out_worst_pct']:.1f}% ({f['inside']} of {f['held_out']} inside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
