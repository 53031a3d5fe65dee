"""geodt's own strategies (C-slowest, hybrid, network-aware, sync-ddp) and the partitioned all-reduce."""
from __future__ import annotations

import numpy as np
import pytest

from formats.wire import partition_shares
from simulator.engines.engine import simulate, summary
from simulator.models.network import (
    allreduce_s,
    link_gbps,
    partitioned_allreduce_s,
    partitioned_seconds_per_gbit,
    ring_allreduce_s,
    sync_s,
)
from simulator.models.timing import node_timings
from simulator.scenario import load_scenario
from simulator.strategies import make_plan
from simulator.strategies.hybrid import TOLERANCE, capacity, least_round_s
from simulator.strategies.network_aware import TARGET_UTILIZATION
from simulator.strategies.tables import from_scenario

# These tests were written for the paper scenario in bf16 with fp32 payloads (its defaults until
# it took OpenDiLoCo's fp16 / fp16); they pin those settings so their thresholds keep their meaning.
BF16_FP32 = ["model.dtype=bf16", "network.payload_dtype=fp32"]


@pytest.fixture(scope="module")
def paper():
    return load_scenario("paper", BF16_FP32)


def samples(plan):
    return sum(n.batch_size * n.local_steps * n.gpus for n in plan.nodes)


def test_c_slowest_takes_the_slowest_gpu(paper):
    # slowest spec TFLOPS per node: 113.8, 113.8 (2080 Ti beside the TITAN RTX), 165, 125 (V100 beside the 3090)
    plan = make_plan(paper, "C-slowest")
    assert [n.local_steps for n in plan.nodes] == [100, 100, 145, 110]
    assert [n.batch_size for n in plan.nodes] == [4, 4, 4, 4]


def test_hybrid_meets_the_done_when_on_paper(paper):
    base, plan = make_plan(paper, "baseline"), make_plan(paper, "hybrid")
    # the exact (b_i, H_i) follow the memory and timing models; what must hold whatever they say:
    assert len({n.batch_size for n in plan.nodes}) > 1 and plan.round_s < base.round_s / 2
    k = samples(base)
    assert k <= samples(plan) <= k + int(TOLERANCE * k)  # equal token budget, within +1%
    idle = lambda p: summary(simulate(paper, p, "analytic"), p)["idle_s"].sum()
    assert idle(plan) <= 0.10 * idle(base)  # the issue asks <= 10% of baseline's idle (C leaves far more)
    assert idle(make_plan(paper, "C")) > 0.5 * idle(base)


def test_hybrid_respects_memory_and_the_integer_floor(paper):
    plan = make_plan(paper, "hybrid")
    longest = max(n.compute_s for n in plan.nodes)
    for timing, node in zip(node_timings(paper), plan.nodes):
        assert timing.fits(node.batch_size)
        assert longest - node.compute_s < node.step_s  # idle below one step per node per round


def test_hybrid_round_time_is_the_least_with_enough_capacity(paper):
    tables, _ = from_scenario(paper, node_timings(paper))
    budget = tables.baseline_samples()
    best = least_round_s(tables, budget)
    plan = make_plan(paper, "hybrid")
    assert max(n.compute_s for n in plan.nodes) <= best[0]
    assert capacity(tables, best * (1 - 1e-9))[0] < budget[0]  # no shorter round can hold the budget


@pytest.mark.parametrize("overrides", [[], ["nodes.slowest.step_time_s=0.9"], ["training.batch_size=3"],
                                       ["training.local_steps=7", "training.batch_size=1"]])
def test_hybrid_budget_window_on_other_clusters(overrides):
    scenario = load_scenario("hetero-cpu", overrides)
    base, plan = make_plan(scenario, "baseline"), make_plan(scenario, "hybrid")
    k = samples(base)
    assert k <= samples(plan) <= k + int(TOLERANCE * k)
    assert all(n.local_steps >= 1 for n in plan.nodes)
    assert plan.round_s <= base.round_s


def test_sync_ddp_splits_the_global_batch_by_speed():
    scenario = load_scenario("hetero-cpu", ["model.seq_len=128"])  # step times 0.06, 0.08, 0.11, 0.15 s at b = 4; G = 16
    plan = make_plan(scenario, "sync-ddp")
    # the split follows each node's t(b) shape (given step time × the catalog estimate's t(b)/t(4));
    # the physics estimate (simulator.models.estimate) gives the nominal cpu device a larger fixed share than
    # the old 40%-of-peak one did ([8, 5, 2, 1] then); CPU devices run the eager step ([training] compile
    # auto: off on CPU), whose estimate has a larger per-sample share than the lean one ([7, 4, 3, 2] then)
    assert [n.batch_size for n in plan.nodes] == [6, 5, 3, 2]
    assert [n.local_steps for n in plan.nodes] == [1, 1, 1, 1]
    assert plan.rounds == scenario.training.rounds * scenario.training.local_steps
    assert plan.comm_s == allreduce_s(scenario)  # gradients only: no outer optimizer step
    timeline = simulate(scenario, plan, "simpy")
    assert timeline["round"].nunique() == plan.rounds
    assert summary(timeline, plan)["tokens"].sum() == summary(
        simulate(scenario, make_plan(scenario, "baseline"), "simpy"), make_plan(scenario, "baseline"))["tokens"].sum()


def test_sync_ddp_engines_agree_with_jitter():
    scenario = load_scenario("hetero-cpu", ["simulation.jitter_cv=0.2"])
    plan = make_plan(scenario, "sync-ddp")
    a, b = simulate(scenario, plan, "simpy"), simulate(scenario, plan, "analytic")
    np.testing.assert_allclose(a["idle_s"], b["idle_s"], atol=1e-9)


# At 1 Gbit/s the round doubles (it was 1x under the old 40%-of-peak estimate): the physics estimate's
# bf16 steps on the paper's cluster are shorter, so one round of the baseline's tokens no longer reaches
# the 90% utilisation target.
@pytest.mark.parametrize("bandwidth, dtype, multiple", [(10.0, "fp32", 1), (1.0, "int8", 2), (0.1, "int8", 8)])
def test_network_aware_picks_payload_and_round_length(bandwidth, dtype, multiple):
    scenario = load_scenario("paper", [*BF16_FP32, f"network.bandwidth_gbps={bandwidth}"])
    plan = make_plan(scenario, "network-aware")
    hybrid = make_plan(scenario, "hybrid")
    assert plan.payload_dtype == dtype and plan.collective == "partitioned"
    assert plan.comm_s == sync_s(scenario, dtype, "partitioned")
    assert samples(plan) == pytest.approx(multiple * samples(hybrid), rel=0.011)
    utilization = sum(n.compute_s for n in plan.nodes) / (len(plan.nodes) * plan.round_s)
    assert (utilization >= TARGET_UTILIZATION) == (bandwidth >= 1.0)


def test_network_aware_uses_per_node_links():
    scenario = load_scenario("paper", [*BF16_FP32, "nodes.node1.uplink_gbps=0.1"])
    plan = make_plan(scenario, "network-aware")
    assert plan.collective == "partitioned"
    assert plan.comm_s < make_plan(scenario, "hybrid").comm_s / 4  # ring pays 1.5 P / B_slow, fp32


def test_partitioned_allreduce_balances_bandwidth():
    scenario = load_scenario("paper", [*BF16_FP32, "network.collective=partitioned"])
    # equal links: the ring's bandwidth term, and 2 latencies instead of 2(n-1) = 6 (1 ms each)
    assert sync_s(scenario) == pytest.approx(sync_s(load_scenario("paper", BF16_FP32)) - 4e-3, abs=1e-9)
    assert partitioned_seconds_per_gbit([1.0, 1.0, 1.0, 1.0]) == pytest.approx(1.5)  # 2(n-1)/n
    assert partitioned_seconds_per_gbit([0.1, 1.0, 1.0, 1.0]) == pytest.approx(10.0)  # the slow link sends P once
    assert partitioned_seconds_per_gbit([3.0, 2.0, 1.0, 0.5]) == pytest.approx(2.0)
    np.testing.assert_allclose(partition_shares([3.0, 2.0, 1.0, 0.5]), [0.7, 0.3, 0.0, 0.0])
    slow = load_scenario("paper", [*BF16_FP32, "nodes.node1.uplink_gbps=0.1", "network.collective=partitioned"])
    assert link_gbps(slow) == [0.1, 1.0, 1.0, 1.0]
    assert partitioned_allreduce_s(slow) < ring_allreduce_s(slow) / 1.45


def test_partitioned_is_optimal_against_random_splits():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(3, 7))
        links = rng.uniform(0.1, 10, n)
        tau = partitioned_seconds_per_gbit(links)
        splits = rng.dirichlet(np.ones(n), size=5000)
        assert tau <= ((1 + (n - 2) * splits) / links).max(axis=1).min() + 1e-12
        p = partition_shares(links)
        assert p.sum() == pytest.approx(1) and ((1 + (n - 2) * p) / links).max() <= tau * (1 + 1e-12)
