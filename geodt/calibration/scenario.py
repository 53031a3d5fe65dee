"""`geodt calibrate scenario --scenario S.toml`: every CPU device of a scenario, measured at once, as it runs.

A device measured alone is not the device the executor runs: next to the scenario's other
processes it shares the machine's caches, memory bandwidth and scheduler, and on a virtual
machine even a CPU-quota throttled process runs at another speed when the other cores are busy.
So this measures all of a scenario's devices together, each in its own process under its
node's limits exactly as real/ applies them (cpu_cores, with a node's G devices taking
cores[j::G] when there are enough; cpu_quota per process; --threads torch threads): for each
batch size every process warms up and times its steps at the same moment, and a process that
finishes first keeps stepping, untimed, until the last one is done, so every timed step ran
under the full load. One profile per device, DIR/<node>-<j>.csv; point the node at them
(`profile = ["DIR/two-0.csv", "DIR/two-1.csv"]`): a node's step is its slowest device's.
`--passes K` measures all of it K times and keeps each device's median pass per batch: calibrated
back to back on this project's 2-core VM, a device's whole window ran 1.17-1.42x its median in 3 of
16 calibrations (results/predict-the-run/calibration-repeats/).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tqdm import tqdm

from calibrate.cli import UsageError, parse_batches
from calibrate.profile_writer import write_new_profile
from facts.presets import load_arch
from formats.cli import OneLineParser, non_negative_int, positive_int
from formats.errors import InputError, write_error
from formats.files import child_path
from formats.limits import check_threads
from geodt.preflight import PreflightError, available_memory_bytes, check_host_memory, host_process_bytes
from simulator.models.memory import memory_need_bytes
from simulator.scenario import load_scenario
from train.children import die_with_parent
from train.cpulimit import apply_cpu_limits, describe_limits, device_cores
from train.hoststat import STEAL_WARN_PCT, cpu_times, host_share, say


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="geodt calibrate scenario", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", required=True, help="a scenario TOML whose nodes are CPU devices")
    p.add_argument("--batch", default="1,2,4,8", help="batch sizes, e.g. 1,2,4,8 [1,2,4,8]")
    p.add_argument("--repeats", type=positive_int, default=20, help="timed steps per batch [20]")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps per batch first [3]")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per device process [1]")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out-dir", required=True, type=Path, help="directory for one profile per device")
    p.add_argument("--passes", type=positive_int, default=1, metavar="K",
                   help="measure every device K times over and keep, per device and batch, the pass with the "
                        "median step: on a shared machine one device's whole window can run 1.2-1.4x slow now "
                        "and then, and one such window would set its profile [1]")
    p.add_argument("--steal-retries", type=non_negative_int, default=0, metavar="K",
                   help=f"measure again, up to K times, while the host's steal over the calibration is above "
                        f"{STEAL_WARN_PCT:g}%% (a virtual machine's other tenants took that share of its CPU "
                        f"time); the one with the least steal is written [0]")
    return p


def _device(rank: int, jobs: list, setup: dict, barrier, done, results) -> None:
    die_with_parent(setup["parent_pid"])
    import torch  # noqa: PLC0415  deferred: torch (seconds) after die_with_parent: a killed parent leaves no process

    # deferred: torch, in the device process only
    from calibrate.harness import Calibrator, describe_device, profile_row, scenario_device_name  # noqa: PLC0415
    from train.step import random_batch, train_step  # noqa: PLC0415  deferred: torch, in the device process only

    node, j, gpus, cores, quota = jobs[rank]
    cores = device_cores(cores, gpus, j)  # as real/process/process.py places a node's devices
    cleanup = apply_cpu_limits(cores, quota, f"geodt-cal-{rank}")
    try:
        torch.set_num_threads(setup["threads"])
        arch = load_arch(setup["preset"], setup["base_dir"])
        info = describe_device("cpu")
        name = scenario_device_name(info.device_name, describe_limits(cores, quota), setup["scenario"], node, j, gpus)
        calibrator = Calibrator(arch, setup["seq_len"], setup["dtype"], "cpu", setup["repeats"], setup["warmup"])
        for done_batches, batch in enumerate(setup["batches"], start=1):
            barrier.wait()
            m = calibrator.measure(batch)
            with done.get_lock():
                done.value += 1
            batch_tensor = random_batch(arch.vocab_size, batch, setup["seq_len"], torch.device("cpu"),
                                        calibrator.generator)
            while done.value < len(jobs) * done_batches:  # keep the load on until every device is done
                train_step(calibrator.model, calibrator.optimizer, batch_tensor, setup["dtype"], calibrator.scaler)
            row = profile_row(info, arch.name, setup["seq_len"], setup["dtype"], m) | {"device_name": name}
            results.put((rank, row))
    finally:
        cleanup()


PROG = "geodt calibrate scenario"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    scenario = _checked_scenario(args)
    if isinstance(scenario, str):
        print(f"{PROG}: {scenario}", file=sys.stderr)
        return 2
    jobs = [(n.name, j, n.gpu_count, n.cpu_cores, n.cpu_quota) for n in scenario.nodes for j in range(n.gpu_count)]
    measured = _measure_passes(scenario, args, jobs)
    if isinstance(measured, int):
        return measured
    rows, host = measured
    try:
        _write_profiles(args.out_dir, jobs, rows)
    except OSError as exc:  # a full disk: each profile is committed whole, a line above names each one written

        print(f"{PROG}: {write_error(args.out_dir, exc, 'the profiles listed above are whole, the rest not written')}"
              .replace("--out", "--out-dir"), file=sys.stderr)
        return 2

    # what a later validate's run is compared with (geodt/validation.py)
    say(host, "the calibration", "calibrate again before predicting a run from these profiles")
    return 0


def _checked_scenario(args):
    """The scenario without its profiles, with args.batch parsed; or what is wrong, in one line."""
    try:
        scenario = load_scenario(args.scenario, args.overrides, without_profiles=True, without_network_profile=True)
        args.batch = parse_batches(args.batch)
    except (InputError, UsageError) as exc:
        return str(exc)

    if check_threads(args.threads, least=1):
        return f"--threads: {check_threads(args.threads, least=1)}"
    if isinstance(args.batch, tuple):
        return "--batch: expected a list of batch sizes (auto searches one device at a time)"
    bad = [n.name for n in scenario.nodes if set(n.gpus) != {"cpu"}]
    if bad:
        return (f"{args.scenario}: nodes {', '.join(bad)}: expected CPU devices only (gpus = {{ \"cpu\" = G }}); "
                "calibrate GPUs with geodt calibrate device --device cuda:N")
    if not args.out_dir.is_dir():
        return f"--out-dir {args.out_dir}: expected an existing directory"
    return memory_problem(scenario, args.batch) or scenario


def memory_problem(scenario, batches: list[int], available_bytes: float | None = None) -> str | None:
    """Why this machine cannot hold every device process at the largest batch at once
    (geodt/preflight.py's host memory rule), in one line, or None."""
    processes = sum(node.gpu_count for node in scenario.nodes)
    batch = max(batches)
    need = processes * host_process_bytes(memory_need_bytes(scenario, batch))
    try:
        check_host_memory(f"{scenario.name}: {processes} device process{'es' if processes != 1 else ''} of "
                          f"{scenario.model.preset} at batch {batch}", need,
                          available_memory_bytes() if available_bytes is None else available_bytes,
                          "expected smaller --batch sizes, a smaller model or sequence (--set model.preset=..., "
                          "--set model.seq_len=...) or fewer devices")
    except PreflightError as exc:
        return f"this machine cannot hold the calibration: {exc}"
    return None


def _measure_passes(scenario, args, jobs: list[tuple]) -> tuple[dict[int, list], object] | int:
    """--passes K: the whole calibration K times (each as _measure_least_steal), each device's row per batch
    from the pass with the median step (median_rows), and the host's shares over all K; or the exit status."""
    if args.passes == 1:
        return _measure_least_steal(scenario, args, jobs)
    before, passes = cpu_times(), []
    for k in range(args.passes):
        print(f"{PROG}: pass {k + 1} of {args.passes}", file=sys.stderr, flush=True)
        measured = _measure_least_steal(scenario, args, jobs)
        if isinstance(measured, int):
            return measured
        passes.append(measured[0])
    return median_rows(passes), host_share(before, cpu_times())


def median_rows(passes: list[dict[int, list]]) -> dict[int, list]:
    """{rank: rows} of several passes -> each device's row per batch from the pass whose median step is the
    median of the passes' (the lower of the two middle ones for an even count): a measured row, whole,
    not an average; a batch that ran out of memory in any pass keeps the first pass's row."""
    kept: dict[int, list] = {}
    for rank in passes[0]:
        kept[rank] = []
        for rows in zip(*(p[rank] for p in passes)):
            timed = sorted((r for r in rows if r["step_s_median"] is not None), key=lambda r: r["step_s_median"])
            kept[rank].append(timed[(len(timed) - 1) // 2] if len(timed) == len(rows) else rows[0])
    return kept


def _measure_least_steal(scenario, args, jobs: list[tuple]) -> tuple[dict[int, list], object] | int:
    """_measure_all, again up to --steal-retries times while the host's steal over it is above the threshold
    (a calibration under steal makes profiles slower than the machine: results/predict-the-run/); the rows
    with the least steal and that HostShare (None without /proc/stat), or the exit status."""
    best = None
    for attempt in range(args.steal_retries + 1):
        before = cpu_times()
        rows = _measure_all(scenario, args, jobs)
        if isinstance(rows, int):
            return rows
        host = host_share(before, cpu_times())
        if best is None or (host is not None and host.steal_pct < best[1].steal_pct):
            best = (rows, host)
        if host is None or host.warning("") is None:
            break
        if attempt < args.steal_retries:
            print(f"{PROG}: steal {host.steal_pct:.1f}% of the CPU time over the calibration: measuring again "
                  f"({attempt + 1} of {args.steal_retries})", file=sys.stderr, flush=True)
    return best


def _measure_all(scenario, args, jobs: list[tuple]) -> dict[int, list] | int:
    """Every device process at once; {rank: its rows}, or the exit status when interrupted or failed."""
    # deferred: torch; calibrate scenario --help and its checks read without it
    import torch.multiprocessing as mp  # noqa: PLC0415

    setup = {"preset": scenario.model.preset, "base_dir": scenario.base_dir, "seq_len": scenario.model.seq_len,
             "dtype": scenario.model.dtype, "batches": list(args.batch), "repeats": args.repeats,
             "warmup": args.warmup, "threads": args.threads, "scenario": scenario.name, "parent_pid": os.getpid()}
    ctx = mp.get_context("spawn")
    barrier, done, results = ctx.Barrier(len(jobs)), ctx.Value("i", 0), ctx.Queue()
    rows: dict[int, list] = {rank: [] for rank in range(len(jobs))}
    try:
        procs = mp.start_processes(_device, args=(jobs, setup, barrier, done, results), nprocs=len(jobs),
                                   join=False, start_method="spawn")
        with tqdm(total=len(jobs) * len(args.batch), desc="calibrate scenario", unit="row", file=sys.stderr) as bar:
            for _ in range(len(jobs) * len(args.batch)):
                rank, row = results.get()
                rows[rank].append(row)
                bar.update(1)
        while not procs.join():
            pass
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing written", file=sys.stderr)
        return 130
    except mp.ProcessRaisedException as exc:
        print(f"{PROG}: a device process failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    return rows


def _write_profiles(out_dir: Path, jobs: list[tuple], rows: dict[int, list]) -> None:
    """One profile per device, <node>-<j>.csv, replacing any earlier one; a line each."""
    for rank, (node, j, *_rest) in enumerate(jobs):
        path = child_path(out_dir, f"{node}-{j}.csv")  # node names hold no / (formats/limits.py)
        write_new_profile(path, rows[rank])  # a scenario calibration is one measurement: the whole set is new
        medians = ", ".join(f"b{r['batch_size']} {r['step_s_median'] * 1e3:.1f} ms" for r in rows[rank]
                            if r["step_s_median"] is not None)
        print(f"{path}: {node} device {j + 1}/{jobs[rank][2]}: {medians}")


if __name__ == "__main__":
    raise SystemExit(main())
