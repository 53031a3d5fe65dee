"""Limits on the sizes and names a scenario may hold, checked when it is loaded.

Far beyond any real cluster, and small enough that every product the models form stays
finite and every time keeps its precision (a step of 1e-30 s after a sync of 1e30 s would
vanish in float64). Names become CSV cells and output paths, so they are checked too.
"""
from __future__ import annotations

from typing import Any

from formats.config import require_range

# Inclusive bounds per key.
LIMITS = {
    "seq_len": (1, 10**7), "params": (1.0, 1e15), "flops_per_token": (1.0, 1e18),
    "rounds": (1, 10**6), "local_steps": (1, 10**6), "batch_size": (1, 1 << 16),
    "bandwidth_gbps": (1e-6, 1e6), "uplink_gbps": (1e-6, 1e6), "intra_node_gbps": (1e-3, 1e6),
    "latency_ms": (0.0, 1e7), "step_time_s": (1e-7, 1e6), "gpu_count": (1, 10**5), "seed": (0, 2**63 - 1),
}
MAX_NODES = 100_000
MAX_NAME_CHARS = 200
MAX_SCENARIO_BYTES = 16 << 20  # a scenario or config.json larger than this is refused unread


def limit(obj: Any, *names: str) -> None:
    for name in names:
        lo, hi = LIMITS[name]
        require_range(obj, name, lo, hi)


def check_node_name(name: str) -> str | None:
    """Why a node name is refused, or None. Names become CSV cells and lines of printed tables:
    a leading = + - @ would be a formula in a spreadsheet, a control character breaks the line."""
    if not name:
        return "expected a non-empty node name"
    if len(name) > MAX_NAME_CHARS:
        return f"expected at most {MAX_NAME_CHARS} characters, got {len(name)}"
    if name[0] in "=+-@":
        return f"{name!r} starts with {name[0]!r}; expected a name that does not start with = + - @ (CSV formulas)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"{name!r} holds a control character; expected printable characters"
    return None


def check_scenario_name(name: str) -> str | None:
    """Why a scenario name is refused, or None: it names the default output directory out/<name>."""
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        return f"{name!r}: expected a name that is not a path (no / or \\, not . or ..); it names out/<name>"
    if len(name) > MAX_NAME_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"{name!r}: expected at most {MAX_NAME_CHARS} printable characters"
    return None


# The work a command takes on, estimated before it plans: timeline rows (one per node and round;
# sync-ddp's rounds are inner steps; a Streaming DiLoCo plan adds a sync row per fragment), summed
# over the strategies it plans or simulates. Measured on this project's 2-core machine: 1.4 M rows
# (the paper at 10^4 rounds, every strategy) took 52 s, 4.9 GB of memory and wrote 800 MB.
# Up to WORK_ROWS a command runs; up to WORK_ROWS_LARGE it asks for --large; beyond, it refuses.
WORK_ROWS = 1_000_000
WORK_ROWS_LARGE = 20_000_000
BYTES_PER_ROW = 240  # timeline.csv and syncs.csv, measured (335 MB / 1.44 M rows)


def check_work(rows_by_strategy: dict[str, int], large: bool = False, unit: str = "timeline rows") -> str | None:
    """Why the estimated work is refused, or None. One line: the largest strategy's rows, the total,
    the output it would write (for timeline rows), the limit and what to do."""
    total = sum(rows_by_strategy.values())
    limit_rows = WORK_ROWS_LARGE if large else WORK_ROWS
    if total <= limit_rows:
        return None
    worst = max(rows_by_strategy, key=rows_by_strategy.get)
    what = (f"strategy {worst}: {rows_by_strategy[worst]:,} {unit}"
            + (f" ({total:,} over {len(rows_by_strategy)} strategies)" if len(rows_by_strategy) > 1 else "")
            + (f", about {total * BYTES_PER_ROW / 1e9:.1f} GB of output" if unit == "timeline rows" else ""))
    if large or total > WORK_ROWS_LARGE:
        return f"{what}; expected at most {WORK_ROWS_LARGE:,} (fewer training.rounds, local_steps, nodes or strategies)"
    return (f"{what}; expected at most {WORK_ROWS:,} by default (about a minute); add --large to allow up to "
            f"{WORK_ROWS_LARGE:,}, or use fewer training.rounds, local_steps, nodes or strategies")
