"""The stack the catalog prices (issue 41 item 4): [training] stack, a fitted stack's exact estimate,
its held-out published rows inside its band, the band naming the stack, and `geodt run` refusing it."""
from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

import pytest

from facts.bands import load_bands
from facts.stacks import FITTED_STACKS, act_bytes_scale, band_source, load_fits
from formats.sections import STACKS, TrainingConfig, choices_of, default_of
from simulator.models.estimate import EstimateError, Shape, estimate_step
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

# A small Llama on an A100 80GB in bf16, hand-counted: 2 layers, h = kv = 1024, f = 4096, vocab 1000, s = 128.
SMALL = Shape(hidden=1024, layers=2, heads=8, kv_heads=8, ffn=4096, vocab=1000)
MATMUL_PARAMS = 2 * (2 * 1024**2 + 2 * 1024**2 + 3 * 1024 * 4096) + 1000 * 1024  # 34,578,432
B_ACT = 2 * 3 * (58 * 1024 + 12 * 1024 + 16 * 4096) + 32 * 1000  # blocks' bytes per token + the loss: 855,296


def test_the_key_is_defined_once_with_geodt_as_default():
    assert choices_of(TrainingConfig, "stack") == STACKS == ("geodt", "torchtitan-eager")
    assert default_of(TrainingConfig, "stack") == "geodt"
    assert "planning only" in next(f.metadata["doc"] for f in fields(TrainingConfig) if f.name == "stack")
    with pytest.raises(ValueError, match="stack"):
        TrainingConfig(stack="megatron")


def test_a_fitted_stack_prices_the_lean_step_with_its_scaled_activation_bytes_exactly():
    est = estimate_step("a100-80gb", "bf16", 128, shape=SMALL, act_bytes_scale=2.55)
    by_hand = 128 * (6 * MATMUL_PARAMS / (312e12 * 0.869)  # matmuls at η_mm of the A100's 312 TFLOPS
                     + 7 * 2 * 128 * 1024 / (312e12 * 0.55)  # flash attention, forward + backward
                     + 2.55 * B_ACT / 2039e9)  # the stack's activation traffic at the peak bandwidth
    assert est.sample_s == pytest.approx(by_hand, rel=1e-12)
    assert est.sample_s == pytest.approx(2.3623047252625557e-4, rel=1e-12)
    assert est.step_s(4) == pytest.approx(4.065602380541511e-3, rel=1e-12)
    lean = estimate_step("a100-80gb", "bf16", 128, shape=SMALL)
    assert lean.sample_s == pytest.approx(1.5300794854391126e-4, rel=1e-12)  # the scale is the only change
    assert (est.weights_s, est.launch_s, est.optimizer_s) == (lean.weights_s, lean.launch_s, lean.optimizer_s)
    with pytest.raises(EstimateError, match="act_bytes_scale"):
        estimate_step("a100-80gb", "bf16", 128, shape=SMALL, step="eager", act_bytes_scale=2.0)


def test_the_fit_file_is_what_the_published_fit_rows_give():
    from fit_stacks import fit_rows

    assert {r["stack"]: r["act_bytes_scale"] for r in fit_rows()} == load_fits()
    assert act_bytes_scale("torchtitan-eager") == 2.55 and act_bytes_scale("geodt") == 1.0


@pytest.mark.parametrize("stack", FITTED_STACKS)
def test_held_out_published_rows_fall_inside_the_band_the_fit_rows_give(stack):
    from bench_bands import stack_errors

    band = load_bands()["step", band_source(stack)]
    fit, held = stack_errors(stack, "fit"), stack_errors(stack, "held-out")
    assert band.cases == len(fit) and band.band_pct == round(max(abs(e) for _, e in fit), 1)
    assert held and all(abs(e) <= band.band_pct for _, e in held), held


def test_a_scenario_prices_and_names_its_stack_on_gpu_nodes():
    from simulator.models.provenance import band_sources, catalog_stack, sources_text
    from simulator.models.timing import gpu_estimate, priced_stack

    default, titan = load_scenario("paper"), load_scenario("paper", ['training.stack="torchtitan-eager"'])
    shape = Shape.of(default.model.arch)
    args = ("rtx-2080-ti", default.model.dtype, default.model.seq_len)
    assert gpu_estimate(default, "rtx-2080-ti") == estimate_step(*args, shape=shape, params=default.model.param_count)
    assert gpu_estimate(titan, "rtx-2080-ti") == estimate_step(*args, shape=shape, params=default.model.param_count,
                                                               act_bytes_scale=2.55)
    assert priced_stack(titan, "cpu") == "geodt-eager"  # published stacks are GPU runs: a CPU keeps geodt's step
    assert catalog_stack(titan) == "torchtitan eager"
    assert set(band_sources(titan).values()) == {"catalog-torchtitan-eager"}
    assert sources_text(titan, ["catalog"]) == "catalog estimate of torchtitan eager, network assumed"


def test_geodt_run_refuses_a_planning_only_stack(tmp_path):
    from test_real_config import SCENARIO

    from real.core.config import ConfigError, load_run_spec

    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO.replace("batch_size = 2\n", 'batch_size = 2\nstack = "torchtitan-eager"\n'))
    with pytest.raises(ConfigError) as err:
        load_run_spec(path)
    assert str(err.value) == (f"{path}: training.stack: 'torchtitan-eager' is priced for planning only: "
                              "the executor runs geodt's own step (expected 'geodt')")
    path.write_text(SCENARIO.replace("batch_size = 2\n", 'batch_size = 2\nstack = "geodt"\n'))
    assert load_run_spec(path).training.rounds == 2
