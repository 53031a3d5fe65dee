"""Outer-sync time: all-reduce of the pseudo-gradient over the WAN plus the outer optimizer step.

Ring all-reduce among n nodes of a payload of P bytes (parameters × bytes of payload_dtype):

    t_ring = 2(n−1) · latency + 2(n−1)/n · P · 8 / (slowest link in bit/s)

where each node's link is min(network.bandwidth_gbps, node.uplink_gbps). The outer step then
forms Δ = θ_global − θ_i, divides the summed Δ and applies Nesterov SGD, on the CPU as OpenDiLoCo
does: OUTER_STEP_NS_PER_PARAM, measured (benchmarks/bench_outer_step.py), per parameter.

Bandwidth-balanced partitioned all-reduce (`collective = "partitioned"`; hivemind's butterfly
all-reduce with its load balancing). Node i aggregates a share p_i of the payload (Σ p = 1):
as a client it sends the (1 − p_i)·P it does not aggregate and downloads the same back
averaged; as an aggregator it receives (n − 1)·p_i·P and sends as much back. Over a
full-duplex link of B_i bit/s its time is (1 + (n − 2)·p_i)·P·8 / B_i, and the collective
takes the slowest node's time. hivemind solves min over p of max_i of that as a linear
program; it has a closed form (water-filling): with τ the time per bit,

    p_i = max(0, τ_w·B_i − 1) / (n − 2),   τ_w the value with Σ_i max(0, τ_w·B_i − 1) = n − 2
    τ   = max(τ_w, 1 / min_i B_i)

so slow links aggregate nothing and fast links take the rest; a node that aggregates nothing
still sends and receives its own payload once, hence the floor 1 / min B. Two latencies
(scatter, gather):

    t_partitioned = 2 · latency + τ · P · 8

With equal links τ = 2(n−1)/(n·B), the ring's bandwidth term; with one slow link the
partitioned collective approaches P·8 / B_slow against the ring's 2(n−1)/n · P·8 / B_slow.
Encoding (real/core/sync.py). Except the fused ring + fp32 all-reduce, the executor encodes and
decodes its payload on the CPU (or GPU): node i with segment L_i of the P parameters encodes
its n segments (P elements), decodes the n received versions of its own segment (n·L_i),
encodes the sum (L_i) and decodes the n gathered segments (P). With a network profile's
affine fits per payload dtype, enc(x) = a_e + c_e·4x and dec(x) = a_d + c_d·4x (per fp32
byte, simulator/models/netfit.py), the slowest node's time is

    t_codec = (n + 1)·a_e + 2n·a_d + 4P·(c_e + c_d) + 4·max_i L_i·(c_e + n·c_d)

which the all-reduce's time includes. Without encode/decode rows in the profile it is 0
(codec_note says so).

Measured links. A network profile with shaped-WAN all-reduce rows (`geodt calibrate network
--wan shaped --scenario S`, on the scenario's own links) replaces the byte count above by what
those links delivered: per payload dtype and collective, the ratio f = (measured − t_codec) /
t_bytes at each measured size, interpolated in log t_bytes between them and held beyond
(WireCost); rows of another dtype or collective leave that one at the byte count. f > 1 is what
TCP makes of the links (headers, ACKs queued behind data on a link busy both ways, flows
competing in one queue), and it grows with the size: tbf's burst and queue and the socket
buffers absorb the first few hundred KiB, so a line a + f·t_bytes through the points misprices
the sizes between them (measured, fp32 partitioned on 8/8/4 Mbit/s: f = 1.09 at 64 KiB, 1.55
at 1 MiB, 1.61 at 4 MiB; a relative-error line through 0 priced 1 MiB 16% short).

The functions ending in `_raw` take plain numbers or numpy arrays (leading axes are
independent scenarios), so the sweep computes exactly what the scalar path computes. The ring
formula, the water level and the shares are formats/wire.py's (the executor splits its
payload by the same shares).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from facts.catalog import get_gpu
from formats import wire
from formats.wire import PAYLOAD_BYTES
from simulator.models.timing import NodeTiming
from simulator.scenario import Scenario

CHECKPOINT_BYTES_PER_PARAM = 16  # fp32 global weights, outer momentum, AdamW exp_avg and exp_avg_sq
# The outer step on the CPU (pseudo-gradient, divide, Nesterov, copy back: real.core.diloco.OuterState), per
# parameter. Measured by benchmarks/bench_outer_step.py (rerun it to re-measure) on 2026-11-23 on this
# project's 2-core AMD EPYC, torch 2.13.0+cpu, 2 threads, 50 M fp32 parameters, the machine otherwise
# idle: four runs of 7 repeats gave medians of 2.313, 2.061, 2.241 and 2.272 ns per parameter (their
# median 2.26). It replaced a memory-bandwidth guess of 32 B/param on the GPU (11 ms for 215 M
# parameters; now 0.49 s).
OUTER_STEP_NS_PER_PARAM = 2.26
# The outer step in device memory: read θ_g, θ_i (8), momentum read + write (8), θ_g read + write (8),
# θ_i written back (4), Δ written and read (not fused: +4): 32 bytes per parameter, the old GPU guess.
OUTER_STEP_DEVICE_BYTES_PER_PARAM = 32
# A GPU's own PCIe link to the host, effective (PCIe 3.0 x16: the catalog's PCIe intra_node_gbps figure).
HOST_LINK_GBPS = 100.0


def link_gbps(scenario: Scenario) -> list[float]:
    """Each node's WAN link in Gbit/s."""
    return [wire.node_link_gbps(scenario.network.bandwidth_gbps, n.uplink_gbps) for n in scenario.nodes]


def payload_bytes(scenario: Scenario, payload_dtype: str | None = None) -> float:
    return scenario.model.param_count * PAYLOAD_BYTES[payload_dtype or scenario.network.payload_dtype]


def outer_step_s(scenario: Scenario, layouts=None) -> float:
    """The outer step after the all-reduce: the slowest node's (node_outer_step_s); unsharded
    nodes with the outer state on the CPU when `layouts` (one memory.Layout per node) is None."""
    if layouts is None:  # nodes alike in their profiles price alike: one figure per set of profiles
        hosts = {node.profile: node for node in scenario.nodes}
        return max(_host_outer_step_s(scenario, node) for node in hosts.values())
    return max(node_outer_step_s(scenario, node, layout) for node, layout in zip(scenario.nodes, layouts))


def profiled_host_figure(scenario: Scenario, node, figures: str, key: str) -> float | None:
    """One of the figures `geodt calibrate device` measured on the node's host (ProfileModel's
    dict `figures`, entry `key`): the slowest of its profiles, or None where one lacks it."""
    if not node.profile:
        return None
    index = scenario.nodes.index(node) if len(scenario.nodes) < 64 else None  # errors name nodes[i]
    values = [getattr(p, figures).get(key) for p in NodeTiming(scenario, node, index).profiles]
    return None if None in values or not values else max(values)


def profiled_outer_step_ns(scenario: Scenario, node, where: str) -> float | None:
    """The node's own outer step per parameter with the state on `where` ("cpu" | "device"), as its
    profiles measured it on its host (`geodt calibrate device`; the slowest of its profiles), or None."""
    return profiled_host_figure(scenario, node, "outer_step_ns_per_param", where)


def _host_outer_step_s(scenario: Scenario, node=None) -> float:
    """The outer step's arithmetic on a node's host: its profile's figure, else the network
    profile's measurement, else this VM's CPU figure (outer_step_source says which)."""
    own = profiled_outer_step_ns(scenario, node, "cpu") if node is not None else None
    if own is not None:
        return own * 1e-9 * scenario.model.param_count
    measured = scenario.network_model.outer_step if scenario.network_model is not None else None
    if measured is not None:
        return measured(scenario.model.param_count)
    return OUTER_STEP_NS_PER_PARAM * 1e-9 * scenario.model.param_count


def outer_step_source(scenario: Scenario) -> str:
    """One line saying where each node's outer-step rate comes from (its profile, the network
    profile, or this VM's default), for the commands' summaries."""
    network = scenario.network_model is not None and scenario.network_model.outer_step is not None
    parts = []
    for node in scenario.nodes:
        own = profiled_outer_step_ns(scenario, node, "cpu")
        parts.append(f"{node.name} {own:.2f} ns/param (its profile)" if own is not None else
                     f"{node.name} from the network profile" if network else
                     f"{node.name} {OUTER_STEP_NS_PER_PARAM} ns/param (this VM's default, not its host's)")
    return "outer step: " + ", ".join(parts)


def node_outer_step_s(scenario: Scenario, node, layout) -> float:
    """One node's outer step (pseudo-gradient, Nesterov, copy back) under its layout.

    outer_state = "cpu": the host's arithmetic over all Ψ parameters (_host_outer_step_s: the
    node's profile, else the network profile, else the default). A
    sharded node's G processes each do their Ψ/G, but on one host they share its memory
    bandwidth, which bounds this step, so together they take what one process takes for Ψ.
    A sharded GPU node also copies each shard device → host (θ_i) and host → device (the new
    θ_g), 2 · 4Ψ/G bytes per device over its own PCIe link at HOST_LINK_GBPS, in parallel. (An
    unsharded GPU node's copy is not counted, as before sharding existed: counting it would
    move every published result; it is 8Ψ / HOST_LINK_GBPS, 0.1 s for 150 M parameters. A
    profile's figure, timed with the weights on the GPU, includes it.)
    outer_state = "device": the node's profile's figure for its shard, else
    OUTER_STEP_DEVICE_BYTES_PER_PARAM per parameter of the
    device's shard (all of Ψ unsharded) through its memory, the slowest GPU's bandwidth; CPU
    devices keep the host figure."""
    n = scenario.model.param_count
    shard = n / layout.devices if layout.sharded else n
    cpu_devices = set(node.gpus) == {"cpu"}
    if layout.outer_state == "device" and not cpu_devices:
        own = profiled_outer_step_ns(scenario, node, "device")
        if own is not None:
            return own * 1e-9 * shard
        bandwidth_gbs = min(get_gpu(key).memory_bandwidth_gbs for key in node.gpus)
        return OUTER_STEP_DEVICE_BYTES_PER_PARAM * shard / (bandwidth_gbs * 1e9)
    host_s = _host_outer_step_s(scenario, node)
    if layout.sharded and not cpu_devices:
        host_s += 2 * 4 * shard * 8 / (HOST_LINK_GBPS * 1e9)
    return host_s


@dataclass(frozen=True)
class CodecCost:
    """encode / decode fits (simulator.models.netfit.AffineFit, per fp32 byte) per payload dtype."""

    fits: tuple[tuple[tuple[str, str], object], ...] = ()

    def fused(self, payload_dtype: str, collective: str) -> bool:
        return payload_dtype == "fp32" and collective == "ring"  # torch's own all-reduce, no encoding

    def seconds_raw(self, payload_dtype: str, collective: str, params, links_gbps) -> np.ndarray:
        """t_codec (module docstring) per row; links (..., n), params a number or (...,)."""
        links = np.asarray(links_gbps, dtype=float)
        fits = dict(self.fits)
        enc, dec = fits.get(("encode", payload_dtype)), fits.get(("decode", payload_dtype))
        n = links.shape[-1]
        if n == 1 or enc is None or dec is None or self.fused(payload_dtype, collective):
            return np.zeros(links.shape[:-1])
        shares = wire.partition_shares(links) if collective == "partitioned" else np.full(links.shape, 1.0 / n)
        elements = np.asarray(params, dtype=float)
        largest = shares.max(axis=-1) * elements
        return ((n + 1) * enc.fixed_s + 2 * n * dec.fixed_s + 4 * elements * (enc.per_unit_s + dec.per_unit_s)
                + 4 * largest * (enc.per_unit_s + n * dec.per_unit_s))


def wire_bytes_s_raw(collective: str, latency_ms: float, payload_bytes_: float, links_gbps) -> np.ndarray:
    """The byte-count price of one all-reduce (the formulas above, no encoding); links (..., n)."""
    links = np.asarray(links_gbps, dtype=float)
    if collective == "partitioned":
        return partitioned_allreduce_raw(latency_ms, payload_bytes_, links)
    return wire.ring_allreduce_s(links.shape[-1], latency_ms, payload_bytes_, links.min(axis=-1))


@dataclass(frozen=True)
class WireCost:
    """Per (payload_dtype, collective), the measured points (t_bytes, f) of shaped-WAN all-reduces,
    t_bytes increasing (module docstring); without points the byte count stands."""

    curves: tuple[tuple[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]], ...] = ()

    def factor_raw(self, payload_dtype: str, collective: str, bytes_s):
        """f at t_bytes (any shape): interpolated in log t_bytes, held beyond the points; None unmeasured."""
        curve = dict(self.curves).get((payload_dtype, collective))
        if curve is None:
            return None
        xs, ratios = curve
        with np.errstate(divide="ignore"):  # t_bytes = 0 (one node) takes the first ratio, times 0
            return np.interp(np.log(np.asarray(bytes_s, dtype=float)), np.log(xs), ratios)

    def seconds_raw(self, payload_dtype: str, collective: str, bytes_s):
        f = self.factor_raw(payload_dtype, collective, bytes_s)
        return bytes_s if f is None else f * np.asarray(bytes_s, dtype=float)


def wire_cost(scenario: Scenario, node: str | None = None) -> WireCost:
    """The network profile's shaped-WAN rows against the byte count on the scenario's links (none:
    the byte count); node: that node's own rows (its own end of each average) instead."""
    model = scenario.network_model
    if model is None:
        return WireCost()
    rows = model.shaped if node is None else [r[1:] for r in model.shaped_by_node if r[0] == node]
    links, codec = link_gbps(scenario), codec_cost(scenario)
    points: dict[tuple[str, str], dict[float, float]] = {}
    for dtype, collective, fp32_bytes, seconds in rows:
        params = fp32_bytes / 4
        t_bytes = bytes_s(scenario, collective, dtype, params)
        on_wire_s = seconds - float(codec.seconds_raw(dtype, collective, params, links))
        if t_bytes > 0 and on_wire_s > 0:
            points.setdefault((dtype, collective), {})[t_bytes] = on_wire_s / t_bytes
    return WireCost(tuple((key, (tuple(sorted(pts)), tuple(pts[x] for x in sorted(pts))))
                          for key, pts in sorted(points.items())))


def node_sync_offsets_s(scenario: Scenario, payload_dtype: str, collective: str,
                        fragments: int = 1) -> np.ndarray | None:
    """Per node, its own end of the all-reduce (of 1/fragments of the payload) less the
    collective's (≤ 0: the collective's rows are each repeat's slowest), where the network profile
    measured every node's own times for this dtype and collective; else None.

    On unequal links the nodes end one average at different times: measured fp32 partitioned on
    8/8/4 Mbit/s, 1 MiB, 2.83 s on the two fast links and 3.53 s on the slow one (its link busy
    both ways, its ACKs queue behind its data). A node that ends early starts its next round
    early and waits for the others at the next barrier instead (simulator/engines/engine_analytic.py)."""
    model = scenario.network_model
    if model is None or not model.shaped_by_node:
        return None
    t_bytes = bytes_s(scenario, collective, payload_dtype, scenario.model.param_count / fragments)
    whole = wire_cost(scenario).factor_raw(payload_dtype, collective, t_bytes)
    own = [wire_cost(scenario, n.name).factor_raw(payload_dtype, collective, t_bytes) for n in scenario.nodes]
    if whole is None or any(f is None for f in own):
        return None
    return (np.array(own, dtype=float) - float(whole)) * t_bytes


def wire_note(scenario: Scenario) -> str:
    """What the simulator's sync prices for the links, for the outputs (f at the scenario's payload)."""
    wire = wire_cost(scenario)
    if not wire.curves:
        return "links priced by their byte count"
    listed = ", ".join(f"{d} {c} ×{float(wire.factor_raw(d, c, bytes_s(scenario, c, d))):.2f}"
                       for (d, c), _ in wire.curves)
    note = f"links priced as measured on the shaped WAN ({listed} the byte count)"
    offsets = node_sync_offsets_s(scenario, scenario.network.payload_dtype, scenario.network.collective)
    if offsets is not None:
        ends = ", ".join(f"{n.name} {o:+.2f} s" for n, o in zip(scenario.nodes, offsets))
        note += f"; each node's own end of it as measured ({ends})"
    return note


def codec_cost(scenario: Scenario) -> CodecCost:
    """The scenario's network profile's encode/decode fits (none: every encoding costs 0)."""
    model = scenario.network_model
    return CodecCost(model.codec if model is not None else ())


def codec_note(scenario: Scenario) -> str:
    """What the simulator's sync prices for encoding, for the outputs."""
    model = scenario.network_model
    if model is not None and model.codec_measured:
        return f"encode/decode priced from {model.source}"
    return ("encode/decode of the payload priced at 0 (no encode/decode rows: "
            + ("no network profile" if model is None else f"{model.source} predates them") + ")")


def codec_s(scenario: Scenario, payload_dtype: str | None = None, collective: str | None = None,
            fragments: int = 1) -> float:
    """t_codec of one sync of 1/fragments of the model (module docstring)."""
    return float(codec_cost(scenario).seconds_raw(payload_dtype or scenario.network.payload_dtype,
                                                  collective or scenario.network.collective,
                                                  scenario.model.param_count / fragments, link_gbps(scenario)))


def bytes_s(scenario: Scenario, collective: str, payload_dtype: str | None = None,
            params: float | None = None) -> float:
    """The byte-count time of one all-reduce by `collective` of `params` parameters (default the
    model's) as payload_dtype on the scenario's links (no encoding, no measured links)."""
    count = scenario.model.param_count if params is None else params
    payload = count * PAYLOAD_BYTES[payload_dtype or scenario.network.payload_dtype]
    return float(wire_bytes_s_raw(collective, scenario.network.latency_ms, payload, link_gbps(scenario)))


def ring_allreduce_s(scenario: Scenario, payload_dtype: str | None = None) -> float:
    return bytes_s(scenario, "ring", payload_dtype)


def partitioned_seconds_per_gbit(links_gbps) -> np.ndarray:
    """τ (seconds per Gbit of payload) of the balanced partitioned all-reduce; links (..., n)."""
    links = np.asarray(links_gbps, dtype=float)
    floor = 1.0 / links.min(axis=-1)  # every node sends and receives its own payload once
    if links.shape[-1] <= 2:
        return floor
    return np.maximum(wire.water_level(links), floor)


def partitioned_allreduce_raw(latency_ms: float, payload_bytes_: float, links_gbps):
    """Balanced partitioned all-reduce time; links_gbps (..., n)."""
    links = np.asarray(links_gbps, dtype=float)
    if links.shape[-1] == 1:
        return 0.0 * links[..., 0]
    return 2 * (latency_ms / 1e3) + partitioned_seconds_per_gbit(links) * (payload_bytes_ * 8 / 1e9)


def partitioned_allreduce_s(scenario: Scenario, payload_dtype: str | None = None) -> float:
    return bytes_s(scenario, "partitioned", payload_dtype)


def allreduce_s(scenario: Scenario, payload_dtype: str | None = None, collective: str | None = None) -> float:
    """The all-reduce of the payload by `collective` (default: the scenario's network.collective),
    its encoding and decoding included (codec_s)."""
    collective = collective or scenario.network.collective
    dtype = payload_dtype or scenario.network.payload_dtype
    wire_s = wire_cost(scenario).seconds_raw(dtype, collective, bytes_s(scenario, collective, dtype))
    return float(wire_s) + codec_s(scenario, dtype, collective)


def checkpoint_s(scenario: Scenario) -> float:
    """The executor's checkpoint after each sync, from a network profile's measured write rate.

    Every node writes the same state (global weights, outer momentum, its two AdamW moments:
    CHECKPOINT_BYTES_PER_PARAM), so it delays every node alike; 0 when nothing was measured."""
    measured = scenario.network_model.checkpoint if scenario.network_model is not None else None
    return measured(CHECKPOINT_BYTES_PER_PARAM * scenario.model.param_count) if measured is not None else 0.0


def sync_s(scenario: Scenario, payload_dtype: str | None = None, collective: str | None = None,
           layouts=None) -> float:
    """comm_s of one outer sync (docs/DESIGN.md): the all-reduce plus the outer optimizer step.

    A sharded node's devices each hold 1/G of the pseudo-gradient: the sync is G all-reduces,
    one per shard index, run at once among the nodes; their streams share the node's uplink, so
    its bytes (2(n−1)/n · P for a ring) and the all-reduce's time are those of one unsharded
    all-reduce (the uplink, not the G streams, is the bottleneck)."""
    return allreduce_s(scenario, payload_dtype, collective) + outer_step_s(scenario, layouts)
