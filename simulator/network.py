"""Outer-sync time: all-reduce of the pseudo-gradient over the WAN plus the outer optimizer step.

Ring all-reduce among n nodes of a payload of P bytes (parameters × bytes of payload_dtype):

    t_ring = 2(n−1) · latency + 2(n−1)/n · P · 8 / (slowest link in bit/s)

where each node's link is min(network.bandwidth_gbps, node.uplink_gbps). The outer step then
forms Δ = θ_global − θ_i and applies Nesterov SGD on every node: OUTER_BYTES_PER_PARAM bytes of
fp32 memory traffic per parameter on the node with the slowest memory.
"""
from __future__ import annotations

from calibrate.catalog import get_gpu
from simulator.scenario import PAYLOAD_BYTES, Scenario

OUTER_BYTES_PER_PARAM = 32  # Δ: read 2 write 1 (12); Nesterov: read θ, Δ, m, write m, θ (20)


def link_gbps(scenario: Scenario) -> list[float]:
    """Each node's WAN link in Gbit/s."""
    bw = scenario.network.bandwidth_gbps
    return [min(bw, n.uplink_gbps) if n.uplink_gbps else bw for n in scenario.nodes]


def payload_bytes(scenario: Scenario, payload_dtype: str | None = None) -> float:
    return scenario.model.param_count * PAYLOAD_BYTES[payload_dtype or scenario.network.payload_dtype]


def outer_step_s(scenario: Scenario) -> float:
    slowest_bw_gbs = min(get_gpu(k).memory_bandwidth_gbs for n in scenario.nodes for k in n.gpus)
    return OUTER_BYTES_PER_PARAM * scenario.model.param_count / (slowest_bw_gbs * 1e9)


def ring_allreduce_s(scenario: Scenario, payload_dtype: str | None = None) -> float:
    n = len(scenario.nodes)
    if n == 1:
        return 0.0
    latency_s = scenario.network.latency_ms / 1e3
    bits = payload_bytes(scenario, payload_dtype) * 8
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * bits / (min(link_gbps(scenario)) * 1e9)


def sync_s(scenario: Scenario, payload_dtype: str | None = None) -> float:
    """comm_s of one outer sync (DESIGN.md): the all-reduce plus the outer optimizer step."""
    return ring_allreduce_s(scenario, payload_dtype) + outer_step_s(scenario)
