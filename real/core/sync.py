"""The cross-node average of the pseudo-gradients, by the plan's collective and payload dtype.

Runs on the leaders' process group (one process per node, see real/process/worker.py). Input: this
node's c_i·Δ_i and the divisor D (real/core/diloco.py); output: Σ_i c_i·Δ_i / D in fp32, the
same bits on every node.

- ring + fp32: torch's all-reduce (SUM), then / D. bytes_sent counts it as a ring
  all-reduce: 2(n−1)/n · 4P (P parameters); gloo/nccl pick their own algorithm inside.
- everything else: each node first divides by D (so values stay at the scale of Δ, which
  fp16 and int8 need), then a reduce-scatter and an all-gather of *encoded* segments, so the
  bytes on the wire are the payload dtype's, pipelined in pieces as point-to-point messages
  (MAX_PIECES below) so that both steps share the links at once:
    1. the flat vector is cut into n segments, L_j elements for node j (ring: P/n each;
       partitioned: p_j·P, p from the nodes' link_gbps by water-filling, formats/wire.py);
       node i sends segment j, encoded, to node j;
    2. node j decodes the n versions of its segment and sums them in fp32 in node order;
    3. node j encodes that sum and sends it to every other node; all decode all segments.
  Node i sends Σ_{j≠i} E(L_j) + (n−1)·E(L_i) bytes (formats.wire.bytes_sent_per_sync), counted
  here from the tensors handed to the sends.
- Encodings E: fp32 (4 B/element), fp16 (2 B), int8: per chunk of INT8_CHUNK = 256
  elements one fp32 scale s = max|x|/127 and round(x/s) as int8 (1 B/element + 4 B/chunk).
  Error per element: fp16 ≤ half an fp16 ulp per encoding; int8 ≤ s/2 per encoding, i.e.
  Σ_i s_i/2 over the nodes' segments plus s_sum/2 for the aggregated one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from formats.wire import INT8_CHUNK, encoded_bytes, sync_segments


def encode(x: torch.Tensor, payload_dtype: str) -> torch.Tensor:
    """x (fp32, 1-D) as the bytes that go on the wire (uint8, 1-D)."""
    if payload_dtype == "fp32":
        return x.contiguous().view(torch.uint8)
    if payload_dtype == "fp16":
        return x.to(torch.float16).view(torch.uint8)
    n = x.numel()
    chunks = -(-n // INT8_CHUNK)
    padded = torch.zeros(chunks * INT8_CHUNK, dtype=torch.float32, device=x.device)
    padded[:n] = x
    padded = padded.view(chunks, INT8_CHUNK)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(padded / safe[:, None]).clamp_(-127, 127).to(torch.int8).reshape(-1)[:n]
    return torch.cat([scales.view(torch.uint8), q.view(torch.uint8)])


def decode(buf: torch.Tensor, n: int, payload_dtype: str) -> torch.Tensor:
    """The fp32 values of `n` elements encoded by encode()."""
    buf = buf.clone()  # offset 0: the views below need aligned storage
    if payload_dtype == "fp32":
        return buf.view(torch.float32)
    if payload_dtype == "fp16":
        return buf.view(torch.float16).float()
    chunks = -(-n // INT8_CHUNK)
    scales = buf[:4 * chunks].view(torch.float32)
    q = buf[4 * chunks:].view(torch.int8).float()
    return q * scales.repeat_interleave(INT8_CHUNK)[:n]


# The reduce-scatter and all-gather are cut into pieces and run as point-to-point messages
# posted at once: piece k's gather leaves as soon as piece k is summed, while later pieces'
# scatter is still on the wire, so each link carries both phases in both directions together
# (the time simulator/models/network.py prices). A piece is at least PIECE_BYTES on the wire: fewer,
# larger pieces for small payloads (each message has a fixed cost).
MAX_PIECES = 16
PIECE_BYTES = 32 * 1024


def piece_bounds(length: int, pieces: int) -> list[tuple[int, int]]:
    """`pieces` (start, end) ranges of a segment of `length` elements, cut at multiples of
    INT8_CHUNK so that int8's scales (per chunk of the segment) are the unpipelined ones."""
    per_piece = -(-length // pieces)
    step = -(-per_piece // INT8_CHUNK) * INT8_CHUNK
    return [(min(k * step, length), min((k + 1) * step, length)) for k in range(pieces)]


class CrossNodeSync:
    """average(): the collective of the module docstring among the n node leaders."""

    def __init__(self, group, n: int, me: int, params: int, payload_dtype: str, collective: str,
                 links_gbps: list[float] | None, pieces: int | None = None):
        self.group, self.n, self.me, self.dtype = group, n, me, payload_dtype
        self.fused = collective == "ring" and payload_dtype == "fp32"
        links = links_gbps if links_gbps and None not in links_gbps else [1.0] * n
        self.lengths = sync_segments(params, collective, links)
        self.params = params
        self.pieces = pieces or max(1, min(MAX_PIECES, encoded_bytes(params, payload_dtype) // PIECE_BYTES))
        self.bounds = [piece_bounds(length, self.pieces) for length in self.lengths]

    def average(self, delta: torch.Tensor, divisor: float) -> tuple[torch.Tensor, int]:
        """(Σ_i delta_i / divisor, bytes this node sent). `delta` may be overwritten."""
        if self.n == 1:
            return delta.div_(divisor), 0
        if self.fused:
            dist.all_reduce(delta, group=self.group)
            return delta.div_(divisor), 2 * (self.n - 1) * delta.numel() * delta.element_size() // self.n
        delta.div_(divisor)
        n, me, pieces = self.n, self.me, self.pieces
        peers = [j for j in range(n) if j != me]
        segments = torch.split(delta, self.lengths)
        device = delta.device
        # Scatter: piece k of segment j, encoded, to node j (tag k); own pieces stay here.
        parts = [[encode(seg[slice(*self.bounds[j][k])], self.dtype) for k in range(pieces)]
                 for j, seg in enumerate(segments)]
        sends = [self._send(parts[j][k], j, k) for k in range(pieces) for j in peers]
        sent = sum(parts[j][k].numel() for k in range(pieces) for j in peers)
        mine = [[parts[me][k] if i == me else self._empty(me, k, device) for i in range(n)] for k in range(pieces)]
        scatter_recvs = [[self._recv(mine[k][i], i, k) for i in peers] for k in range(pieces)]
        gathered = [[None if j == me else self._empty(j, k, device) for k in range(pieces)] for j in range(n)]
        gather_recvs = [self._recv(gathered[j][k], j, pieces + k) for j in peers for k in range(pieces)]
        for k in range(pieces):
            for work in scatter_recvs[k]:
                work.wait()
            start, end = self.bounds[me][k]
            total = torch.zeros(end - start, dtype=torch.float32, device=device)
            for i in range(n):  # node order: the same sum on whichever node aggregates
                total += decode(mine[k][i], end - start, self.dtype)
            gathered[me][k] = encode(total, self.dtype)
            sends += [self._send(gathered[me][k], j, pieces + k) for j in peers]
            sent += len(peers) * gathered[me][k].numel()
        for work in gather_recvs + sends:
            work.wait()
        out = [decode(gathered[j][k], end - start, self.dtype)
               for j in range(n) for k, (start, end) in enumerate(self.bounds[j])]
        return torch.cat(out), sent

    def _empty(self, j: int, k: int, device: torch.device) -> torch.Tensor:
        """A buffer for node j's piece k, encoded."""
        start, end = self.bounds[j][k]
        return torch.empty(encoded_bytes(end - start, self.dtype), dtype=torch.uint8, device=device)

    def _send(self, buf: torch.Tensor, j: int, tag: int):
        return dist.isend(buf, group=self.group, group_dst=j, tag=tag)

    def _recv(self, buf: torch.Tensor, j: int, tag: int):
        return dist.irecv(buf, group=self.group, group_src=j, tag=tag)
