"""How far off a prediction may be: error bands from geodt's own validation record, and where each figure came from.

A node's step time comes from one of three sources (simulator/models/timing.py, docs/DESIGN.md's
precedence): `measured` (the scenario gives its `step_time_s`), `profile` (`geodt calibrate`'s
measured t(b)) or `catalog` (the estimate from the GPU's datasheet figures), whose band is that of
the step it prices: geodt's compiled (lean) step or its eager one. The network is
`calibrated` (a network profile with measured all-reduces: `geodt calibrate network`) or
`assumed` (the scenario's typed bandwidth and latency, priced by the byte count).

facts/error_bands.csv holds, per (kind, source), the largest |error| geodt's own record shows
for predictions from that source, with the number of cases and the record it was taken from. It
is data, written by `python benchmarks/bench_bands.py` from committed measurements (the catalog
against published and H200 measurements, profiled predictions against real runs, the simulator's
sync against shaped-WAN runs and link calibrations), never typed in.

A prediction's band (`round_band_pct`) weighs each node's step band by its compute and the
network's band by its sync: a node's round is compute + sync + idle, and its idle is the other
nodes' compute and sync, so the round's relative error is at most the mix of the two bands over
the node that works longest (the maximum over nodes, which bounds it).
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

BANDS_CSV = Path(__file__).with_name("error_bands.csv")
BAND_COLUMNS = ["kind", "source", "band_pct", "cases", "median_abs_pct", "record"]
STEP_SOURCES = ("measured", "profile", "catalog")
# The catalog's band depends on the step it prices (simulator/models/provenance.py band_source).
CATALOG_STEPS = ("catalog-compiled", "catalog-eager")
NETWORK_SOURCES = ("calibrated", "assumed")
LABELS = {"measured": "measured step", "profile": "profiled steps", "catalog": "catalog estimate",
          "calibrated": "network calibrated", "assumed": "network assumed"}


@dataclass(frozen=True)
class Band:
    kind: str  # step | network
    source: str
    band_pct: float  # the largest |error| in the record, in % of the measured value
    cases: int
    median_abs_pct: float
    record: str  # the committed files the cases come from


@functools.cache
def load_bands(path: Path = BANDS_CSV) -> dict[tuple[str, str], Band]:
    """(kind, source) -> Band, from facts/error_bands.csv (read once a process: every strategy's band
    and validate's read the same file)."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return {(r["kind"], r["source"]): Band(r["kind"], r["source"], float(r["band_pct"]), int(r["cases"]),
                                           float(r["median_abs_pct"]), r["record"]) for r in rows}


def round_band_pct(nodes: list[tuple[str, float, float]], network_source: str,
                   bands: dict[tuple[str, str], Band] | None = None) -> float:
    """The band of a strategy's round time (and so of its tokens/s and time to a target), in %:
    per node (its step's band source: measured, profile, catalog-compiled or catalog-eager;
    compute seconds; sync seconds), the mix of its step band and the
    network's band weighted by compute and sync; the largest over the nodes."""
    bands = load_bands() if bands is None else bands
    net = bands["network", network_source].band_pct
    worst = 0.0
    for source, compute_s, comm_s in nodes:
        busy_s = compute_s + comm_s
        if busy_s > 0:
            worst = max(worst, (bands["step", source].band_pct * compute_s + net * comm_s) / busy_s)
    return worst


def describe(step_sources: list[str], network_source: str, catalog_stack: str = "") -> str:
    """The sources in words, e.g. "catalog estimate of geodt's eager step, network assumed"
    (catalog_stack: the step the catalog priced, simulator/models/provenance.py catalog_stack)."""
    labels = {**LABELS, "catalog": f"{LABELS['catalog']} of {catalog_stack}" if catalog_stack else LABELS["catalog"]}
    return ", ".join([labels[s] for s in dict.fromkeys(step_sources)] + [labels[network_source]])
