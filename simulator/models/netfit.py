"""Network profiles: the measured cost of an outer sync, and the fits the simulator uses (torch-free).

`geodt calibrate network` (geodt/calibration/links.py) times, between real processes of this machine
(or of a torchrun job), the three parts of a DiLoCo sync that the simulator must predict:

- kind `all_reduce`: a SUM all-reduce of `size` bytes of fp32 among `processes` ranks;
- kind `outer_step`: the executor's outer step over `size` parameters (pseudo-gradient,
  Nesterov SGD, copy back into the model), run on every rank at once (the slowest rank's time);
- kind `checkpoint`: writing a checkpoint of `size` bytes as the executor does (temp, rename);
- kind `snapshot`: copying `size` bytes of state into host memory, the part of a checkpoint that
  blocks training (the write runs in the background; real/checkpoint/checkpoint.py);
- kinds `encode` / `decode`: real/core/sync.py's encode() of `size` fp32 elements into
  `payload_dtype` (fp16 cast; int8 with one fp32 scale per 256 values) and decode() back.

One row per (kind, processes, size[, payload_dtype, collective]), tidy CSV. `NetworkModel` fits:

- all-reduce, jointly over every process count n, the ring model
      t = 2(n−1)·latency + 2(n−1)/n · 8·bytes / bandwidth
  (linear in latency and 1/bandwidth; relative residuals, as step-time profiles are fitted,
  because sizes span orders of magnitude);
- outer step t = a + c·params, checkpoint t = a + bytes / write_rate, snapshot likewise, each by the same
  weighted least squares;
- encode and decode, per payload dtype, t = a + c·bytes, bytes the fp32 values' (4 per
  element) whichever way the data flows, so the fits of the three dtypes compare per byte of
  pseudo-gradient. A profile without these rows (older ones) prices them at 0, and
  NetworkModel.codec_measured says so.

The all-reduce fit takes the fp32 ring rows of backend gloo (all rows in older profiles).
Rows measured over a shaped WAN (backend `gloo+shaped`, `geodt calibrate network --wan
shaped --scenario S`: the scenario's own links) are kept whole in NetworkModel.shaped; the
simulator (simulator/models/network.py WireCost) fits them against its byte-count price on those
links, per payload dtype and collective, so what TCP makes of the links is priced as measured;
rows naming a node (NetworkModel.shaped_by_node) are that node's own times in the same
measurement, from which the simulator takes each node's own sync end.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from formats.netprofile import CODEC_KINDS, SHAPED_BACKEND, NetProfileError, read_network_rows
from formats.wire import ring_allreduce_s


def _relative_lstsq(design: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares of design @ x ≈ seconds, minimising relative residuals (weights 1/t)."""
    weights = 1.0 / seconds
    solution, *_ = np.linalg.lstsq(design * weights[:, None], np.ones_like(seconds), rcond=None)
    return solution


@dataclass(frozen=True)
class AffineFit:
    """t = fixed_s + per_unit_s · size."""

    fixed_s: float
    per_unit_s: float

    def __call__(self, size: float) -> float:
        return self.fixed_s + self.per_unit_s * size


def fit_affine(sizes, seconds) -> AffineFit:
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    if len(sizes) == 1:  # one point: all of it is per-unit cost
        return AffineFit(0.0, float(seconds[0] / sizes[0]))
    fixed, slope = _relative_lstsq(np.column_stack([np.ones_like(sizes), sizes]), seconds)
    if fixed < 0:  # a negative intercept is noise at the small sizes: refit through 0
        fixed, slope = 0.0, float(_relative_lstsq(sizes[:, None], seconds)[0])
    if slope < 0:  # a time that does not grow with the size is a fixed cost (fp32's encode is a view)
        return AffineFit(float(np.median(seconds)), 0.0)
    return AffineFit(float(fixed), float(slope))


@dataclass(frozen=True)
class RingFit:
    latency_s: float
    bandwidth_bps: float

    @property
    def latency_ms(self) -> float:
        return self.latency_s * 1e3

    @property
    def bandwidth_gbps(self) -> float:
        return self.bandwidth_bps / 1e9

    def all_reduce_s(self, processes: int, payload_bytes: float) -> float:
        return ring_allreduce_s(processes, self.latency_ms, payload_bytes, self.bandwidth_gbps)


def fit_ring(processes, payload_bytes, seconds) -> RingFit:
    n = np.asarray(processes, float)
    size, seconds = np.asarray(payload_bytes, float), np.asarray(seconds, float)
    design = np.column_stack([2 * (n - 1), 2 * (n - 1) / n * 8 * size])
    latency, inv_bw = _relative_lstsq(design, seconds)
    if latency < 0:
        latency = 0.0
        inv_bw = float(_relative_lstsq(design[:, 1:], seconds)[0])
    if not inv_bw > 0:
        raise ValueError("all-reduce times do not grow with the payload; measure larger payloads")
    return RingFit(float(latency), float(1.0 / inv_bw))


@dataclass(frozen=True)
class NetworkModel:
    """What a network profile predicts; parts not measured are None."""

    source: str
    ring: RingFit | None
    outer_step: AffineFit | None
    checkpoint: AffineFit | None
    # ((kind, payload_dtype), fit over fp32 bytes), kind encode | decode; empty: not measured.
    codec: tuple[tuple[tuple[str, str], AffineFit], ...] = ()
    # Shaped-WAN all-reduces: (payload_dtype, collective, fp32 bytes averaged, median seconds), each
    # repeat's slowest process; shaped_by_node: (node, the same four), each node's own times.
    shaped: tuple[tuple[str, str, float, float], ...] = ()
    shaped_by_node: tuple[tuple[str, str, str, float, float], ...] = ()
    snapshot: AffineFit | None = None  # copying a checkpoint's state to host memory (None: not measured)

    @property
    def codec_measured(self) -> bool:
        return bool(self.codec)

    def codec_fit(self, kind: str, payload_dtype: str) -> AffineFit | None:
        return dict(self.codec).get((kind, payload_dtype))


def read_network_profile(path: str | Path) -> NetworkModel:
    """Load and fit a network profile; NetProfileError naming the file, row and column."""
    path = Path(path)
    data = read_network_rows(path)
    ring = data[(data.kind == "all_reduce") & (data.processes >= 2) & (data.payload_dtype == "fp32")
                & (data.collective == "ring") & (data.backend != SHAPED_BACKEND)]
    shaped_all = data[(data.kind == "all_reduce") & (data.backend == SHAPED_BACKEND)]
    shaped, by_node = shaped_all[shaped_all.node == ""], shaped_all[shaped_all.node != ""]
    outer, ckpt, snap = (data[data.kind == k] for k in ("outer_step", "checkpoint", "snapshot"))
    codec = data[data.kind.isin(CODEC_KINDS)]
    if ring.empty and outer.empty and ckpt.empty and codec.empty and shaped_all.empty:
        raise NetProfileError(f"{path}: no rows; expected measurements from geodt calibrate network")
    try:
        ring_fit = fit_ring(ring.processes, ring["size"], ring.seconds) if len(ring) >= 2 else None
    except ValueError as exc:
        raise NetProfileError(f"{path}: all_reduce rows: {exc}") from None
    return NetworkModel(
        source=str(path), ring=ring_fit,
        outer_step=fit_affine(outer["size"], outer.seconds) if len(outer) else None,
        checkpoint=fit_affine(ckpt["size"], ckpt.seconds) if len(ckpt) else None,
        snapshot=fit_affine(snap["size"], snap.seconds) if len(snap) else None,
        codec=tuple(((kind, dtype), fit_affine(4 * rows["size"], rows.seconds))
                    for (kind, dtype), rows in codec.groupby(["kind", "payload_dtype"], sort=True)),
        shaped=tuple((r.payload_dtype, r.collective, float(r.size), float(r.seconds))
                     for r in shaped.sort_values(["payload_dtype", "collective", "size"]).itertuples()),
        shaped_by_node=tuple((r.node, r.payload_dtype, r.collective, float(r.size), float(r.seconds)) for r in
                             by_node.sort_values(["node", "payload_dtype", "collective", "size"]).itertuples()),
    )
