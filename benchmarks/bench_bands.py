"""facts/error_bands.csv from geodt's own validation record: how far off each source of a prediction has been.

Every band is the largest |error| among the committed cases of its source (facts/bands.py says
how a prediction combines them); nothing here is measured anew or typed in:

- step, catalog-compiled: the catalog's estimate of the compiled (lean) step against published
  training throughput of lean stacks (benchmarks/estimate/published_throughput.csv, the rows of
  stack `lean`: priced by the same unfitted step) and against geodt's compiled step timed on an
  H200; step, catalog-eager: its estimate of geodt's eager step against that step timed on an
  H200, every batch (benchmarks/bench_estimate.py's rows).
- step, catalog-<stack> for each fitted stack (facts/stacks.py): its estimate against the
  published rows its constant was fitted to (marked `fit`). The rows marked `held-out` are not in
  the band: they are the test of it, printed with whether each lands inside.
- step, profile: the simulator, its nodes priced from calibration profiles, against real
  (not emulated) runs' round times: results/fidelity/fidelity.csv (loopback, devices calibrated
  together right before each run) and the shaped-WAN runs at the current defaults (WAN_RECORD).
- step, measured: a given `step_time_s` is one measured batch, priced as a profile's: the
  same record.
- network, calibrated: the simulator's sync, priced from link calibrations, against the same
  shaped-WAN runs' measured syncs (sync_err_pct).
- network, assumed: the byte-count price at the links' nominal (tbf) rate against the
  all-reduces those links' calibrations measured (geodt/calibration/wan_links.py comparison,
  every size of every committed link calibration of WAN_RECORD).

    python benchmarks/bench_bands.py [--check]

Writes facts/error_bands.csv (temp name, then rename) and prints each band; --check writes
nothing and exits 1 if the committed file differs from what the record gives.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

from geodt.calibration.wan_links import comparison
from simulator.models.netfit import read_network_profile
from simulator.scenario import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_estimate import compare, h200_rows, write_or_check
from bench_fidelity import wan_overrides

from facts.bands import BAND_COLUMNS, BANDS_CSV
from facts.stacks import FITTED_STACKS, band_source

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK_RECORD = "results/fidelity/fidelity.csv"
# The shaped-WAN runs at the current defaults (32 rounds, 32 link repeats, calibrated between
# averages): results/fidelity-wan/README.md. All are wan-three, fp32, the q40 node's uplink at half
# the rate; their cases name the collective.
WAN_RECORD = ["results/fidelity-wan/between-averages/plan-rounds32", "results/fidelity-wan/between-averages/plan-rounds32-again",
              "results/fidelity-wan/between-averages/rounds32", "results/fidelity-wan/between-averages/streaming-rounds32"]
WAN_SCENARIO = ROOT / "benchmarks" / "fidelity" / "wan-three.toml"
WAN_UPLINKS = {"q40": 0.5}


def catalog_errors(step: str) -> list[float]:
    """|error| % of the catalog estimate of one step: eager, geodt's eager step timed on an H200
    (every batch); lean (compiled), geodt's compiled step on an H200 and every published row of
    the lean stacks (flash attention, fused kernels, priced as the lean step with the row's
    attention and recomputation)."""
    h200 = [100 * abs(r["error"]) for r in h200_rows() if r["step"] == step]
    return h200 + ([100 * abs(err) for row, _, err in compare() if row["stack"] == "lean"] if step == "lean" else [])


def stack_errors(stack: str, role: str) -> list[tuple[str, float]]:
    """(row id, signed error %) of a fitted stack's published rows marked `role` (fit or held-out)."""
    return [(row["id"], 100 * err) for row, _, err in compare() if row["stack"] == stack and row["fit"] == role]


def wan_frames() -> list[pd.DataFrame]:
    return [pd.read_csv(ROOT / folder / "fidelity.csv") for folder in WAN_RECORD]


def profile_errors() -> list[float]:
    rounds = [pd.read_csv(ROOT / LOOPBACK_RECORD)["round_err_pct"]] + [f["round_err_pct"] for f in wan_frames()]
    return [abs(float(v)) for v in pd.concat(rounds).dropna()]


def calibrated_network_errors() -> list[float]:
    return [abs(float(v)) for f in wan_frames() for v in f["sync_err_pct"].dropna()]


def assumed_network_errors() -> list[float]:
    """The byte-count price at the nominal rate against each committed link calibration's all-reduces."""
    errors = []
    for folder in WAN_RECORD:
        collective = "ring" if " ring " in pd.read_csv(ROOT / folder / "fidelity.csv")["case"].iloc[0] else "partitioned"
        for links in sorted((ROOT / folder / "links").glob("run*.csv")):
            sets = wan_overrides("fp32", collective, WAN_UPLINKS, (), links)
            scenario = load_scenario(str(WAN_SCENARIO), sets, without_profiles=True)
            frame = pd.read_csv(links)
            errors += [abs(float(v)) for v in comparison(scenario, read_network_profile(links), frame)["error_pct"]]
    return errors


def band_rows() -> list[dict]:
    wan = ", ".join(f"{f}/fidelity.csv" for f in WAN_RECORD)
    profile = profile_errors()
    cases = [("step", "catalog-compiled", catalog_errors("lean"),
              "benchmarks/estimate/published_throughput.csv (stack lean), benchmarks/estimate/h200*/ (compiled)"),
             ("step", "catalog-eager", catalog_errors("eager"), "benchmarks/estimate/h200*/ (eager)"),
             *[("step", band_source(stack), [abs(e) for _, e in stack_errors(stack, "fit")],
                f"benchmarks/estimate/published_throughput.csv (stack {stack}, rows marked fit)")
               for stack in FITTED_STACKS],
             ("step", "profile", profile, f"{LOOPBACK_RECORD}, {wan}"),
             ("step", "measured", profile, f"as profile: {LOOPBACK_RECORD}, {wan}"),
             ("network", "calibrated", calibrated_network_errors(), wan),
             ("network", "assumed", assumed_network_errors(), ", ".join(f"{f}/links/run*.csv" for f in WAN_RECORD))]
    return [{"kind": kind, "source": source, "band_pct": round(max(errors), 1), "cases": len(errors),
             "median_abs_pct": round(statistics.median(errors), 1), "record": record,
             "held_out_inside": held_out_inside(errors)}
            for kind, source, errors, record in cases]


def held_out_inside(errors: list[float]) -> int:
    """How many cases fall inside the band the other cases give (each held out in turn): how
    often a case the record did not hold lands inside the printed band."""
    return sum(e <= max(errors[:i] + errors[i + 1:], default=0.0) for i, e in enumerate(errors))


def print_held_out(band_pct: dict[str, float]) -> None:
    """Each fitted stack's held-out published rows against the band its fit rows give."""
    for stack in FITTED_STACKS:
        band = band_pct[band_source(stack)]
        held = stack_errors(stack, "held-out")
        inside = sum(abs(e) <= band for _, e in held)
        print(f"held out of {stack}'s fit: {inside} of {len(held)} inside its ± {band}%")
        for row_id, err in held:
            print(f"  {row_id:36s} {err:+6.1f}%  {'inside' if abs(err) <= band else 'OUTSIDE'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file; write nothing")
    args = parser.parse_args(argv)
    rows = band_rows()
    frame = pd.DataFrame(rows, columns=BAND_COLUMNS)
    for r in rows:
        print(f"{r['kind']:8s} {r['source']:24s} ± {r['band_pct']:5.1f}%  ({r['cases']} cases, median |error| "
              f"{r['median_abs_pct']}%; each held out in turn, {r['held_out_inside']} of {r['cases']} inside the "
              "others' band)")
    print_held_out({r["source"]: r["band_pct"] for r in rows})
    text = frame.to_csv(index=False, lineterminator="\n")
    return write_or_check(BANDS_CSV, text, args.check, "the record")


if __name__ == "__main__":
    sys.exit(main())
