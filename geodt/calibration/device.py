"""`geodt calibrate device`: a device's profile (calibrate/cli.py), then the outer step on its host.

After the batches, the host's DiLoCo outer step (real.diloco.time_outer_step: pseudo-gradient,
divide, Nesterov, weights back; no all-reduce) is timed with the weights on the device and the
outer state on the CPU (OpenDiLoCo's place; on a GPU the weights' copies down and up are
included) and, on a GPU, on the device, and written into the profile as nanoseconds per
parameter (formats/profile.py OUTER_STEP_COLUMNS, the same on every row). The simulator prices
that node's outer step from them (simulator/network.py). It runs here, in geodt/, because it
times the executor's code (calibrate/ does not import real/).
"""
from __future__ import annotations

import statistics
import sys

# Parameters timed: the step is memory-bound streams, linear in the count, so a model's rate per
# parameter is measured on at most this many (4 fp32 buffers of 800 MB) to spare the host's memory.
MAX_TIMED_PARAMS = 200_000_000
REPEATS = 3


def outer_step_ns_per_param(device: str, params: int) -> dict[str, float]:
    """{"cpu": ns, "device": ns} per parameter of the outer step on this host (no "device" on CPU)."""
    from real.diloco import time_outer_step

    params = min(params, MAX_TIMED_PARAMS)
    places = {"cpu": "cpu"} if device == "cpu" else {"cpu": "cpu", "device": device}
    return {where: statistics.median(time_outer_step(params, REPEATS, device, state)) / params * 1e9
            for where, state in places.items()}


def main(argv: list[str]) -> int:
    from calibrate.cli import calibrate_main, calibrate_parser, out_paths
    from calibrate.harness import resolve_devices
    from calibrate.profile_writer import set_profile_columns
    from facts.presets import load_arch
    from formats.profile import OUTER_STEP_COLUMNS

    status = calibrate_main(argv)
    if status != 0 or "-h" in argv or "--help" in argv:
        return status
    args = calibrate_parser().parse_args(argv)
    devices = resolve_devices(args.device)
    params = load_arch(args.model).params
    for device, path in zip(devices, out_paths(args.out, devices)):
        figures = outer_step_ns_per_param(device, params)
        set_profile_columns(path, {OUTER_STEP_COLUMNS[where]: ns for where, ns in figures.items()})
        print(f"{path}: outer step on this host, {min(params, MAX_TIMED_PARAMS):,} parameters: "
              + ", ".join(f"state on {'the device' if w == 'device' else 'the CPU'} {ns:.3f} ns per parameter"
                          for w, ns in figures.items()), file=sys.stderr)
    return 0
