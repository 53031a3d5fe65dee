"""`geodt calibrate network`'s measurements among spawned processes: torch and the executor's code.

links.py (the command: its parser, the checks of --out, the summary) imports this module once the
checks pass, so that `geodt calibrate network --help` and its refusals read without torch;
wan_links.py (`--wan shaped`) likewise. What is timed, and how, is links.py's docstring.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from queue import Empty

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibrate.harness import Calibrator, describe_device
from facts.presets import load_arch
from formats.netprofile import NET_COLUMNS, OPTIONAL_COLUMNS
from formats.wire import PAYLOAD_BYTES
from real.core.diloco import OuterState
from real.core.streaming import threads_for_comm
from real.core.sync import CrossNodeSync, decode, encode
from real.process.launch import pin_gloo
from real.process.outdir import rendezvous_dir  # named after this process: a killed one's is removed
from real.wan.wan import ShapedWan, enter
from train.children import die_with_parent, leave
from train.cpulimit import apply_cpu_limits
from train.step import random_batch, train_step

PARAMS_PER_TENSOR = 1 << 20


def _time_all(repeats: int, fn, sync, after=None) -> list[float]:
    """Seconds of fn() per repeat on this rank, after a warm-up; every rank starts together;
    after(): what the rank does between fn() and the next start (untimed)."""
    fn()
    times = []
    for _ in range(repeats):
        if after is not None:
            after()
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _computing(seconds: float):
    """A callable that keeps this process computing (float32 matmuls, its torch threads) for
    `seconds` of wall time, as a node's inner steps do between two syncs; None for 0. For nodes
    whose devices are not this process's CPU (a GPU node planned here): InnerSteps otherwise."""
    if seconds <= 0:
        return None
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))

    def compute() -> None:
        end = time.perf_counter() + seconds
        x = a
        while time.perf_counter() < end:
            x = torch.tanh(x @ a)
    return compute


class InnerSteps:
    """A node's real inner steps between two averages: `steps` training steps of the scenario's
    model at `batch` (train/step.py's train_step on a Calibrator's model, optimizer and
    scaler: the executor's inner step), each timed into `times`. Two untimed steps at
    construction warm the allocator and the kernels."""
    WARMUP = 2

    def __init__(self, preset: str, base_dir: str | None, seq_len: int, dtype: str, batch: int, steps: int):
        arch = load_arch(preset, Path(base_dir) if base_dir else None)
        self.cal = Calibrator(arch, seq_len, dtype, "cpu", repeats=steps, warmup=self.WARMUP)
        self.tokens = random_batch(arch.vocab_size, batch, seq_len, "cpu", self.cal.generator)
        self.times: list[float] = []
        for _ in range(self.WARMUP):
            self._step()

    def _step(self) -> None:
        train_step(self.cal.model, self.cal.optimizer, self.tokens, self.cal.dtype, self.cal.scaler)

    def __call__(self) -> None:
        self.run(self.cal.repeats)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            start = time.perf_counter()
            self._step()
            self.times.append(time.perf_counter() - start)


def describe_inner(compute) -> str:
    """The device an InnerSteps ran on (describe_device: this CPU, this process's torch threads);
    '' for any other filler."""
    if not isinstance(compute, InnerSteps):
        return ""

    return describe_device("cpu").device_name


def _between_averages(spec: dict):
    """What a node runs between two averages: {"steps": InnerSteps' arguments} or {"busy_s": s}."""
    if "steps" in spec:
        return InnerSteps(**spec["steps"])
    return _computing(spec.get("busy_s", 0.0))


def _beside_average(spec: dict, compute):
    """What a node runs while an average is in flight (Streaming DiLoCo's τ steps): spec's
    "beside_steps" more of its inner steps (`compute`, an InnerSteps) or "beside_s" busy; None
    where it runs nothing beside (classic DiLoCo: the average blocks)."""
    if spec.get("beside_steps", 0) > 0:
        return lambda: compute.run(spec["beside_steps"])
    return _computing(spec.get("beside_s", 0.0))


def _time_overlapped(repeats: int, fn, mark_start, before, beside) -> list[float]:
    """Seconds of fn() per repeat on this rank, fn on a communication thread as Streaming
    DiLoCo's (real/core/streaming.py BackgroundSync): per repeat, before() (the steps up to the
    average's start), then fn() begun on the thread, all ranks marked started by mark_start()
    (the run's leaders' one-element all-reduce) and timed from there, while beside() (τ steps)
    runs; the next repeat once both are done. No barrier between repeats: as in a run, only the
    averages line the ranks up. After a warm-up average."""
    def timed() -> float:
        mark_start()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    times = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="geodt-comm", initializer=threads_for_comm) as pool:
        pool.submit(timed).result()
        for _ in range(repeats):
            if before is not None:
                before()
            future = pool.submit(timed)
            if beside is not None:
                beside()
            times.append(future.result())
    return times


def _join_gloo(rank: int, world: int, store_path: str | None, threads: int | None):
    """Join the measuring group (env:// under torchrun, else the file store); returns
    (barrier, slowest, every): a one-element all-reduce, per-repeat times maxed over the ranks,
    and every rank's times (a list per rank)."""

    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    if store_path is None:
        dist.init_process_group("gloo", init_method="env://")
    else:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    flag = torch.zeros(1)

    def barrier():
        dist.all_reduce(flag)

    def slowest(times: list[float]) -> list[float]:
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def every(times: list[float]) -> list[list[float]]:
        t = torch.tensor(times, dtype=torch.float64)
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t)
        return [o.tolist() for o in out]

    return barrier, slowest, every


def _measure(rank: int, world: int, store_path: str | None, args_dict: dict, queue) -> None:
    barrier, slowest, _ = _join_gloo(rank, world, store_path, args_dict["threads"])

    rows = []
    repeats, ckpt_dir = args_dict["repeats"], args_dict["ckpt_dir"]
    for size in args_dict["sizes"]:
        buf = torch.ones(size // 4)

        def all_reduce():
            dist.all_reduce(buf)
        rows.append(("all_reduce", size, slowest(_time_all(repeats, all_reduce, barrier))))
        params = [torch.nn.Parameter(torch.randn(min(PARAMS_PER_TENSOR, size // 4 - i)))
                  for i in range(0, size // 4, PARAMS_PER_TENSOR)]
        outer = OuterState(params)

        def outer_step():
            delta = outer.pseudo_gradient(1.0)
            delta.div_(world)
            outer.outer_step(delta, 0.7, 0.9)
            outer.load_into_model()
        rows.append(("outer_step", size // 4, slowest(_time_all(repeats, outer_step, barrier))))
        state = {"buffer": torch.zeros(size // 4)}
        path = Path(ckpt_dir) / f"rank{rank}.pt"

        def save():
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            try:
                torch.save(state, tmp)
            except (OSError, RuntimeError):  # torch's writer says "unexpected pos" for a full disk
                tmp.unlink(missing_ok=True)
                _raise_if_full(path, size)
                raise
            os.replace(tmp, path)
        rows.append(("checkpoint", size, slowest(_time_all(repeats, save, barrier))))
        path.unlink(missing_ok=True)

        def snapshot():  # the blocking part of real/checkpoint/checkpoint.py's save: fresh host copies
            return [p.detach().to("cpu", copy=True) for p in params]
        rows.append(("snapshot", size, slowest(_time_all(repeats, snapshot, barrier))))
        rows.extend(codec_rows(size // 4, repeats, barrier, slowest))
        if rank == 0 and queue is not None:
            queue.put(("progress", 1))
    if rank == 0 and queue is not None:
        queue.put(("rows", rows))
    barrier()
    dist.destroy_process_group()


def codec_rows(elements: int, repeats: int, barrier, slowest) -> list[tuple]:
    """(kind, elements, [seconds], payload_dtype) for encode() and decode() of `elements` fp32
    values (real/core/sync.py), each payload dtype, timed on every rank at once."""
    rows = []
    values = torch.randn(elements, generator=torch.Generator().manual_seed(elements))
    for dtype in PAYLOAD_BYTES:
        encoded = encode(values, dtype).clone()
        rows.append(("encode", elements, slowest(_time_all(repeats, lambda: encode(values, dtype), barrier)), dtype))
        rows.append(("decode", elements,
                     slowest(_time_all(repeats, lambda: decode(encoded, elements, dtype), barrier)), dtype))
    return rows


def _raise_if_full(path: Path, size: int) -> None:
    """OSError(ENOSPC) naming `path` when its file system has less room than the `size` bytes written."""
    if shutil.disk_usage(path.parent).free < size:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None


def _spawn_entry(rank: int, world: int, store_path: str, args_dict: dict, queue) -> None:
    die_with_parent(args_dict["parent_pid"])
    try:
        _measure(rank, world, store_path, args_dict, queue)
    except OSError as exc:  # told to the parent, which stops the others (blocked in a collective)
        queue.put(("oserror", (exc.errno, exc.strerror, exc.filename)))
        leave(1, queue)
    leave(0, queue)


def measure(processes: int, sizes: list[int], repeats: int, threads: int, ckpt_dir: str, progress=None) -> list:
    """Rows (kind, size, [seconds per repeat]) measured among `processes` spawned processes."""
    pin_gloo("127.0.0.1")  # nothing listens beyond loopback
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    args_dict = {"sizes": sizes, "repeats": repeats, "threads": threads, "ckpt_dir": ckpt_dir,
                 "parent_pid": os.getpid()}
    with rendezvous_dir() as rdzv:
        return _spawn_and_collect(_spawn_entry, (processes, os.path.join(rdzv, "store"), args_dict, queue),
                                  processes, queue, progress)


def _spawn_and_collect(entry, args: tuple, processes: int, queue, progress, inner: dict | None = None) -> list:
    """Start `processes` spawned entry(rank, *args); relay their progress; the rows rank 0 sends
    (and into `inner`, where given, what every rank sends as ("inner", (key, value)))."""
    procs = mp.start_processes(entry, args=args, nprocs=processes, join=False, start_method="spawn")
    rows = None
    while rows is None or (inner is not None and len(inner) < processes):
        try:
            kind, value = queue.get(timeout=1.0)
        except Empty:  # a process that died without a word: join raises ProcessException, the others stopped
            procs.join(timeout=0)
            continue
        if kind == "oserror":  # a write failed in a process (a full disk): the others wait in a collective
            for proc in procs.processes:
                proc.kill()
                proc.join()
            raise OSError(*value)
        if kind == "progress" and progress is not None:
            progress(value)
        elif kind == "inner" and inner is not None:
            inner[value[0]] = value[1]
        elif kind == "rows":
            rows = value
    while not procs.join():
        pass
    return rows


@contextmanager
def wan_node(link, cores, quota, parent_pid: int, cgroup: str):
    """This spawned process as one node of a shaped WAN: it dies with `parent_pid`, enters the
    node's namespace (before any socket exists) and runs under the CPU limits (None, None: none)
    until the block ends."""
    die_with_parent(parent_pid)
    enter(link)
    cleanup = apply_cpu_limits(cores, quota, cgroup)
    try:
        yield
    finally:
        cleanup()


def _shaped_entry(rank: int, world: int, store_path: str, links: tuple, args_dict: dict, queue) -> None:
    """One node of the shaped WAN: into its namespace and under its leader's CPU limits (a node
    with a CPU quota runs its share of the sync, copies, sums and encoding, at that quota in a
    run), then every (dtype, collective, size) through real/core/sync.py's CrossNodeSync exactly as
    the executor's leaders average."""
    cores, quota = args_dict["limits"][rank]
    with wan_node(links[rank], cores, quota, args_dict["parent_pid"], f"geodt-netcal-{rank}"):
        _shaped_rows(rank, world, store_path, links, args_dict, queue)
    leave(0, queue)


def _shaped_rows(rank: int, world: int, store_path: str, links: tuple, args_dict: dict, queue) -> None:
    """This node's rows (rank 0 queues them all, maxed over the ranks)."""

    barrier, slowest, every = _join_gloo(rank, world, store_path, args_dict["threads"])

    rows, gbps = [], [link.link_gbps for link in links]
    spec = args_dict["between"][rank]
    compute = _between_averages(spec)
    beside = _beside_average(spec, compute)
    steps_by_size = {}
    for size in args_dict["sizes"]:
        elements = size // 4
        delta = torch.randn(elements, generator=torch.Generator().manual_seed(rank))
        for dtype in args_dict["dtypes"]:
            for collective in args_dict["collectives"]:
                sync = CrossNodeSync(None, world, rank, elements, dtype, collective, gbps)
                average = lambda: sync.average(delta, world)
                times = (_time_all(args_dict["repeats"], average, barrier, compute) if beside is None
                         else _time_overlapped(args_dict["repeats"], average, barrier, compute, beside))
                rows.append(("all_reduce", size, slowest(times), dtype, collective))
                # Each node's own times too: on unequal links the nodes end one average apart.
                rows += [("all_reduce", size, own, dtype, collective, link.node)
                         for link, own in zip(links, every(times))]
        rows.extend(codec_rows(elements, args_dict["repeats"], barrier, slowest))
        if isinstance(compute, InnerSteps):
            steps_by_size[size], compute.times = compute.times, []
        if rank == 0:
            queue.put(("progress", 1))
    queue.put(("inner", (links[rank].node, (describe_inner(compute), steps_by_size))))  # parent and child only
    if rank == 0:
        queue.put(("rows", rows))
    barrier()
    dist.destroy_process_group()


def measure_shaped(nodes: list[tuple[str, float]], latency_ms: float, sizes: list[int], dtypes: list[str],
                   collectives: list[str], repeats: int, threads: int, progress=None, describe=None,
                   limits: list[tuple] | None = None, between: list[dict] | None = None) -> tuple[list, dict]:
    """(rows, inner): rows (kind, size, [seconds], payload_dtype[, collective[, node]]) measured
    among one process per node, each in its node's namespace of a shaped WAN (real/wan/wan.py) built
    for `nodes` [(name, link_gbps)] and removed on every way out, under `limits` [(cores, quota)]
    per node (None: none), each node running its `between` (_between_averages: real inner steps
    or a busy loop; None: nothing) between two averages as it would between two syncs of a run;
    inner {node: (device described, {size: [seconds of each inner step run between that size's
    averages]})}, empty for a node without inner steps. WanError where it cannot be built."""
    args_dict = {"sizes": sizes, "dtypes": dtypes, "collectives": collectives, "repeats": repeats,
                 "threads": threads, "limits": limits or [(None, None)] * len(nodes),
                 "between": between or [{}] * len(nodes), "parent_pid": os.getpid()}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with ShapedWan(nodes, latency_ms=latency_ms) as wan, \
            rendezvous_dir() as rdzv:
        if describe is not None:
            describe(wan.describe())
        inner = {}
        rows = _spawn_and_collect(_shaped_entry, (len(nodes), os.path.join(rdzv, "store"), wan.links, args_dict, queue),
                                  len(nodes), queue, progress, inner)
        return rows, inner


def to_frame(rows_by_n: dict[int, list], repeats: int, backend: str = "gloo"):
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    records = []
    for n, rows in rows_by_n.items():
        for kind, size, times, *tags in rows:  # tags: payload_dtype[, collective[, node]]
            deciles = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [times[0]] * 9
            records.append({
                "kind": kind, "processes": n, "backend": backend, "size": size,
                "seconds_median": statistics.median(times), "seconds_p10": deciles[0], "seconds_p90": deciles[-1],
                "repeats": repeats, "host": socket.gethostname(), "torch_version": torch.__version__,
                "measured_at": stamp, "payload_dtype": (tags + ["fp32"])[0],
                "collective": (tags + ["ring", "ring"])[1], "node": (tags + ["", "", ""])[2],
                "seconds_mean": statistics.fmean(times),
            })
    return pd.DataFrame(records, columns=list(NET_COLUMNS + OPTIONAL_COLUMNS))
