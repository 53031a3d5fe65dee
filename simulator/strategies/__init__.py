"""Strategies: rules that turn a scenario into a plan. Names are stable CLI words.

A strategy is a function (scenario, timings) -> Plan registered with @register("name");
`timings[i]` gives node i's t_i(b) and memory limit whatever its source (given, profile,
catalog). Modules listed at the bottom register themselves on import.
"""
from __future__ import annotations

import math
from typing import Callable

from simulator.errors import InputError
from simulator.network import sync_s
from simulator.plan import NodePlan, Plan
from simulator.scenario import Scenario
from simulator.timing import NodeTiming, node_timings

Strategy = Callable[[Scenario, list[NodeTiming]], Plan]
STRATEGIES: dict[str, Strategy] = {}


def register(name: str) -> Callable[[Strategy], Strategy]:
    def add(fn: Strategy) -> Strategy:
        STRATEGIES[name] = fn
        return fn
    return add


def round_half_up(x: float) -> int:
    """Round to nearest, halves up (the paper's 4 × 1.45 = 5.8 → 6; Python's round() is banker's)."""
    return math.floor(x + 0.5)


def node_plan(timing: NodeTiming, batch_size: int, local_steps: int) -> NodePlan:
    return NodePlan(node=timing.node.name, gpus=timing.node.gpu_count, batch_size=batch_size,
                    local_steps=local_steps, step_s=timing.step_s(batch_size))


def uniform_plan(name: str, scenario: Scenario, nodes: list[NodePlan], note: str = "") -> Plan:
    """A plan whose rounds end with one ordinary outer sync over the scenario's network."""
    return Plan(strategy=name, nodes=tuple(nodes), comm_s=sync_s(scenario),
                seq_len=scenario.model.seq_len, note=note)


def make_plan(scenario: Scenario, strategy: str) -> Plan:
    """The plan of a named strategy; InputError for unknown names."""
    if strategy not in STRATEGIES:
        raise InputError(f"--strategy {strategy}: unknown strategy; expected one of {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy](scenario, node_timings(scenario))


# Registration happens on import; keep this list in the order strategies are printed.
from simulator.strategies import paper, measured, slowest, hybrid, sync_ddp, network_aware  # noqa: E402,F401
