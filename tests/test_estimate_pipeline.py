"""The eager step's host/device pipeline (simulator/models/estimate.py DispatchPipeline) and its fact file
(facts/step_ops.csv, benchmarks/trace_step_ops.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from facts.step_ops import StepOps, step_ops
from simulator.models.estimate import DispatchPipeline, Shape, estimate_step, pipeline_block, pipeline_s


def recursion(device_s, h):
    """f_k = max(f_{k-1}, k·h) + d_k, written out."""
    f = 0.0
    for k, d in enumerate(device_s, start=1):
        f = max(f, k * h) + d
    return f


def test_uniform_ops_take_the_longer_of_host_and_device_plus_one_op_of_the_other():
    # 4 ops of 2 s, dispatched every 1 s: device-bound, D + h = 8 + 1
    assert pipeline_s([2.0] * 4, 1.0) == 9.0
    # 4 ops of 1 s dispatched every 3 s: host-bound, H + d = 12 + 1
    assert pipeline_s([1.0] * 4, 3.0) == 13.0


def test_a_host_bound_run_before_a_device_bound_op_costs_more_than_either():
    # four empty ops (views) then one of 10 s, dispatched every 1 s: the big op waits for its
    # dispatch at 5 s, so 15 s, where max(host 5, device 10) = 10
    assert pipeline_s([0.0, 0.0, 0.0, 0.0, 10.0], 1.0) == 15.0
    # the same ops, the big one first: it runs while the host dispatches the rest, 11 s
    assert pipeline_s([10.0, 0.0, 0.0, 0.0, 0.0], 1.0) == 11.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=40), st.floats(0.01, 3.0))
def test_the_closed_form_is_the_recursion_and_at_least_host_and_device(device_s, h):
    f = pipeline_s(device_s, h)
    assert f == pytest.approx(recursion(device_s, h), rel=1e-12, abs=1e-12)
    assert f >= max(sum(device_s), len(device_s) * h) - 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 5.0), min_size=2, max_size=30), st.integers(1, 29), st.floats(0.01, 3.0))
def test_blocks_compose_into_the_whole_sequence(device_s, cut, h):
    """A block that starts with the device busy until f and the host at t ends at max(f + busy, t + lead)."""
    cut = min(cut, len(device_s) - 1)
    first, second = np.array(device_s[:cut]), np.array(device_s[cut:])
    busy, lead = pipeline_block(second, h)
    composed = max(pipeline_s(first, h) + busy, cut * h + lead)
    assert composed == pytest.approx(pipeline_s(device_s, h), rel=1e-12, abs=1e-12)


def hand_made_pipeline():
    """Three micro-step ops (a view, a 4-FLOP matmul per sequence, 8 bytes once) and one optimizer op."""
    ops = StepOps(flops=np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 4.0, 0.0, 0.0]]),
                  bytes=np.array([[0.0, 0.0, 8.0, 2.0], [0.0, 0.0, 0.0, 0.0]]),
                  attention=np.zeros(4, dtype=bool), optimizer_ops=1)
    return DispatchPipeline(ops, flops_per_s=np.full(4, 1.0), bytes_per_s=2.0, host_s_per_op=1.0)


def test_the_ops_take_their_share_of_the_device_estimate_and_accumulation_repeats_the_micro_step():
    pipe = hand_made_pipeline()
    # batch 1: roofline seconds 0, 4, 4 (micro), 1 (optimizer); scaled to micro 16 s and optimizer 3 s
    assert np.array_equal(pipe.op_seconds(np.array([1.0])), [[0.0, 4.0, 4.0, 1.0]])
    micro = [0.0, 8.0, 8.0]
    assert pipe.step_s(1, 16.0, 3.0) == recursion(micro + [3.0], 1.0) == 21.0
    assert pipe.step_s(1, 16.0, 3.0, accum=2) == recursion(micro * 2 + [3.0], 1.0) == 37.0
    # batch 2: 0, 8, 4 scaled to 24 s; arrays give the same floats as numbers
    assert pipe.step_s(2, 24.0, 3.0) == recursion([0.0, 16.0, 8.0, 3.0], 1.0)
    both = pipe.step_s(np.array([[2, 1], [1, 2]]), np.array([[24.0, 16.0], [16.0, 24.0]]), 3.0)
    assert both.tolist() == [[pipe.step_s(2, 24.0, 3.0), 21.0], [21.0, pipe.step_s(2, 24.0, 3.0)]]


@pytest.mark.parametrize("model", ["llama-150m", "llama-1b"])
def test_the_eager_estimate_is_at_least_the_device_and_the_host(model):
    from facts.presets import load_arch

    est = estimate_step("h200", "bf16", 1024, shape=Shape.of(load_arch(model)), step="eager")
    batch = np.arange(1, 257)
    device = est.weights_s + est.launch_s + est.sample_s * batch + est.optimizer_s
    step = est.step_s(batch)
    assert np.all(step >= np.maximum(device, est.host_s))
    assert np.all(step <= device + est.host_s + est.pipeline.ops.optimizer_ops * est.pipeline.host_s_per_op)


def test_llama_150m_at_batch_8_pays_where_host_and_device_meet():
    """Host 46.3 ms and device 51.0 ms per step: the pipeline gives 54.8 ms (the H200 measured 59.7)."""
    from facts.presets import load_arch

    est = estimate_step("h200", "bf16", 1024, shape=Shape.of(load_arch("llama-150m")), step="eager")
    device = est.weights_s + est.launch_s + 8 * est.sample_s + est.optimizer_s
    assert est.host_s == pytest.approx(0.04629) and device == pytest.approx(0.05101, abs=5e-5)
    assert est.step_s(8) == pytest.approx(0.05482, abs=5e-5)


def test_the_fact_file_holds_the_step_the_tracer_counts():
    """Per layer and once, per dtype and attention: the ops of a step of L layers (bf16: clipping
    on its foreach path, fused AdamW)."""
    one = step_ops(768, 1, 12, 12, 2048, 32000, 1024, "bf16")
    two = step_ops(768, 2, 12, 12, 2048, 32000, 1024, "bf16")
    gqa = step_ops(768, 1, 12, 4, 2048, 32000, 1024, "bf16")
    assert (two.flops.shape[1] - one.flops.shape[1], one.flops.shape[1], one.optimizer_ops) == (248, 373, 15)
    assert gqa.flops.shape[1] - one.flops.shape[1] == 15  # repeat_kv's expand / clone / view, k and v
    # the matmuls' FLOPs per sequence: 6 · (weights of every matmul) · s, and attention's full square
    h, f, V, s = 768, 2048, 32000, 1024
    matmul = one.flops[1][~one.attention].sum()
    assert matmul == 6 * (4 * h * h + 3 * h * f + V * h) * s
    assert one.flops[1][one.attention].sum() == 14 * s * s * h  # forward 4, backward 10 (flash formulas)
    assert one.flops[0].sum() == 0.0


def test_the_fact_file_regenerates():
    """benchmarks/trace_step_ops.py traces the same table now (torch, transformers as installed)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.trace_step_ops import OUT_PATH, render, table_rows

    assert OUT_PATH.read_text(encoding="utf-8") == render(table_rows())
