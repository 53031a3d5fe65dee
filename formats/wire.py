"""The wire registry: what travels between nodes in an outer sync, and the rules both sides share.

One entry each, read by the simulator (which times a sync) and the executor (which runs it):

- MODEL_DTYPES: the training dtypes a scenario, a profile and the GPU catalog may name.
- COLLECTIVES: how the nodes all-reduce the pseudo-gradients (simulator/models/network.py times
  each, real/core/sync.py runs each).
- PAYLOAD_BYTES: what the pseudo-gradients travel as, in bytes per element; int8 also sends
  one fp32 scale per INT8_CHUNK elements (`encoded_bytes`).
- AVERAGING_MODES: how the nodes' pseudo-gradients are weighted ([diloco] averaging).
- `node_link_gbps`: a node's WAN link, min(network bandwidth, its own uplink) (plan.csv's link_gbps,
  the simulator's links).
- `partition_shares`: the water-filling shares of a bandwidth-balanced partitioned all-reduce
  (derivation in simulator/models/network.py's docstring), vectorised over leading axes.
- `ring_allreduce_s`: the ring all-reduce time 2(n−1)·latency + 2(n−1)/n · 8·P / B.
- `bytes_sent_per_sync`: the bytes each node puts on the wire in one sync (trace.csv's bytes_sent).

Adding a collective or a payload dtype is one entry here plus its code on each side (its time
in simulator/models/network.py, its implementation in real/core/sync.py). Torch-free; numpy only.
"""
from __future__ import annotations

import math

import numpy as np

MODEL_DTYPES = ("bf16", "fp16", "fp32")
COLLECTIVES = ("ring", "partitioned")
# Bytes per element on the wire, largest first (network-aware tries them in this order).
PAYLOAD_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}
INT8_CHUNK = 256  # elements per int8 scale (one fp32 scale per chunk)
AVERAGING_MODES = ("uniform", "tokens", "normalized")


def node_link_gbps(bandwidth_gbps: float, uplink_gbps: float | None) -> float:
    """A node's WAN link in Gbit/s: the network's bandwidth, or the node's own uplink where slower."""
    return min(bandwidth_gbps, uplink_gbps) if uplink_gbps else bandwidth_gbps


def ring_allreduce_s(n: int, latency_ms: float, payload_bytes: float, slowest_gbps):
    """Ring all-reduce among n over links whose slowest is slowest_gbps (may be an array)."""
    if n == 1:
        return 0.0 * slowest_gbps
    latency_s = latency_ms / 1e3
    bits = payload_bytes * 8
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * bits / (slowest_gbps * 1e9)


def water_level(links: np.ndarray) -> np.ndarray:
    """τ_w (n >= 3): the time per Gbit at which the partitioned all-reduce's aggregators balance."""
    n = links.shape[-1]
    ordered = -np.sort(-links, axis=-1)  # fastest first
    k = np.arange(1, n + 1, dtype=float)
    # If the k fastest links aggregate, Σ_{top k} (τ·B − 1) = n − 2 gives τ_k = (n − 2 + k) / Σ_{top k} B.
    tau_k = (n - 2 + k) / np.cumsum(ordered, axis=-1)
    # τ_k is right when the k-th fastest link still aggregates (τ_k·B_k ≥ 1) and the next would not.
    valid = tau_k * ordered >= 1.0
    last = n - 1 - np.argmax(valid[..., ::-1], axis=-1)  # the largest valid k (k = 1 is always valid)
    return np.take_along_axis(tau_k, last[..., None], axis=-1)[..., 0]


def partition_shares(links_gbps) -> np.ndarray:
    """p_i, the share of the payload node i aggregates (Σ p = 1 over the last axis), minimising
    the slowest node's time (1 + (n − 2)·p_i)·P / B_i: water-filling, slow links aggregate
    nothing. n ≤ 2: shares ∝ links."""
    links = np.asarray(links_gbps, dtype=float)
    n = links.shape[-1]
    if n <= 2:
        return links / links.sum(axis=-1, keepdims=True)
    tau = water_level(links)[..., None]
    return np.maximum(0.0, tau * links - 1.0) / (n - 2)


def segment_lengths(total: int, shares) -> list[int]:
    """Split `total` elements by shares into integers summing to total (largest remainder)."""
    exact = [float(s) * total for s in shares]
    lengths = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - lengths[i]), i))
    for i in order[:total - sum(lengths)]:
        lengths[i] += 1
    return lengths


def encoded_bytes(elements: int, payload_dtype: str) -> int:
    """Bytes of `elements` values encoded as payload_dtype (int8: one fp32 scale per INT8_CHUNK)."""
    if payload_dtype == "int8":
        return elements + 4 * -(-elements // INT8_CHUNK)
    return elements * PAYLOAD_BYTES[payload_dtype]


def sync_segments(params: int, collective: str, links_gbps) -> list[int]:
    """Elements of the payload each node aggregates: P/n for ring, p_i·P for partitioned."""
    n = len(links_gbps)
    shares = partition_shares(links_gbps) if collective == "partitioned" else [1.0 / n] * n
    return segment_lengths(params, shares)


def bytes_sent_per_sync(params: int, payload_dtype: str, collective: str, links_gbps) -> list[int]:
    """Bytes each node puts on the wire in one outer sync (what trace.csv's bytes_sent records).

    fp32 ring: torch's all-reduce, counted as a ring: 2(n−1)/n · 4P (rounded down).
    Otherwise a reduce-scatter then an all-gather, both as all-to-all of encoded segments:
    node i sends every other node j its segment j (Σ_{j≠i} E(L_j)), then its aggregated
    segment to the n − 1 others ((n−1)·E(L_i)); L_j = P/n for ring, p_j·P for partitioned,
    E(L) = encoded_bytes(L). Equal links: ≈ 2(n−1)/n · E(P); partitioned ≈ (1 + (n−2)p_i)·E(P).
    """
    n = len(links_gbps)
    if n == 1:
        return [0]
    if collective == "ring" and payload_dtype == "fp32":
        return [2 * (n - 1) * 4 * params // n] * n
    enc = [encoded_bytes(length, payload_dtype) for length in sync_segments(params, collective, links_gbps)]
    return [sum(enc) - enc[i] + (n - 1) * enc[i] for i in range(n)]
