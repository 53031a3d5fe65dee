"""Entry point of `geodt calibrate device`: measure a device into a profile.

It returns an exit code. Bad input is one line on stderr and exit 2, before anything is
measured or written. torch is imported only once `calibrate` has checked its arguments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from facts.presets import PRESETS, PresetError, load_arch
from formats.cli import DIGITS, OneLineParser, non_negative_int, positive_int
from formats.limits import DEFAULT_CPU_MAX_BATCH
from formats.owners import add_force_argument
from formats.sections import COMPILE_MODES
from formats.wire import MODEL_DTYPES


class UsageError(ValueError):
    """A bad command-line option (printed as one line, exit 2)."""


def parse_batches(text: str) -> list[int] | tuple[str, int]:
    """'1,2,4,8' -> [1, 2, 4, 8] (sorted, unique); 'auto' / 'auto:N' -> ('auto', start N, default 1)."""
    if text == "auto" or text.startswith("auto:"):
        start = text.partition(":")[2] or "1"
        if not DIGITS.fullmatch(start) or int(start) <= 0:
            raise UsageError(f"--batch {text!r}: expected auto or auto:N with N a positive integer")
        return ("auto", int(start))
    parts = [p.strip() for p in text.split(",")]
    if not all(DIGITS.fullmatch(p) and int(p) > 0 for p in parts):
        raise UsageError(f"--batch {text!r}: expected a comma-separated list of positive integers "
                         "(e.g. 1,2,4,8) or auto")
    return sorted({int(p) for p in parts})


def _cpu_quota(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of cores, got {text!r}") from None
    if not 0.01 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected a share of cores in [0.01, 1024], got {text!r}")
    return value


def _core_list(text: str) -> list[int]:
    try:
        cores = [int(v) for v in text.split(",") if v.isascii()]
    except ValueError:
        cores = []
    if not cores or len(cores) != len(text.split(",")) or min(cores) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated core indices like 0,1, got {text!r}")
    return cores


def calibrate_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="geodt calibrate device", description="Measure training-step time and peak memory per "
                "batch size on a device, into a profile CSV (docs/DESIGN.md, 'Profiles').")
    p.add_argument("--device", default="cpu", help="cpu, cuda:N, or all (every CUDA device: one "
                   "file per device, OUT-cudaN.csv) [cpu]")

    p.add_argument("--model", default="tiny", help=f"preset ({', '.join(PRESETS)}) or a LLaMA config.json [tiny]")
    p.add_argument("--seq-len", type=positive_int, default=1024, help="tokens per sample [1024]")
    p.add_argument("--dtype", choices=MODEL_DTYPES, default=None,
                   help="autocast dtype [bf16 on CUDA, fp32 on CPU: CPUs without bf16 units run bf16 "
                   "autocast far slower than fp32]")
    p.add_argument("--batch", default="1,2,4,8", help="batch sizes per step: 1,2,4,8 or auto "
                   "(double until OOM, then bisect; auto:N starts at N) [1,2,4,8]")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed steps per batch [10]")
    p.add_argument("--warmup", type=non_negative_int, default=3, help="untimed steps per batch first [3]")
    p.add_argument("--max-batch", type=positive_int, default=None,
                   help=f"--batch auto never tries a larger batch [{DEFAULT_CPU_MAX_BATCH} on CPU, "
                   "unbounded on CUDA]")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads [torch's default]")
    p.add_argument("--cpu-quota", type=_cpu_quota, default=None, metavar="CORES",
                   help="CPU device: measure under a CPU quota of this many cores (0.6 = 60%% of one core; "
                   "needs root and the cgroup cpu controller), as a scenario node's cpu_quota runs it")
    p.add_argument("--cpu-cores", type=_core_list, default=None, metavar="0,1",
                   help="CPU device: pin the measurement to these cores, as a node's cpu_cores")
    p.add_argument("--seed", type=non_negative_int, default=0, help="model init and token seed [0]")
    p.add_argument("--compile", choices=COMPILE_MODES, default="auto",
                   help="the step's torch.compile'd blocks, as [training] compile: on, off, or auto "
                   "(on for CUDA devices, off for CPU) [auto]")
    p.add_argument("--out", required=True, type=Path, help="profile CSV; an existing one is completed")
    add_force_argument(p)
    return p


def calibrate_main(argv: list[str] | None = None) -> int:
    """`geodt calibrate`: check everything, then measure each device into its profile; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = calibrate_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error, already printed as one line (2), or --help (0)
        return exc.code
    try:
        batches = parse_batches(args.batch)
        arch = load_arch(args.model)
    except (UsageError, PresetError) as exc:
        print(f"geodt calibrate: {exc}", file=sys.stderr)
        return 2

    # deferred: torch (calibrate/device_run.py measures); --help and the checks above read without it
    from calibrate.device_run import measure_devices  # noqa: PLC0415

    return measure_devices(args, arch, batches)
