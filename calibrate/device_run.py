"""`geodt calibrate device` once its arguments are checked: each device measured into its profile (torch).

calibrate/cli.py (the parser and the checks that need no device) imports this module last, so that
`geodt calibrate device --help` and its refusals read without torch.
"""
from __future__ import annotations

import atexit
import sys
from dataclasses import replace

import pandas as pd
import torch
from tqdm import tqdm

from calibrate.harness import (
    UNBOUNDED_MAX_BATCH,
    Calibrator,
    HarnessError,
    auto_search,
    describe_device,
    profile_row,
    resolve_devices,
)
from calibrate.profile_writer import ProfileWriter, out_paths
from formats.errors import write_error
from formats.limits import DEFAULT_CPU_MAX_BATCH, check_threads
from formats.profile import ProfileError
from formats.scenario import compiled_step
from train.cpulimit import CpuLimitError, apply_cpu_limits, describe_limits

# p90/p10 above this flags a batch whose steps were disturbed (another process on the CPU...).
NOISY_SPREAD = 1.5


def measure_devices(args, arch, batches) -> int:
    """Measure each device of the checked arguments into its profile, then print its table; the exit status."""
    try:
        dtype, max_batch, jobs = _open_jobs(args, arch, batches)
    except (HarnessError, ProfileError) as exc:
        print(f"geodt calibrate: {exc}", file=sys.stderr)
        return 2
    try:  # every way out releases the writers' locks and removes their files (an error too)
        for info, writer in jobs:
            try:
                largest = _measure(args, arch, dtype, batches, max_batch, info, writer)
            except KeyboardInterrupt:
                print(f"geodt calibrate: interrupted; {len(writer.rows)} row(s) kept in {writer.path}; "
                      "rerun the same command to finish", file=sys.stderr)
                return 130
            writer.close()
            _report(args, arch, dtype, batches, max_batch, info, writer, largest)
    except OSError as exc:  # a full disk (or quota) while a row is committed: the rows before it stay whole
        print(f"geodt calibrate: {write_error(args.out, exc, 'the rows committed before are kept')}", file=sys.stderr)
        return 2
    finally:
        for _, writer in jobs:
            writer.close()
    return 0


def _open_jobs(args, arch, batches) -> tuple[str, int, list]:
    """Check the devices, dtype, batches and CPU limits, apply the limits and threads, and open
    one ProfileWriter per device: (dtype, max_batch, [(device info, writer)]). HarnessError or
    ProfileError (no writer left open) when something is wrong."""
    devices = resolve_devices(args.device)
    cpu = devices == ["cpu"]
    dtype = args.dtype or ("fp32" if cpu else "bf16")
    if not cpu and dtype == "bf16" and not all(torch.cuda.get_device_capability(d) >= (8, 0) for d in devices):
        # pre-Ampere GPUs only emulate bf16: timings would not be the GPU's
        raise HarnessError(f"--dtype bf16: {args.device} has no native bf16 (compute capability "
                           "below 8.0); expected --dtype fp16 or fp32")
    max_batch = args.max_batch or (DEFAULT_CPU_MAX_BATCH if cpu else UNBOUNDED_MAX_BATCH)
    if isinstance(batches, tuple) and batches[1] > max_batch:
        raise HarnessError(f"--batch {args.batch}: starts above --max-batch {max_batch}")
    if isinstance(batches, list) and batches[-1] > max_batch:  # refused up front, not an allocator error later
        raise HarnessError(f"--batch {batches[-1]}: above --max-batch {max_batch}"
                           f"{' (the default on CPU)' if cpu and not args.max_batch else ''}; "
                           "expected smaller batches, or a larger --max-batch")
    if args.threads:
        if check_threads(args.threads, least=1):
            raise HarnessError(f"--threads: {check_threads(args.threads, least=1)}")
        torch.set_num_threads(args.threads)
    limits = _apply_cpu_limits(args, cpu)
    jobs = []
    try:
        for device, out in zip(devices, out_paths(args.out, devices)):
            info = describe_device(device)
            if limits:  # the limits are part of what was measured: the profile's identity says so
                info = replace(info, device_name=f"{info.device_name[:-1]}, {limits})"
                               if info.device_name.endswith(")") else f"{info.device_name} ({limits})")
            identity = {"device_name": info.device_name, "device_index": info.device_index,
                        "gpu_key": info.gpu_key, "model": arch.name, "seq_len": args.seq_len, "dtype": dtype,
                        "compiled": compiled_step(args.compile, device != "cpu")}
            jobs.append((info, ProfileWriter(out, identity, force=args.force)))
    except (HarnessError, ProfileError):
        for _, writer in jobs:
            writer.close()
        raise
    return dtype, max_batch, jobs


def _apply_cpu_limits(args, cpu: bool) -> str:
    """--cpu-quota / --cpu-cores on this process (undone at exit); their description, or ''."""
    if args.cpu_quota is None and args.cpu_cores is None:
        return ""
    if not cpu:
        raise HarnessError("--cpu-quota/--cpu-cores: expected --device cpu (they limit a CPU device)")

    try:
        atexit.register(apply_cpu_limits(args.cpu_cores, args.cpu_quota, "geodt-calibrate"))
    except CpuLimitError as exc:
        raise HarnessError(str(exc)) from None
    return describe_limits(args.cpu_cores, args.cpu_quota)


def _measure(args, arch, dtype: str, batches, max_batch: int, info, writer) -> int | None:
    """Measure the batches not yet in the writer's file, appending each row as it is measured;
    returns the largest batch that fits (--batch auto) or None."""
    if not info.gpu_key:
        print(f"geodt calibrate: warning: {info.device_name!r} matches no GPU catalog key; "
              "gpu_key left empty", file=sys.stderr)
    done = writer.measured()
    calibrator = None
    bar = tqdm(total=None if isinstance(batches, tuple) else len(batches), desc=f"calibrate {info.device}",
               unit="batch", file=sys.stderr)

    def fits(batch: int) -> bool:
        nonlocal calibrator
        if batch not in done:
            if calibrator is None:  # built lazily: a finished file needs no model
                calibrator = Calibrator(arch, args.seq_len, dtype, info.device, args.repeats, args.warmup, args.seed,
                                        compile_mode=args.compile)
            bar.set_postfix(batch=batch)
            row = profile_row(info, arch.name, args.seq_len, dtype, calibrator.measure(batch),
                              compiled=calibrator.compiled, warmup_steps=args.warmup)
            writer.append(row)
            done[batch] = {k: str(v) for k, v in row.items()}
        bar.update(1)
        return done[batch]["oom"].lower() not in ("true", "1")

    try:
        if isinstance(batches, tuple):
            return auto_search(fits, batches[1], max_batch)
        for batch in batches:
            fits(batch)
        return None
    finally:
        bar.close()


def _report(args, arch, dtype: str, batches, max_batch: int, info, writer, largest: int | None) -> None:
    """The profile's rows as a table, a warning for noisy batches, and the largest fitting batch."""
    print(f"{writer.path}: {info.device_name} [{info.gpu_key or '?'}], {arch.name}, "
          f"seq_len {args.seq_len}, {dtype}")
    print(_table(writer.rows))
    noisy = _noisy_batches(writer.rows)
    if noisy:
        print(f"geodt calibrate: warning: batch {', '.join(map(str, noisy))}: p90 above "
              f"{NOISY_SPREAD}x p10, the device was probably busy; check with `geodt profile check "
              f"{writer.path}` and remeasure into a new file if needed", file=sys.stderr)
    if isinstance(batches, tuple):
        print(f"largest batch that fits: {largest if largest else 'none'}"
              + (f" (capped by --max-batch {max_batch})" if largest == max_batch else ""))


def _table(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    if frame.empty:
        return "(no rows)"
    frame = frame.astype(str).replace("", float("nan"))
    frame["batch_size"] = frame["batch_size"].astype(int)
    frame = frame.sort_values("batch_size")
    out = pd.DataFrame({"batch": frame["batch_size"]})
    for column, scale, name in (("step_s_median", 1e3, "step_ms"), ("step_s_p10", 1e3, "p10_ms"),
                                ("step_s_p90", 1e3, "p90_ms"), ("tokens_per_s", 1, "tokens/s"),
                                ("peak_mem_bytes", 2.0 ** -20, "peak_MiB")):
        out[name] = frame[column].astype(float) * scale
    out["oom"] = frame["oom"]
    return out.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="-")


def _noisy_batches(rows: list[dict]) -> list[int]:
    noisy = []
    for row in rows:
        try:
            if float(row["step_s_p90"]) > NOISY_SPREAD * float(row["step_s_p10"]):
                noisy.append(int(row["batch_size"]))
        except (TypeError, ValueError):  # OOM rows have no timing
            pass
    return sorted(noisy)
