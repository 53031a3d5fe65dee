"""Nodes that differ only in their given step_time_s share one catalog estimate (simulator/models/timing.py
catalog_signature): planning a fleet of distinct measured step times costs about one node's estimates, and
gives the same step times as nodes estimated each on its own (issue 58: 20,000 nodes spent 4.8 CPU s planning)."""
from __future__ import annotations

import numpy as np

import simulator.models.timing as timing
from simulator.scenario import ModelConfig, NodeConfig, Scenario, TrainingConfig
from simulator.strategies import make_plan


def fleet(step_times_s) -> Scenario:
    nodes = tuple(NodeConfig(name=f"n{i}", gpus={"a30": 1}, step_time_s=float(s)) for i, s in enumerate(step_times_s))
    scenario = Scenario(name="fleet", nodes=nodes, model=ModelConfig(preset="llama-150m"),
                        training=TrainingConfig(rounds=3, local_steps=10, batch_size=4))
    scenario.model.resolve(None)
    return scenario


def test_distinct_step_times_estimate_each_batch_once(monkeypatch):
    scenario = fleet(np.random.default_rng(0).uniform(0.1, 0.5, 64))
    calls = []
    real = timing.NodeTiming.estimate_s
    monkeypatch.setattr(timing.NodeTiming, "estimate_s", lambda self, b: calls.append(b) or real(self, b))
    make_plan(scenario, "A")
    assert len(calls) == len(set(calls))  # one estimate per batch for all 64 nodes (64 per batch before)


def test_shared_estimates_give_each_node_its_own_step_times():
    scenario = fleet([0.1, 0.25, 0.4])
    shared = timing.node_timings(scenario)
    alone = [timing.NodeTiming(scenario, node, i) for i, node in enumerate(scenario.nodes)]
    for a, b in zip(shared, alone):
        assert [a.step_s(batch) for batch in range(1, 17)] == [b.step_s(batch) for batch in range(1, 17)]
        assert a.step_s(4) == a.node.step_time_s
    assert shared[0].step_s(8) != shared[1].step_s(8)
