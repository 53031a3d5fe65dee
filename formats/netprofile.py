"""Network profiles on disk: the columns `geodt calibrate network` writes and the checked reader.

One row per (kind, processes, size[, payload_dtype, collective]), tidy CSV (docs/DESIGN.md,
"Outputs"); kinds: `all_reduce` (a SUM all-reduce of `size` bytes among `processes` ranks),
`outer_step` (the executor's outer step over `size` parameters), `checkpoint` (writing `size`
bytes), `snapshot` (copying `size` bytes of state into host memory: the part of a checkpoint
that blocks training, real/checkpoint/checkpoint.py), `encode` and `decode` (real/core/sync.py's
encode() of `size` fp32 elements into `payload_dtype`, and decode() back). The columns payload_dtype and
collective are optional (profiles written before they existed still load): absent or empty, a row is fp32 and ring.
So is `node`: empty, a row is every process's (each repeat's slowest); a scenario node's name,
that node's own time in the same measurement (shaped-WAN all-reduces, where nodes on unequal
links end the same average at different times). And `seconds_mean`: a row's time is its mean
where the profile has one, else its median; a run sums its syncs, outer steps and checkpoints,
so the mean is what predicts them (on the shaped links a few slow repeats of an average are
part of what a run pays; the median leaves them out).
geodt/calibration/links.py writes it; simulator/models/netfit.py fits the simulator's models to it. Torch-free.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from formats.files import read_regular_file, short
from formats.wire import COLLECTIVES, PAYLOAD_BYTES

NET_COLUMNS: tuple[str, ...] = (
    "kind", "processes", "backend", "size", "seconds_median", "seconds_p10", "seconds_p90",
    "repeats", "host", "torch_version", "measured_at",
)
OPTIONAL_COLUMNS: tuple[str, ...] = ("payload_dtype", "collective", "node", "seconds_mean")
KINDS = ("all_reduce", "outer_step", "checkpoint", "snapshot", "encode", "decode")
CODEC_KINDS = ("encode", "decode")
SHAPED_BACKEND = "gloo+shaped"  # backend of rows measured over a shaped WAN (`--wan shaped`)
MAX_BYTES = 16 << 20  # a profile is a few hundred rows


class NetProfileError(ValueError):
    """'<path>: <row/column>: expected ...' for a network profile that cannot be used."""


def read_network_rows(path: str | Path) -> pd.DataFrame:
    """The profile's rows as kind, processes, size, seconds (the mean, else the median), payload_dtype,
    collective, node, each checked; NetProfileError naming the file, line and column otherwise."""
    path = Path(path)
    data = read_regular_file(path, "a network profile CSV (geodt calibrate network)", MAX_BYTES, NetProfileError)
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise NetProfileError(f"{path}: unreadable ({type(exc).__name__}); expected a network profile CSV") from None
    missing = [c for c in NET_COLUMNS if c not in frame.columns]
    if missing:
        raise NetProfileError(f"{path}: column {missing[0]!r} missing; expected columns {', '.join(NET_COLUMNS)}")
    rows = []
    for i, row in enumerate(frame.to_dict("records"), start=2):
        if row["kind"] not in KINDS:
            raise NetProfileError(f"{path}: line {i}: kind: expected one of {', '.join(KINDS)}, "
                                  f"got {short(repr(row['kind']))}")
        column = "seconds_mean" if row.get("seconds_mean") else "seconds_median"
        try:
            processes, size, seconds = int(row["processes"]), float(row["size"]), float(row[column])
        except ValueError:
            raise NetProfileError(f"{path}: line {i}: processes/size/{column}: expected numbers") from None
        if processes < 1 or not (math.isfinite(size) and size > 0 and math.isfinite(seconds) and seconds > 0):
            raise NetProfileError(f"{path}: line {i}: expected processes >= 1 and positive finite size and seconds")
        dtype, collective = row.get("payload_dtype") or "fp32", row.get("collective") or "ring"
        if dtype not in PAYLOAD_BYTES:
            raise NetProfileError(f"{path}: line {i}: payload_dtype: expected one of {', '.join(PAYLOAD_BYTES)}, "
                                  f"got {short(repr(dtype))}")
        if collective not in COLLECTIVES:
            raise NetProfileError(f"{path}: line {i}: collective: expected one of {', '.join(COLLECTIVES)}, "
                                  f"got {short(repr(collective))}")
        rows.append((row["kind"], processes, row["backend"], size, seconds, dtype, collective, row.get("node", "")))
    return pd.DataFrame(rows, columns=["kind", "processes", "backend", "size", "seconds", "payload_dtype",
                                       "collective", "node"])
