"""`geodt calibrate network`: time the executor's outer sync between real processes.

For each process count n (default 2), n processes join a gloo group as the executor's nodes
do (a FileStore on loopback locally; env:// under torchrun) and measure, after one warm-up
each, `--repeats` times:

- a SUM all-reduce of fp32 buffers from 64 KiB up to `--max-mib` (×4 per size);
- the outer step of real/core/diloco.py (pseudo-gradient, Nesterov SGD, copy back) over the same
  numbers of parameters, split into 1 Mi-parameter tensors as a model's layers are, on every
  rank at once (they all run it in a real sync; the slowest rank's time is kept);
- a checkpoint write of the same numbers of bytes (torch.save to a temp name, rename), on
  every rank at once into the output's directory, as real/checkpoint/checkpoint.py writes, and the
  snapshot before it (a fresh host copy of the state, the part that blocks training);
- per payload dtype (fp32, fp16, int8), real/core/sync.py's encode() of the same numbers of fp32
  elements and decode() back, on every rank at once, as every node encodes in a real sync
  (rows `encode` / `decode`, size in elements, column payload_dtype).

Rows go to a network profile CSV (simulator/models/netfit.py) that the simulator fits: ring
latency and bandwidth, outer-step cost per parameter, checkpoint write rate.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from formats.cli import OneLineParser
from formats.errors import write_error
from formats.netprofile import NetProfileError, read_network_rows
from formats.owners import TEMP_SUFFIX, add_force_argument, check_file_owner, remove_orphan_temps, temp_prefix
from simulator.models.netfit import read_network_profile
from simulator.outputs.outputs import write_bytes

KIB = 1024


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 2 or v > 64 for v in values):
        raise argparse.ArgumentTypeError(f"expected process counts between 2 and 64, got {text!r}")
    return values


def bounded_int(low: int, high: int):
    """argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {value}")
        return value
    return parse


def add_measure_arguments(group, max_mib: tuple[int, int], repeats: tuple[int, int], payload: str = "payload") -> None:
    """--max-mib, --repeats and --threads of both network calibrations (loopback, shaped WAN): (limit,
    default) of the first two, each its own."""
    group.add_argument("--max-mib", type=bounded_int(1, max_mib[0]), default=max_mib[1],
                       help=f"largest {payload} in MiB (default {max_mib[1]})")
    group.add_argument("--repeats", type=bounded_int(1, repeats[0]), default=repeats[1],
                       help=f"timed repeats per size (default {repeats[1]})")
    group.add_argument("--threads", type=bounded_int(0, 1024), default=0,
                       help="torch threads per process; 0 = cores / processes, as the executor")


def add_profile_out(group) -> None:
    """--out (the network profile, required) and --force, of both network calibrations."""
    group.add_argument("--out", required=True, help="network profile CSV to write")
    add_force_argument(group)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="geodt calibrate network", description=__doc__.splitlines()[0])
    p.add_argument("--network", action="store_true", help=argparse.SUPPRESS)  # the spelling before subcommands
    p.add_argument("--processes", type=_int_list, default=[2], help="process counts, e.g. 2,3,4 (default 2)")
    add_measure_arguments(p, max_mib=(4096, 64), repeats=(1000, 5))
    add_profile_out(p)
    return p


def sizes_bytes(max_mib: int) -> list[int]:
    sizes, size = [], 64 * KIB
    while size <= max_mib * KIB * KIB:
        sizes.append(size)
        size *= 4
    return sizes


def _affine_rate(fit) -> str:
    """'a ms + r Gbit/s' of a bytes fit."""
    rate = f"{8 / fit.per_unit_s / 1e9:.2f} Gbit/s" if fit.per_unit_s > 0 else "no cost per byte"
    return f"{fit.fixed_s * 1e3:.3f} ms + {rate}"


def check_network_out(out: Path, force: bool) -> str | None:
    """Why --out may not take a network profile (a file path in an existing directory, then
    formats/owners.py check_file_owner), or None: the line without the command's name."""
    if not out.parent.is_dir() or (out.exists() and not out.is_file()):
        return f"{out}: expected a file path in an existing directory"
    return check_file_owner(out, "network profile", read_network_rows, force)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out)
    why = check_network_out(out, args.force)
    if why is not None:
        print(f"geodt calibrate network: {why}", file=sys.stderr)
        return 2

    # deferred: torch and the executor's modules (link_timing.py); --help and the refusals above read without them
    from geodt.calibration.link_timing import measure, to_frame  # noqa: PLC0415

    sizes = sizes_bytes(args.max_mib)
    rows_by_n = {}
    remove_orphan_temps(out.parent, only=out.name)  # the checkpoint folder of a calibration that was killed
    try:
        with tqdm(total=len(sizes) * len(args.processes), desc="network", unit="size", file=sys.stderr) as bar, \
                tempfile.TemporaryDirectory(prefix=temp_prefix(out.name), suffix=TEMP_SUFFIX,
                                            dir=out.parent) as ckpt_dir:
            for n in args.processes:
                rows_by_n[n] = measure(n, sizes, args.repeats, args.threads, ckpt_dir, bar.update)
    except KeyboardInterrupt:
        print("geodt calibrate network: interrupted; nothing written", file=sys.stderr)
        return 130
    except OSError as exc:  # a full disk under the checkpoint measurement's files, beside --out
        print(f"geodt calibrate network: {write_error(out, exc, 'nothing written')}", file=sys.stderr)
        return 2
    frame = to_frame(rows_by_n, args.repeats)
    try:
        write_bytes(out, frame.to_csv(index=False, float_format="%.9g").encode())
    except OSError as exc:
        print(f"geodt calibrate network: {write_error(out, exc, 'nothing written')}", file=sys.stderr)
        return 2
    try:
        model = read_network_profile(out)
    except NetProfileError as exc:  # measured and kept, but the noise hides the payload's cost
        print(f"geodt calibrate network: {exc}", file=sys.stderr)
        return 2
    ring, outer, ckpt = model.ring, model.outer_step, model.checkpoint
    print(f"all-reduce (ring fit over {', '.join(map(str, args.processes))} processes): latency "
          f"{ring.latency_ms:.3f} ms, bandwidth {ring.bandwidth_gbps:.2f} Gbit/s")
    print(f"outer step: {outer.fixed_s * 1e3:.3f} ms + {outer.per_unit_s * 1e9:.3f} ns/parameter")
    print(f"checkpoint: {_affine_rate(ckpt)} write; snapshot (blocks training) {_affine_rate(model.snapshot)}")
    print(codec_summary(model))
    print(f"wrote {out}")
    return 0


def codec_summary(model) -> str:
    """One line: encode and decode cost per byte of fp32 pseudo-gradient, per payload dtype."""
    parts = []
    for dtype in ("fp32", "fp16", "int8"):
        enc, dec = model.codec_fit("encode", dtype), model.codec_fit("decode", dtype)
        if enc is not None and dec is not None:
            parts.append(f"{dtype} {enc.per_unit_s * 1e9:.3f} + {dec.per_unit_s * 1e9:.3f}")
    return ("encode + decode, ns per fp32 byte: " + ", ".join(parts)) if parts else "encode/decode: not measured"


if __name__ == "__main__":
    raise SystemExit(main())
