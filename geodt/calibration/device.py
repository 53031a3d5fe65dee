"""`geodt calibrate device`: a device's profile (calibrate/cli.py), then the outer step on its host.

After the batches, the host's DiLoCo outer step (real.core.diloco.time_outer_step: pseudo-gradient,
divide, Nesterov, weights back; no all-reduce) is timed with the weights on the device and the
outer state on the CPU (OpenDiLoCo's place; on a GPU the weights' copies down and up are
included) and, on a GPU, on the device, and written into the profile as nanoseconds per
parameter (formats/profile.py OUTER_STEP_COLUMNS, the same on every row). The simulator prices
that node's outer step from them (simulator/models/network.py).

Then the host's checkpoint (real.checkpoint.checkpoint.time_checkpoint: the snapshot into host memory that
blocks training, and the write behind it, into the profile's own folder, the disk this host's
runs are likeliest to use) goes in as nanoseconds per byte (CHECKPOINT_COLUMNS); the simulator
prices checkpoints from them where no network profile measured them (simulator/models/checkpoints.py).
Both run here, in geodt/, because they time the executor's code (calibrate/ does not import real/).

Before anything, a CPU calibration is priced by geodt/preflight.py's host memory rule (the step's
peak from simulator/models/memory.py at the largest batch listed, or auto's first): a model this machine
cannot hold (llama-3.1-8b on 24 GB) is refused in one line instead of failing in the allocator.
"""
from __future__ import annotations

import contextlib
import io
import statistics
import sys
from pathlib import Path

from calibrate.cli import UsageError, calibrate_main, calibrate_parser, parse_batches
from calibrate.profile_writer import out_paths, set_profile_columns
from facts.presets import PresetError, load_arch
from formats.profile import CHECKPOINT_COLUMNS, OUTER_STEP_COLUMNS
from geodt.preflight import PreflightError, available_memory_bytes, check_host_memory, host_process_bytes
from simulator.models.memory import traced_peak_bytes
from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM

# Parameters timed: the step is memory-bound streams, linear in the count, so a model's rate per
# parameter is measured on at most this many (4 fp32 buffers of 800 MB) to spare the host's memory.
MAX_TIMED_PARAMS = 200_000_000
REPEATS = 3
# A checkpoint's rate per byte is timed on at most this many parameters' state (16 bytes each:
# 800 MB in host memory and on disk), likewise linear in its size.
MAX_CHECKPOINT_PARAMS = 50_000_000
CHECKPOINT_REPEATS = 2


def outer_step_ns_per_param(device: str, params: int) -> dict[str, float]:
    """{"cpu": ns, "device": ns} per parameter of the outer step on this host (no "device" on CPU)."""
    # deferred: torch (the executor's outer step); calibrate device --help reads without it
    from real.core.diloco import time_outer_step  # noqa: PLC0415

    params = min(params, MAX_TIMED_PARAMS)
    places = {"cpu": "cpu"} if device == "cpu" else {"cpu": "cpu", "device": device}
    return {where: statistics.median(time_outer_step(params, REPEATS, device, state)) / params * 1e9
            for where, state in places.items()}


def checkpoint_ns_per_byte(device: str, params: int, directory) -> dict[str, float]:
    """{"snapshot": ns, "write": ns} per checkpoint byte on this host (module docstring)."""
    # deferred: torch (the executor's checkpoint); calibrate device --help reads without it
    from real.checkpoint.checkpoint import time_checkpoint  # noqa: PLC0415

    params = min(params, MAX_CHECKPOINT_PARAMS)
    snapshots, writes = time_checkpoint(params, CHECKPOINT_REPEATS, device, directory)
    size = CHECKPOINT_BYTES_PER_PARAM * params
    return {"snapshot": statistics.median(snapshots) / size * 1e9, "write": statistics.median(writes) / size * 1e9}


def cpu_memory_problem(argv: list[str], available_bytes: float | None = None) -> str | None:
    """Why this machine cannot hold the CPU calibration argv asks for, in one line, or None (also
    when argv is not valid: calibrate_main then says what is wrong)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            args = calibrate_parser().parse_args(argv)
        batches = parse_batches(args.batch)
        arch = load_arch(args.model)
    except (SystemExit, UsageError, PresetError):
        return None
    if args.device != "cpu":  # a GPU's out-of-memory is a measured row (calibrate/harness.py)
        return None
    batch = max(batches) if isinstance(batches, list) else batches[1]
    dtype = args.dtype or "fp32"
    need = host_process_bytes(traced_peak_bytes(arch, args.seq_len, batch, dtype))
    try:
        check_host_memory(f"--model {arch.name} at batch {batch}, seq_len {args.seq_len}, {dtype} (1 process)", need,
                          available_memory_bytes() if available_bytes is None else available_bytes,
                          "expected a smaller --model, --seq-len or --batch")
    except PreflightError as exc:
        return str(exc)
    return None


def main(argv: list[str]) -> int:
    problem = cpu_memory_problem(argv)
    if problem:
        print(f"geodt calibrate device: this machine cannot hold the calibration: {problem}", file=sys.stderr)
        return 2
    status = calibrate_main(argv)
    if status != 0 or "-h" in argv or "--help" in argv:
        return status
    from calibrate.harness import resolve_devices  # noqa: PLC0415  deferred: torch, once the help is past

    args = calibrate_parser().parse_args(argv)
    devices = resolve_devices(args.device)
    params = load_arch(args.model).params
    for device, path in zip(devices, out_paths(args.out, devices)):
        figures = outer_step_ns_per_param(device, params)
        set_profile_columns(path, {OUTER_STEP_COLUMNS[where]: ns for where, ns in figures.items()})
        print(f"{path}: outer step on this host, {min(params, MAX_TIMED_PARAMS):,} parameters: "
              + ", ".join(f"state on {'the device' if w == 'device' else 'the CPU'} {ns:.3f} ns per parameter"
                          for w, ns in figures.items()), file=sys.stderr)
        try:
            ckpt = checkpoint_ns_per_byte(device, params, Path(path).resolve().parent)
        except OSError as exc:  # a full or read-only disk: the profile stands without these columns
            print(f"{path}: checkpoint not timed ({exc.strerror or exc}); its columns left empty", file=sys.stderr)
            continue
        set_profile_columns(path, {CHECKPOINT_COLUMNS[part]: ns for part, ns in ckpt.items()})
        print(f"{path}: checkpoint on this host: snapshot {1 / ckpt['snapshot']:.2f} GB/s, "
              f"write {1 / ckpt['write']:.2f} GB/s", file=sys.stderr)
    return 0
