"""The cross-node average for every payload dtype and collective, against the fp32 average.

Three gloo processes average known vectors through real.core.sync.CrossNodeSync. Tolerances come
from the encodings (real/core/sync.py): fp32 partitioned only reorders the fp32 sum; fp16 rounds
each node's values and the aggregated sum to fp16 (≤ 2^-11 relative each); int8 is off by at
most s/2 per element per encoding (s = the chunk's max|x|/127), over the n nodes' segments
and the aggregated one. bytes_sent must equal formats.wire.bytes_sent_per_sync exactly.
"""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

from formats.wire import INT8_CHUNK, bytes_sent_per_sync, partition_shares, segment_lengths

N, P = 3, 1000  # 1000 elements: segments are not multiples of the int8 chunk
CASES = [(dtype, coll, links) for dtype in ("fp32", "fp16", "int8") for coll, links in
         (("ring", [1.0, 1.0, 1.0]), ("partitioned", [2.0, 3.0, 4.0]), ("partitioned", [1.0, 4.0, 10.0]))]
DIVISOR = 3.0


def inputs(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(P, generator=g) * 1e-2
    x[rank * 7] = 0.5  # an outlier: its chunk's scale is large
    return x


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    from real.core.sync import CrossNodeSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, N), rank=rank, world_size=N)
    results = []
    for dtype, coll, links in CASES:
        sync = CrossNodeSync(dist.group.WORLD, N, rank, P, dtype, coll, links, pieces=1)
        results.append(sync.average(inputs(rank).clone(), DIVISOR))
    for dtype, coll, links in CASES:  # the same, pipelined (segments of ~333: pieces of 256, 77, 0)
        sync = CrossNodeSync(dist.group.WORLD, N, rank, P, dtype, coll, links, pieces=3)
        results.append(sync.average(inputs(rank).clone(), DIVISOR))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(os.path.join(tmp, "store"), tmp), nprocs=N, start_method="spawn")
        yield [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(N)]


def _chunk_scales(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Per element, the int8 scale of its chunk when x is encoded segment by segment."""
    out = []
    for seg in torch.split(x, lengths):
        for chunk in torch.split(seg, INT8_CHUNK):
            out.append(torch.full_like(chunk, float(chunk.abs().max()) / 127 if chunk.numel() else 0.0))
    return torch.cat(out)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_average_within_the_encodings_error_and_bytes_exact(results, case):
    dtype, coll, links = CASES[case]
    xs = [inputs(r) / DIVISOR for r in range(N)]
    exact = sum(xs)
    got = [results[r][case][0] for r in range(N)]
    for r in range(1, N):
        assert torch.equal(got[r], got[0])  # every node ends with the same bits
    shares = partition_shares(links) if coll == "partitioned" else [1 / N] * N
    lengths = segment_lengths(P, shares)
    err = (got[0] - exact).abs()
    slack = 1e-6 * sum(x.abs() for x in xs) + 1e-9
    if dtype == "fp32":
        bound = slack
    elif dtype == "fp16":
        bound = 2.0 ** -11 * (sum(x.abs() for x in xs) + exact.abs()) + slack
    else:
        bound = sum(_chunk_scales(x, lengths) / 2 for x in xs) + _chunk_scales(exact, lengths) / 2 \
            + 2.0 ** -11 * exact.abs() + slack  # the last: requantising the fp32 sum
    assert (err <= bound).all(), float((err - bound).max())
    if dtype != "fp32":
        assert err.max() > 0  # the encoding really was lossy: the check can fail
    assert [results[r][case][1] for r in range(N)] == bytes_sent_per_sync(P, dtype, coll, links)


def test_bytes_formulas():
    # ring fp32: 2(n−1)/n · 4P; ring int8: Σ_{j≠i} E(L_j) + (n−1)E(L_i), E(L) = L + 4⌈L/256⌉.
    assert bytes_sent_per_sync(999, "fp32", "ring", [1, 1, 1]) == [2 * 2 * 4 * 999 // 3] * 3
    assert bytes_sent_per_sync(999, "int8", "ring", [1, 1, 1]) == [4 * (333 + 8)] * 3
    assert bytes_sent_per_sync(1000, "fp16", "partitioned", [1, 4, 10]) == [2000, 2000, 4000]
    assert partition_shares([1.0, 4.0, 10.0]).tolist() == [0.0, 0.0, 1.0]
    assert partition_shares([2.0, 3.0, 4.0]) == pytest.approx([0.0, 2 / 7, 5 / 7])
    assert bytes_sent_per_sync(10, "fp32", "ring", [1.0]) == [0]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_pipelined_pieces_give_the_same_bits_and_bytes(results, case):
    """Cut at int8 chunk boundaries, the pieces encode and sum exactly as the whole does."""
    for r in range(N):
        whole, piecewise = results[r][case], results[r][len(CASES) + case]
        assert torch.equal(piecewise[0], whole[0])
        assert piecewise[1] == whole[1]


def test_piece_bounds_cut_at_int8_chunks_and_cover_the_segment():
    from real.core.sync import piece_bounds

    assert piece_bounds(1000, 3) == [(0, 512), (512, 1000), (1000, 1000)]
    assert piece_bounds(333, 3) == [(0, 256), (256, 333), (333, 333)]
    assert piece_bounds(0, 2) == [(0, 0), (0, 0)]
    assert piece_bounds(10 * INT8_CHUNK, 5) == [(k * 512, (k + 1) * 512) for k in range(5)]
