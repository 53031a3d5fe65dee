"""The simulator's two calibrated constants against what they were calibrated from.

OPTIMIZER_BYTES_PER_PARAM must equal the bytes counted op by op on train/step.py's exact
step (benchmarks/count_optimizer_bytes.py); OUTER_STEP_NS_PER_PARAM is a measured figure, so
only its use (linear in the parameter count, independent of GPUs) is checked here.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from simulator.models.network import OUTER_STEP_NS_PER_PARAM, outer_step_s
from simulator.models.timing import OPTIMIZER_BYTES_PER_PARAM
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def _counter():
    spec = importlib.util.spec_from_file_location("count_optimizer_bytes", ROOT / "benchmarks" / "count_optimizer_bytes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_optimizer_bytes_equal_the_count_on_the_real_step(dtype):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    per_op, params = _counter().count("tiny", dtype)
    # exact up to the few scalar-sized tensors (found_inf, norms, step counters): < 0.1 B/param on 262k params
    assert sum(per_op.values()) / params == pytest.approx(OPTIMIZER_BYTES_PER_PARAM[dtype], abs=0.1)
    assert ("_amp_foreach_non_finite_check_and_unscale_" in per_op) == (dtype == "fp16")


def test_outer_step_is_the_measured_cpu_rate_per_parameter():
    paper = load_scenario("paper")
    assert outer_step_s(paper) == pytest.approx(OUTER_STEP_NS_PER_PARAM * 1e-9 * paper.model.param_count, rel=1e-12)
    fast = load_scenario("paper", ["model.dtype=bf16"])
    assert outer_step_s(fast) == outer_step_s(paper)  # the CPU does it: no GPU figure enters
