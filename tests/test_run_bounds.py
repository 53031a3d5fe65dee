"""`geodt run --emulate --time-scale X` bounded (issue 58): 1e9 was accepted, a run of centuries of
padded steps; refused in one line, exit 2, nothing written, where the padded compute alone passes
a week (run_exec.MAX_EMULATED_S)."""
from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")  # the executor's modules below import it (core install: skipped)

from formats.errors import InputError
from geodt.run_cmd import run_main
from geodt.run_exec import MAX_EMULATED_S, check_emulated_length
from real.core.options import ExecOptions
from simulator.scenario import load_scenario
from simulator.strategies import make_plan
from tests.one_line import one_line_exit_2


def test_a_time_scale_of_years_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    code = run_main(["hetero-cpu", "--strategy", "baseline", "--emulate", "--time-scale", "1e9", "--out", str(out)])
    one_line_exit_2(capsys, code, "--time-scale 1e+09", "at least 285 years",
                    "6 rounds x slowest's 10 steps of 0.15 s x 1e+09", "expected at most 7 days")
    assert not out.exists()


def test_the_bound_is_the_slowest_nodes_padded_compute_over_the_rounds(tmp_path):
    scenario = load_scenario("hetero-cpu")
    plan = make_plan(scenario, "baseline")
    at_limit = MAX_EMULATED_S / (6 * 10 * 0.15)  # slowest: 10 steps of 0.15 s, 6 rounds
    opts = ExecOptions(out_dir=str(tmp_path), emulate=True, time_scale=at_limit * (1 - 1e-9))
    check_emulated_length(scenario, plan, opts)  # a week exactly: accepted
    with pytest.raises(InputError, match=r"at least 7\.01 days"):
        check_emulated_length(scenario, plan, replace(opts, time_scale=at_limit * 1.001))
    check_emulated_length(scenario, plan, replace(opts, time_scale=1e9, emulate=False))  # real steps: no padding
    check_emulated_length(scenario, make_plan(scenario, "sync-ddp"), replace(opts, time_scale=1e9))  # not padded
