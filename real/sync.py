"""The cross-node average of the pseudo-gradients, by the plan's collective and payload dtype.

Runs on the leaders' process group (one process per node, see real/worker.py). Input: this
node's c_i·Δ_i and the divisor D (real/diloco.py); output: Σ_i c_i·Δ_i / D in fp32, the
same bits on every node.

- ring + fp32: torch's all-reduce (SUM), then / D. bytes_sent counts it as a ring
  all-reduce: 2(n−1)/n · 4P (P parameters); gloo/nccl pick their own algorithm inside.
- everything else: each node first divides by D (so values stay at the scale of Δ, which
  fp16 and int8 need), then a reduce-scatter and an all-gather, both as all-to-all of
  *encoded* segments, so the bytes on the wire are the payload dtype's:
    1. the flat vector is cut into n segments, L_j elements for node j (ring: P/n each;
       partitioned: p_j·P, p from the nodes' link_gbps by water-filling, formats/wire.py);
       node i sends segment j, encoded, to node j;
    2. node j decodes the n versions of its segment and sums them in fp32 in node order;
    3. node j encodes that sum and sends it to every other node; all decode all segments.
  Node i sends Σ_{j≠i} E(L_j) + (n−1)·E(L_i) bytes (formats.wire.bytes_sent_per_sync), counted
  here from the tensors handed to the all-to-alls.
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


class CrossNodeSync:
    """average(): the collective of the module docstring among the n node leaders."""

    def __init__(self, group, n: int, me: int, params: int, payload_dtype: str, collective: str,
                 links_gbps: list[float] | None):
        self.group, self.n, self.me, self.dtype = group, n, me, payload_dtype
        self.fused = collective == "ring" and payload_dtype == "fp32"
        links = links_gbps if links_gbps and None not in links_gbps else [1.0] * n
        self.lengths = sync_segments(params, collective, links)
        self.params = params

    def average(self, delta: torch.Tensor, divisor: float) -> tuple[torch.Tensor, int]:
        """(Σ_i delta_i / divisor, bytes this node sent). `delta` may be overwritten."""
        if self.n == 1:
            return delta.div_(divisor), 0
        if self.fused:
            dist.all_reduce(delta, group=self.group)
            return delta.div_(divisor), 2 * (self.n - 1) * delta.numel() * delta.element_size() // self.n
        delta.div_(divisor)
        n, me, dtype = self.n, self.me, self.dtype
        # 1. reduce-scatter: segment j, encoded, to node j.
        parts = [encode(seg, dtype) for seg in torch.split(delta, self.lengths)]
        send_sizes = [p.numel() for p in parts]
        mine = encoded_bytes(self.lengths[me], dtype)
        received = torch.empty(n * mine, dtype=torch.uint8, device=delta.device)
        dist.all_to_all_single(received, torch.cat(parts), [mine] * n, send_sizes, group=self.group)
        total = torch.zeros(self.lengths[me], dtype=torch.float32, device=delta.device)
        for j in range(n):  # node order: the same sum on whichever node aggregates
            total += decode(received[j * mine:(j + 1) * mine], self.lengths[me], dtype)
        # 2. all-gather: the aggregated segment, encoded, to every node.
        mine_enc = encode(total, dtype)
        gathered = torch.empty(sum(send_sizes), dtype=torch.uint8, device=delta.device)
        dist.all_to_all_single(gathered, mine_enc.repeat(n), send_sizes, [mine_enc.numel()] * n, group=self.group)
        out, offset = [], 0
        for size, length in zip(send_sizes, self.lengths):
            out.append(decode(gathered[offset:offset + size], length, dtype))
            offset += size
        sent = sum(send_sizes) - send_sizes[me] + (n - 1) * mine_enc.numel()  # to oneself is not on the wire
        return torch.cat(out), sent
