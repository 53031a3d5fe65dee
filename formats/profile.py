"""Calibration profiles on disk: the columns `geodt calibrate` writes and the checked reader.

docs/DESIGN.md, "Profiles": tidy CSV, one row per batch size tried (out-of-memory rows
included). calibrate/profile_writer.py writes it; simulator/models/profile_fit.py turns it into the
timing and memory model t(b), m(b) the simulator uses. Torch-free.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from formats.files import read_regular_file, short

COLUMNS: tuple[str, ...] = (
    "device_name", "device_index", "gpu_key", "model", "seq_len", "dtype", "batch_size",
    "step_s_median", "step_s_mean", "step_s_p10", "step_s_p90", "repeats", "peak_mem_bytes", "mem_total_bytes",
    "oom", "tokens_per_s", "sm_util_pct", "mem_util_pct", "power_w", "torch_version",
    "cuda_version", "driver_version", "host", "measured_at", "compiled", "warmup_steps", "warmup_s",
    "outer_step_cpu_ns_per_param", "outer_step_device_ns_per_param",
    "ckpt_snapshot_ns_per_byte", "ckpt_write_ns_per_byte",
)
# Columns a profile written before them lacks, and what they read as: the mean as empty
# (simulator/models/profile_fit.py then uses the median), compiled as false (every step was eager
# before [training] compile existed), the warm-up as unmeasured.
ADDED_COLUMNS: dict[str, str] = {"step_s_mean": "", "compiled": "false", "warmup_steps": "", "warmup_s": "",
                                 "outer_step_cpu_ns_per_param": "", "outer_step_device_ns_per_param": "",
                                 "ckpt_snapshot_ns_per_byte": "", "ckpt_write_ns_per_byte": ""}
# The host's outer step (`geodt calibrate device` times real.core.diloco's after the batches; the same
# on every row): nanoseconds per parameter with the outer state on the CPU (the weights' copies
# down and up included on a GPU) and on the device; empty where not measured.
OUTER_STEP_COLUMNS: dict[str, str] = {"cpu": "outer_step_cpu_ns_per_param", "device": "outer_step_device_ns_per_param"}
# The host's checkpoint (`geodt calibrate device` times real/checkpoint/checkpoint.py's snapshot and write
# after the outer step; the same on every row): nanoseconds per checkpoint byte for the snapshot
# into host memory, which blocks training, and for the write behind it; empty where not measured.
CHECKPOINT_COLUMNS: dict[str, str] = {"snapshot": "ckpt_snapshot_ns_per_byte", "write": "ckpt_write_ns_per_byte"}
# Columns that must hold one value across the file: one profile = one device, model, shape, step.
IDENTITY: tuple[str, ...] = ("device_name", "device_index", "gpu_key", "model", "seq_len", "dtype", "compiled")
MAX_PROFILE_BYTES = 64 << 20


class ProfileError(ValueError):
    """A profile that cannot be used: '<path>: <column or row>: expected ...'."""


def read_profile_frame(path: str | Path, *, drop_truncated: bool = False) -> pd.DataFrame:
    """The profile CSV as strings (empty cells as ''), columns checked; ProfileError otherwise.

    A row with fewer fields than the header, or a last line without its newline, was cut
    mid-write (a full disk, a killed copy): an error, or with drop_truncated (the writer, which
    remeasures it) left out. The file must be a regular file of at most MAX_PROFILE_BYTES."""
    path = Path(path)
    data = read_regular_file(path, "a calibration profile CSV", MAX_PROFILE_BYTES, ProfileError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{short(path)}: unreadable (not UTF-8); expected a profile CSV") from None
    lines = text.splitlines(keepends=True)
    if lines and len(lines) > 1:
        try:
            header_fields = len(next(csv.reader([lines[0]])))
            rows = list(csv.reader(lines[1:]))
        except csv.Error as exc:  # e.g. a field over csv's limit (128 KiB): no profile holds one
            raise ProfileError(f"{short(path)}: unreadable ({exc}); expected a profile CSV") from None
        cut = [i for i, row in enumerate(rows, start=1) if row and len(row) != header_fields]
        if not lines[-1].endswith("\n") and rows and (not cut or cut[-1] != len(rows)):
            cut.append(len(rows))
        if cut:
            if not drop_truncated or cut != [len(rows)]:
                raise ProfileError(f"{short(path)}: row {cut[0]}: {len(rows[cut[0] - 1])} fields or no line end; "
                                   f"expected {header_fields} (a row cut mid-write: remeasure it)")
            text = "".join(lines[:-1])
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise ProfileError(f"{short(path)}: unreadable ({type(exc).__name__}); expected a profile CSV") from None
    for column, default in ADDED_COLUMNS.items():
        if column not in frame.columns:
            frame[column] = default
        elif default:  # an empty cell means what a missing column means
            frame[column] = frame[column].where(frame[column] != "", default)
    missing = [c for c in COLUMNS if c not in frame.columns]
    extra = [c for c in frame.columns if c not in COLUMNS]
    if missing:
        raise ProfileError(f"{short(path)}: column {missing[0]!r} missing; expected columns {', '.join(COLUMNS)}")
    if extra:
        raise ProfileError(f"{short(path)}: column {short(repr(extra[0]))} unknown; expected columns "
                           f"{', '.join(COLUMNS)}")
    return frame
