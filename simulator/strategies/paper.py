"""The paper's strategies (PAPERS.md 000, Table 2): baseline, A, B and C.

A and C scale by F_i, the node's MEAN spec TFLOPS in the paper's convention
(`calibrate.catalog.spec_tflops`: the figures the paper used for its GPUs), normalised by the
smallest node mean. B doubles the batch while it fits in memory.
"""
from __future__ import annotations

from calibrate.catalog import get_gpu, spec_tflops
from simulator.strategies import node_plan, register, round_half_up, uniform_plan


def mean_spec_tflops(scenario, node) -> float:
    """F_i: mean spec TFLOPS of the node's GPUs, each GPU counted once (the paper's 'average performance')."""
    total = sum(count * spec_tflops(get_gpu(key), scenario.model.dtype) for key, count in node.gpus.items())
    return total / node.gpu_count


def normalized_speed(scenario, speed) -> list[float]:
    """speed(scenario, node) for every node, divided by the smallest."""
    values = [speed(scenario, node) for node in scenario.nodes]
    return [v / min(values) for v in values]


@register("baseline")
def baseline(scenario, timings):
    """Every node: b = batch_size, H = local_steps."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    return uniform_plan("baseline", scenario, [node_plan(t, b, h) for t in timings])


@register("A")
def strategy_a(scenario, timings):
    """b_i = round(b × F_i / min F)."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    scale = normalized_speed(scenario, mean_spec_tflops)
    return uniform_plan("A", scenario, [node_plan(t, round_half_up(b * s), h) for t, s in zip(timings, scale)])


@register("B")
def strategy_b(scenario, timings):
    """b_i = the largest of b, 2b, 4b, … that fits on every GPU of the node (b itself if none larger fits)."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    plans = []
    for timing in timings:
        batch = b
        while timing.fits(batch * 2):
            batch *= 2
        plans.append(node_plan(timing, batch, h))
    return uniform_plan("B", scenario, plans)


@register("C")
def strategy_c(scenario, timings):
    """H_i = round(H × F_i / min F)."""
    b, h = scenario.training.batch_size, scenario.training.local_steps
    scale = normalized_speed(scenario, mean_spec_tflops)
    return uniform_plan("C", scenario, [node_plan(t, b, round_half_up(h * s)) for t, s in zip(timings, scale)])
