"""How one sync's time spreads on the shaped WAN, and what TCP retransmits meanwhile (root).

One process per node, each in its namespace of a real/wan/wan.py ShapedWan and under its CPU quota,
runs real/core/sync.py's cross-node average of `--fp32-bytes` (the executor's own average, on a
thread as Streaming DiLoCo runs it) `--repeats` times, all starting together, a pause between
two; each node records its own seconds per average and, from its namespace's
/proc/thread-self/net/snmp and netstat, the segments it sent and retransmitted and its
retransmission timeouts. `--busy NODE` keeps that node computing real inner steps (the tiny
model at batch 4) for as long as each average runs, as a node does through its τ steps.
`--queue-s S` replaces the links' tbf queue depth (real/wan/wan.py _token_bucket) by S seconds at
each link's rate, to compare depths.

A mean of N averages whose tail is a rare multi-second stall (a retransmission timeout) moves
by that stall over N when one falls among them or not: this prints the median beside the mean,
and the max. Defaults: wan-three's done-when links (8, 8 and 4 Mbit/s at quotas 0.9, 0.6 and
0.4 of a core) and one Streaming DiLoCo fragment (P = 2) of the tiny model, fp32 ring.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from geodt.calibration.link_timing import InnerSteps, _join_gloo, wan_node
from real.wan import wan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COUNTERS = {"Tcp": ("OutSegs", "RetransSegs"), "TcpExt": ("TCPTimeouts", "TCPLossProbes")}


def tcp_counters() -> dict[str, int]:
    """This thread's network namespace's TCP counters (COUNTERS)."""
    found = {}
    for name in ("snmp", "netstat"):
        lines = Path(f"/proc/thread-self/net/{name}").read_text().splitlines()
        for header, values in zip(lines[0::2], lines[1::2]):
            kind, keys = header.split()[0].rstrip(":"), header.split()[1:]
            for key, value in zip(keys, values.split()[1:]):
                if key in COUNTERS.get(kind, ()):
                    found[key] = int(value)
    return found


def _node(rank: int, world: int, store: str, links, quotas, args: dict, queue) -> None:
    with wan_node(links[rank], None, quotas[rank], args["parent_pid"], f"geodt-tail-{rank}"):
        queue.put(("node", _averages(rank, world, store, links, args)))


def _averages(rank: int, world: int, store: str, links, args: dict) -> tuple:
    import torch
    import torch.distributed as dist

    from real.core.streaming import threads_for_comm
    from real.core.sync import CrossNodeSync

    barrier, _, _ = _join_gloo(rank, world, store, 1)
    elements = args["fp32_bytes"] // 4
    sync = CrossNodeSync(None, world, rank, elements, "fp32", args["collective"], [link.link_gbps for link in links])
    delta = torch.randn(elements, generator=torch.Generator().manual_seed(rank))
    busy = InnerSteps("tiny", None, 256, "fp32", 4, 1) if links[rank].node == args["busy"] else None
    comm = ThreadPoolExecutor(1, initializer=threads_for_comm)

    def average() -> float:
        start = time.perf_counter()
        sync.average(delta, world)
        return time.perf_counter() - start

    comm.submit(average).result()  # warm-up: connections made
    before, seconds = tcp_counters(), []
    for _ in range(args["repeats"]):
        barrier()
        time.sleep(args["pause_s"])  # the links drain, as between two syncs
        barrier()
        future = comm.submit(average)
        while busy is not None and not future.done():
            busy()
        seconds.append(future.result())
    after = tcp_counters()
    barrier()
    dist.destroy_process_group()
    comm.shutdown()
    return links[rank].node, seconds, {k: after[k] - before[k] for k in before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--links", default="q90=0.008,q60=0.008,q40=0.004", help="node=Gbit/s,... (default wan-three's)")
    p.add_argument("--quotas", default="0.9,0.6,0.4", help="CPU quota per node, in order")
    p.add_argument("--collective", choices=("ring", "partitioned"), default="ring")
    p.add_argument("--fp32-bytes", type=int, default=4 * 131_232, help="fp32 payload (default a tiny-model fragment)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--pause-s", type=float, default=0.3)
    p.add_argument("--busy", default="", help="a node computing inner steps through each average")
    p.add_argument("--queue-s", type=float, help="the links' tbf queue in seconds at their rate (default geodt's)")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    nodes = [(name, float(gbps)) for name, gbps in (item.split("=") for item in args.links.split(","))]
    quotas = [float(q) for q in args.quotas.split(",")]
    if args.queue_s is not None:
        default = wan._token_bucket  # the depth only; rate and burst stay geodt's
        wan._token_bucket = lambda rate_bps: {**default(rate_bps), "limit": int(rate_bps / 8 * args.queue_s)}
    spec = {"fp32_bytes": args.fp32_bytes, "collective": args.collective, "repeats": args.repeats,
            "pause_s": args.pause_s, "busy": args.busy, "parent_pid": os.getpid()}
    queue = mp.get_context("spawn").Queue()
    with wan.ShapedWan(nodes) as net, tempfile.TemporaryDirectory(prefix="geodt-tail-") as rdzv:
        procs = mp.start_processes(_node, args=(len(nodes), os.path.join(rdzv, "store"), net.links, quotas, spec, queue),
                                   nprocs=len(nodes), join=False, start_method="spawn")
        results = {name: rest for name, *rest in (queue.get()[1] for _ in nodes)}
        while not procs.join():
            pass
    depth = "geodt's" if args.queue_s is None else f"{args.queue_s:g} s"
    print(f"{args.collective} fp32 {args.fp32_bytes:,} B, {args.repeats} averages, links {args.links}, "
          f"queue {depth}, busy {args.busy or 'none'}")
    for name, _ in nodes:
        seconds, tcp = results[name]
        s = sorted(seconds)
        print(f"  {name}: median {statistics.median(s):.3f} s, mean {statistics.fmean(s):.3f}, p10 "
              f"{s[len(s) // 10]:.3f}, p90 {s[-max(1, len(s) // 10)]:.3f}, max {s[-1]:.3f}; TCP segments sent "
              f"{tcp['OutSegs']}, retransmitted {tcp['RetransSegs']}, timeouts {tcp['TCPTimeouts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
