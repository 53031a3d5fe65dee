"""`geodt validate` / `geodt run`: the comparison table, bad input, and one emulated run end to end."""
from __future__ import annotations

import pandas as pd
import pytest

from geodt.run_cmd import VALIDATION_COLUMNS, run_main, validate_main, validation_table


def test_validation_table_sums_rounds_and_scales_measured_time():
    timeline = pd.DataFrame({
        "strategy": "C", "node": ["a", "b"] * 2, "round": [0, 0, 1, 1],
        "compute_s": [1.0, 2.0, 1.0, 2.0], "idle_s": [1.0, 0.0, 1.0, 0.0], "comm_s": [0.5] * 4,
        "round_start_s": 0.0, "round_end_s": 0.0,
    })
    # Measured at time scale 0.5: halves of the scenario's seconds.
    trace = pd.DataFrame({
        "strategy": "C", "node": ["a", "b"] * 2, "round": [0, 0, 1, 1],
        "compute_s": [0.5, 1.0, 0.5, 1.0], "idle_s": [0.6, 0.0, 0.55, 0.05], "comm_s": [0.25] * 4,
        "overrun_steps": [0, 1, 0, 0],
    })
    table = validation_table(timeline, trace, time_scale=0.5)
    a, b = table.iloc[0], table.iloc[1]
    assert (a["node"], a["predicted_idle_s"], a["predicted_round_s"]) == ("a", 2.0, 5.0)
    assert a["measured_idle_s"] == pytest.approx(2.3)
    assert a["measured_round_s"] == pytest.approx(5.3)
    assert a["error_pct_of_round"] == pytest.approx(100 * 0.3 / 5.0)
    assert b["measured_idle_s"] == pytest.approx(0.1) and b["overrun_steps"] == 1
    assert list(table.columns[:7]) == VALIDATION_COLUMNS


@pytest.mark.parametrize("argv, message", [
    (["hetero-cpu", "--strategy", "no-such-strategy"], "no-such-strategy"),
    (["hetero-cpu", "--strategy", "baseline", "--set", "diloco.averaging=median"], "averaging"),
    (["hetero-cpu", "--strategy", "baseline", "--time-scale", "0"], "--time-scale"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert run_main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not out.exists()


def test_validate_emulated_hetero_cpu(tmp_path, capsys):
    out = tmp_path / "v"
    code = validate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress",
                          "--set", "training.rounds=3"])
    assert code == 0
    for name in ("plan.csv", "scenario.toml", "timeline.csv", "trace.csv", "validation.csv", "validation.png"):
        assert (out / name).stat().st_size > 0
    table = pd.read_csv(out / "validation.csv")
    assert list(table.columns) == VALIDATION_COLUMNS
    assert list(table["node"]) == ["fast", "medium", "slow", "slowest"]
    trace = pd.read_csv(out / "trace.csv")
    assert len(trace) == 12
    # Emulated steps of 0.06 s vs 0.15 s: the fastest node waits far longer than the slowest
    # (predicted 3 × 0.9 s against 0), whatever the load on the machine.
    idle = table.set_index("node")["measured_idle_s"]
    assert idle["fast"] > idle["slow"] > idle["slowest"]
    losses = trace.groupby("round")["loss"].mean()
    assert losses.is_monotonic_decreasing
    printed = capsys.readouterr().out
    assert "error_pct_of_round" in printed and "mean loss by round" in printed
