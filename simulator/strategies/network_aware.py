"""`network-aware`: plan compute and the sync together, with per-node links.

The paper's second item of future work. Rule:

1. Collective: the faster, for the nodes' own links (`uplink_gbps`), of the ring all-reduce
   and the bandwidth-balanced partitioned all-reduce (`simulator.models.network`: each node
   aggregates a share of the payload in proportion to what its link can carry, as
   hivemind's load balancing does; slow links aggregate nothing).
2. Compute: the `hybrid` allocation (b_i, H_i balanced within memory) at m times the
   baseline's samples per round, m in H_MULTIPLIERS (m = 2 makes rounds about twice as
   long, like doubling H, so the sync is paid half as often per token).
3. Payload dtype and m: the first candidate, in the order below, whose utilisation
   Σ compute / (n × (T_max + comm)) reaches TARGET_UTILIZATION; if none does, the candidate
   with the highest utilisation. Order (least change to the training recipe first): the
   scenario's payload dtype, then each smaller one (fp32 → fp16 → int8) at m = 1; then the
   payload whose sync is the shortest at m = 2, 4, 8: the smallest, unless the network
   profile measured an encoding that costs more than its bytes save (simulator/models/network.py,
   t_codec), as on a fast link int8's quantisation can cost more than fp32's 4× bytes. Compression
   comes before longer rounds because 16-bit pseudo-gradients are what OpenDiLoCo all-reduces and
   8-bit ones what INTELLECT-1 used, while DiLoCo's own ablation loses quality as H grows past a few
   hundred steps.

TARGET_UTILIZATION = 0.90: the sync may take a tenth of each round. That is the ratio the
paper's own cluster had (10.3 s of sync after 96.7 s of balanced compute at 1 Gbit/s:
0.90), so the target keeps the paper's compute-to-communication ratio whatever the
bandwidth and however much faster the balanced compute phase becomes.
"""
from __future__ import annotations

import numpy as np

from formats.wire import COLLECTIVES, PAYLOAD_BYTES
from simulator.strategies.hybrid import hybrid_decide
from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables

TARGET_UTILIZATION = 0.90
H_MULTIPLIERS = (1, 2, 4, 8)


FASTEST = "fastest"  # the candidate dtype whose sync is the shortest, per row


def candidates(payload_dtype: str) -> list[tuple[str, int]]:
    """(payload dtype, budget multiple) in order of preference (module docstring, step 3)."""
    dtypes = [d for d in PAYLOAD_BYTES if PAYLOAD_BYTES[d] <= PAYLOAD_BYTES[payload_dtype]]
    return [(d, 1) for d in dtypes] + [(FASTEST, m) for m in H_MULTIPLIERS[1:]]


def fastest_sync(syncs: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(comm_s, collective index, dtype) per row of the dtype with the shortest sync; on a tie
    the smallest payload (so, encoding unpriced, always the smallest, as before encoding was)."""
    order = list(syncs)[::-1]  # smallest payload first: argmin keeps the first of equals
    comm = np.stack([syncs[d][0] for d in order])
    best = comm.argmin(axis=0)
    which = np.stack([syncs[d][1] for d in order])
    cols = np.arange(comm.shape[1])
    return comm[best, cols], which[best, cols], np.array(order, dtype=object)[best]


def sync_options(net: NetTables, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(comm_s, collective index) per row: the faster collective's all-reduce, its encoding
    and decoding included (NetTables.allreduce_s), plus the outer step; one fragment's (the
    scenario's fragments)."""
    ring = net.allreduce_s(dtype, "ring", fragments=net.fragments)
    part = net.allreduce_s(dtype, "partitioned", fragments=net.fragments)
    which = (part < ring).astype(np.int64)
    return np.where(which == 1, part, ring) + net.outer_step_s / net.fragments, which


def network_aware_decide(tables: NodeTables, net: NetTables) -> dict[str, np.ndarray]:
    """batch, steps (S, n); comm_s, collective (index into COLLECTIVES), dtype, multiple (S,)."""
    rows, n = tables.gpus.shape
    options = candidates(net.payload_dtype)
    syncs = {d: sync_options(net, d) for d in dict.fromkeys(d for d, _ in options if d != FASTEST)}
    comm, which, chosen = fastest_sync(syncs)
    syncs[FASTEST] = (comm, which)
    plans = {m: hybrid_decide(tables, tables.baseline_samples() * m) for m in dict.fromkeys(m for _, m in options)}
    utils = np.empty((rows, len(options)))
    for k, (dtype, m) in enumerate(options):
        batch, steps = plans[m]
        compute = steps * np.take_along_axis(tables.step_s, (batch - 1)[:, :, None], axis=2)[:, :, 0]
        utils[:, k] = compute.sum(axis=1) / (n * (compute.max(axis=1) + net.fragments * syncs[dtype][0]))
    meets = utils >= TARGET_UTILIZATION
    pick = np.where(meets.any(axis=1), meets.argmax(axis=1), utils.argmax(axis=1))
    out = {"batch": np.empty((rows, n), np.int64), "steps": np.empty((rows, n), np.int64),
           "comm_s": np.empty(rows), "collective": np.empty(rows, np.int64),
           "dtype": np.empty(rows, dtype=object), "multiple": np.empty(rows, np.int64),
           "utilization": utils[np.arange(rows), pick]}
    for k, (dtype, m) in enumerate(options):
        sel = pick == k
        out["batch"][sel], out["steps"][sel] = plans[m][0][sel], plans[m][1][sel]
        out["comm_s"][sel], out["collective"][sel] = syncs[dtype][0][sel], syncs[dtype][1][sel]
        out["dtype"][sel], out["multiple"][sel] = (chosen[sel] if dtype == FASTEST else dtype), m
    return out


def _note(d: dict, tables: NodeTables) -> str:
    collective, dtype, m = d["collective"][0], d["dtype"][0], int(d["multiple"][0])
    met = "meets" if d["utilization"][0] >= TARGET_UTILIZATION else "best reachable, below"
    return (f"{collective} all-reduce, {dtype} payload, {m}x the baseline's samples per round; "
            f"utilisation {d['utilization'][0]:.3f} ({met} the {TARGET_UTILIZATION:.2f} target)")


@register("network-aware",
          "hybrid's compute, plus the collective, payload dtype and H chosen for the links", note=_note)
def strategy_network_aware(tables: NodeTables, net: NetTables) -> dict:
    """Faster collective for the per-node links; hybrid compute; payload dtype and H scaled to reach 90% utilisation."""
    d = network_aware_decide(tables, net)
    return {**d, "collective": np.array(COLLECTIVES)[d["collective"]]}
