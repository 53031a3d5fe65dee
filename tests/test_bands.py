"""Error bands and sources (issue 41): facts/error_bands.csv is what geodt's record gives, each
summary row says where its figures come from, and a strategy's band mixes its nodes' bands."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from facts.bands import Band, load_bands, round_band_pct
from simulator.models.provenance import network_source, step_sources, with_provenance
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def _bands(catalog=20.0, profile=8.0, calibrated=5.0, assumed=50.0) -> dict:
    rows = [("step", "catalog-compiled", catalog), ("step", "catalog-eager", 2 * catalog), ("step", "profile", profile),
            ("step", "measured", profile),
            ("network", "calibrated", calibrated), ("network", "assumed", assumed)]
    return {(k, s): Band(k, s, b, 1, b, "test") for k, s, b in rows}


def test_committed_bands_are_what_the_record_gives():
    run = subprocess.run([sys.executable, "benchmarks/bench_bands.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    bands = load_bands()
    assert {k for k, _ in bands} == {"step", "network"}
    assert all(b.cases > 0 and b.band_pct >= b.median_abs_pct >= 0 for b in bands.values())


def test_round_band_mixes_compute_and_sync_and_takes_the_worst_node():
    bands = _bands()
    # node a: 30 s of catalog compute, 10 s of assumed sync -> (20*30 + 50*10) / 40 = 27.5
    # node b: 40 s of profiled compute, 0 s sync -> 8
    assert round_band_pct([("catalog-compiled", 30.0, 10.0), ("profile", 40.0, 0.0)], "assumed", bands) == 27.5
    # the eager step's catalog band (40 here): (40*30 + 50*10) / 40 = 42.5
    assert round_band_pct([("catalog-eager", 30.0, 10.0)], "assumed", bands) == 42.5
    assert round_band_pct([("profile", 30.0, 10.0)], "calibrated", bands) == pytest.approx((8 * 30 + 5 * 10) / 40)
    assert round_band_pct([("catalog-compiled", 0.0, 0.0)], "assumed", bands) == 0.0  # an idle-only node bounds nothing


def test_sources_of_the_builtin_scenarios():
    paper = load_scenario("paper")
    assert set(step_sources(paper).values()) == {"catalog"} and network_source(paper) == "assumed"
    assert set(step_sources(load_scenario("hetero-cpu")).values()) == {"measured"}
    fidelity = load_scenario(str(ROOT / "benchmarks" / "fidelity" / "two-node.toml"))
    assert set(step_sources(fidelity).values()) == {"profile"} and network_source(fidelity) == "calibrated"


def test_summary_rows_carry_sources_and_the_strategy_band():
    scenario = load_scenario("paper")
    summ = pd.DataFrame({"strategy": "baseline", "node": [n.name for n in scenario.nodes],
                         "compute_s": [10.0, 20.0, 30.0, 40.0], "comm_s": [5.0, 5.0, 5.0, 5.0]})
    out = with_provenance(summ, scenario)
    bands = load_bands()
    cat, net = bands["step", "catalog-compiled"].band_pct, bands["network", "assumed"].band_pct  # GPUs: compiled
    worst = max((cat * c + net * 5.0) / (c + 5.0) for c in (10.0, 20.0, 30.0, 40.0))
    assert list(out["step_source"]) == ["catalog"] * 4 and set(out["network_source"]) == {"assumed"}
    assert set(out["error_band_pct"]) == {round(worst, 1)}


def test_simulate_prints_each_strategy_band_and_what_it_rests_on(tmp_path):
    run = subprocess.run([sys.executable, "-m", "geodt", "simulate", "paper", "--strategy", "baseline",
                          "--strategy", "streaming", "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary = pd.read_csv(tmp_path / "o" / "summary.csv")
    for _, rows in summary.groupby("strategy"):
        band = rows["error_band_pct"].iloc[0]
        assert f"band ± {band:.0f}% (catalog estimate of geodt's compiled step, network assumed)" in run.stdout
        assert f"±{band:.0f}%" in run.stdout  # the answer's band column
    assert "band: ± the largest error geodt's own record shows" in run.stdout


def test_validate_says_whether_the_measured_rounds_fell_inside_the_band():
    from geodt.validation import band_line

    scenario = load_scenario("hetero-cpu")
    names = [n.name for n in scenario.nodes]
    timeline = pd.DataFrame({"node": names * 2, "compute_s": [1.0] * (2 * len(names)), "comm_s": 0.0})
    band = load_bands()["step", "measured"].band_pct  # compute only: the band is the step source's
    inside = band_line(scenario, timeline, pd.DataFrame({"round_error_pct": [band - 1.0, -2.0]}))
    assert inside == (f"band: the prediction's round time ± {band:.1f}% (measured step, network assumed); "
                      f"measured round off by at most {band - 1.0:.1f}%: inside")
    outside = band_line(scenario, timeline, pd.DataFrame({"round_error_pct": [-(band + 2.5)]}))
    assert outside.endswith("outside by 2.5 points")


def test_the_catalog_names_the_step_it_prices():
    from simulator.models.provenance import band_sources, catalog_stack

    assert catalog_stack(load_scenario("paper")) == "geodt's compiled step"  # compile = "auto": on for GPUs
    assert catalog_stack(load_scenario("paper", ['training.compile="off"'])) == "geodt's eager step"
    assert catalog_stack(load_scenario("hetero-cpu")) == ""  # no catalog node
    eager = load_scenario("paper", ['training.compile="off"'])
    assert set(band_sources(eager).values()) == {"catalog-eager"}
    assert set(band_sources(load_scenario("paper")).values()) == {"catalog-compiled"}
