"""benchmarks/bench_bracketed.py and bench_placement.py's arithmetic on files written by hand: what
results/predict-the-run/ sections 9 and 10 report, without running a calibration or a run."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytest.importorskip("torch")  # bench_placement builds the model (train/models.py imports torch)

import bench_bracketed
import bench_placement

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "predict-the-run" / "bracketed"


def _profile(path: Path, step_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"batch_size": [2, 4], "step_s_mean": [step_s / 2, step_s]}).to_csv(path, index=False)


def _run(root: Path, k: int, nodes: dict[str, tuple]) -> None:
    """nodes: {name: (before_s, after_s, predicted_compute_s, measured_compute_s, predicted_idle_s, measured_idle_s)}"""
    run = root / f"run{k}"
    rows = []
    for node, (before, after, pc, mc, pi, mi) in nodes.items():
        _profile(run / "before" / f"{node}-0.csv", before)
        _profile(run / "after" / f"{node}-0.csv", after)
        rows.append({"node": node, "predicted_round_s": 10.0, "measured_round_s": 10.5, "predicted_compute_s": pc,
                     "measured_compute_s": mc, "predicted_idle_s": pi, "measured_idle_s": mi})
    pd.DataFrame(rows).to_csv(run / "validation.csv", index=False)


def test_the_table_signs_errors_as_bench_fidelity_and_prices_the_fastest_device(tmp_path):
    _run(tmp_path, 1, {"fast": (0.040, 0.044, 8.0, 7.6, 0.2, 0.725), "slow": (0.100, 0.100, 9.0, 9.9, 0.1, 0.1)})
    _run(tmp_path, 2, {"fast": (0.040, 0.040, 8.0, 8.0, 0.2, 0.2), "slow": (0.100, 0.090, 9.0, 9.0, 0.1, 0.1)})
    frame = bench_bracketed.table(tmp_path, 2, batch=4)
    first = frame.iloc[0]
    assert (first.before_ms, first.after_ms) == pytest.approx((40.0, 44.0))
    assert first.run_over_before == pytest.approx(0.95)
    assert first.round_err_pct == pytest.approx(100 * (10.0 - 10.5) / 10.5)
    assert first.idle_err_pct_of_round == pytest.approx(5.0)  # (0.725 - 0.2) / 10.5
    assert first.after_over_before == pytest.approx(1.1)
    assert first.run_over_mid == pytest.approx(0.95 * 2 * 40 / 84)
    lines = bench_bracketed.verdicts(frame)
    # round -4.76% in both runs; worst idle 5.0 and 0
    assert lines[0] == "round within ±5%: 2 of 2 runs; worst idle within 6% of the round: 2 of 2"
    # run 1: 0.95 / 1.1; run 2: 1.0 / 1.0
    assert lines[1].endswith("per run: 0.864, 1.000 (median 0.932)")


def test_the_committed_section_9_table_regenerates_from_its_files():
    old = pd.read_csv(COMMITTED / "bracketed.csv")
    new = bench_bracketed.table(COMMITTED, 5, batch=4)
    assert list(new.columns) == list(old.columns)
    assert (new.run.values == old.run.values).all() and (new.node.values == old.node.values).all()
    # the committed file was written with six significant digits
    assert new.iloc[:, 2:].values == pytest.approx(old.iloc[:, 2:].values, rel=1e-4, abs=1e-4)


def test_a_copy_of_the_scenario_reads_the_profiles_just_measured(tmp_path):
    scenario = Path(bench_bracketed.ROOT / "benchmarks" / "fidelity" / "three-node-pinned.toml")
    copy = bench_bracketed.scenario_with_profiles(scenario, tmp_path / "cal", tmp_path / "s.toml").read_text()
    assert copy.count(f"{tmp_path / 'cal'}/q") == 3
    assert "../../" not in copy


def test_steady_steps_per_mode_and_their_ratio_to_pinned():
    rows = []
    for session, mode, step_s in ((0, "free", 0.050), (1, "pinned", 0.040), (2, "free", 0.046), (3, "pinned", 0.040)):
        rows += [("q90", 0, 1.0, 0.5, session, mode), ("q90", 0, 2.5, step_s, session, mode),
                 ("q90", 0, 3.0, step_s, session, mode)]
    steps = pd.DataFrame(rows, columns=["node", "device", "t_s", "step_s", "session", "mode"])
    out = bench_placement.steady(steps).set_index("mode")
    # steps before 2 s are left out: free sessions 50 and 46 ms, median 48
    assert out.loc["free", "median_ms"] == pytest.approx(48.0)
    assert (out.loc["free", "min_ms"], out.loc["free", "max_ms"]) == pytest.approx((46.0, 50.0))
    assert out.loc["free", "vs_pinned"] == pytest.approx(1.2)
    assert out.loc["pinned", "sessions"] == 2


def test_a_running_process_is_seen_on_a_cpu():
    # this test's own thread is running when it reads itself
    cpus = bench_placement._runnable_cpus(os.getpid())
    assert cpus and all(c in os.sched_getaffinity(0) for c in cpus)


def test_ahead_counts_sessions_whose_first_seconds_predict_the_rest():
    late = {0: {"a": 0.110, "b": 0.110, "c": 0.110},   # every device 1.10x: the shared part misses ±5%
            1: {"a": 0.100, "b": 0.100, "c": 0.093},   # c 0.93x the others: apart by 7%, beyond 6%
            2: {"a": 0.102, "b": 0.102, "c": 0.102}}   # 1.02x alike: both goals met
    rows = [(node, 0, t, step, session, "free") for session, steps in late.items() for node, step_late in steps.items()
            for t, step in ((0.5, 0.100), (1.5, 0.100), (4.5, step_late), (6.0, step_late))]
    steps = pd.DataFrame(rows, columns=["node", "device", "t_s", "step_s", "session", "mode"])
    moved, line = bench_placement.ahead(steps)
    assert moved[moved.session == 1].apart.round(3).tolist() == [1.0, 1.0, 0.93]
    assert line == ("the first 2 s of a session against its steps after 4 s: every device moved alike within ±5% in "
                    "2 of 3 sessions, each device apart from that within 6% in 2, both in 1")
