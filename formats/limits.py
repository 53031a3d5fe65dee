"""Limits on the sizes and names a scenario may hold, checked when it is loaded.

Far beyond any real cluster, and small enough that every product the models form stays
finite and every time keeps its precision (a step of 1e-30 s after a sync of 1e30 s would
vanish in float64). Names become CSV cells and output paths, so they are checked too.
"""
from __future__ import annotations

import os

# A key's bounds sit beside its definition (formats/sections.py's `key(..., bounds=...)`): far beyond
# any real cluster, and small enough that every product the models form stays finite. These are the
# bounds on what is not a section key.
SEED_MAX = 2**63 - 1
MAX_GPUS_PER_TYPE = 10**5  # a node's count of one GPU type
MAX_NODES = 100_000
# geodt calibrate device's --max-batch when the device is a CPU (its help and its measurement read it)
DEFAULT_CPU_MAX_BATCH = 64
# Names become file names (calibrate scenario's DIR/<node>-<j>.csv and its .<name>.lock, out/<scenario>):
# a file name holds at most 255 bytes (NAME_MAX), so the limit counts UTF-8 bytes, not characters
# (200 'é' are 400 bytes), with room left for the prefix and suffixes added to it.
MAX_NAME_BYTES = 200
MAX_SCENARIO_BYTES = 16 << 20
# --threads: torch threads per process. More than a few per logical CPU only contend, and an
# absurd count (100000) crashes OpenMP's thread pool (SIGSEGV) instead of failing cleanly.
THREADS_PER_CPU = 4  # a scenario or config.json larger than this is refused unread


def max_threads() -> int:
    """The most torch threads a process may ask for here: THREADS_PER_CPU per logical CPU."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def check_threads(threads: int, least: int = 0) -> str | None:
    """Why a --threads value is refused, or None (least: 0 where 0 means automatic)."""
    if least <= threads <= max_threads():
        return None
    return (f"expected {'0 (auto) or ' if least == 0 else ''}1 to {max_threads()} ({THREADS_PER_CPU} per logical "
            f"CPU of this machine's {os.cpu_count() or 1}), got {threads}")


def check_node_name(name: str) -> str | None:
    """Why a node name is refused, or None. Names become CSV cells and lines of printed tables:
    a leading = + - @ would be a formula in a spreadsheet, a control character breaks the line;
    and file names (calibrate's <node>-<j>.csv): a / or \\ or a leading . (.., a hidden file) would
    make a path outside the output folder or one that is not plain."""
    if not name:
        return "expected a non-empty node name"
    if _name_bytes(name) > MAX_NAME_BYTES:
        return f"expected at most {MAX_NAME_BYTES} bytes in UTF-8 (it names files), got {_name_bytes(name)}"
    if name[0] in "=+-@":
        return f"{name!r} starts with {name[0]!r}; expected a name that does not start with = + - @ (CSV formulas)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"{name!r} holds a control character; expected printable characters"
    if "/" in name or "\\" in name or name.startswith("."):
        return (f"{name!r}: expected a name without / or \\ that does not start with . (it names files such as "
                "<node>-0.csv in an output folder)")
    return None


def check_scenario_name(name: str) -> str | None:
    """Why a scenario name is refused, or None: it names the default output directory out/<name>."""
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        return f"{name!r}: expected a name that is not a path (no / or \\, not . or ..); it names out/<name>"
    if _name_bytes(name) > MAX_NAME_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return (f"{name!r}: expected printable characters, at most {MAX_NAME_BYTES} bytes in UTF-8 "
                "(it names a directory)")
    return None


def _name_bytes(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


# The work a command takes on, estimated before it plans: timeline rows (one per node and round;
# sync-ddp's rounds are inner steps; a Streaming DiLoCo plan adds a sync row per fragment), summed
# over the strategies it plans or simulates. Up to WORK_ROWS a command runs; up to WORK_ROWS_LARGE
# it asks for --large; beyond, it refuses. Measured on this project's 2-core machine at 9897cff:
# 4,000,000 rows on the slowest path (--engine simpy --full-timeline --csv) took 24 s, 0.74 GiB
# and wrote 725 MB, so WORK_ROWS is about a minute there; on the default path (analytic engine,
# blocks of rounds, Parquet) 10 M rows of every strategy took 21 s and 0.37 GiB.
WORK_ROWS = 10_000_000
WORK_ROWS_LARGE = 200_000_000
# Output per row, measured: the CSVs of the slowest path (725 MB / 4.0 M rows); Parquet with the
# timeline summed in blocks (42 MB / 1.2 M rows, most of it syncs.parquet).
BYTES_PER_ROW = {"csv": 180, "parquet": 35}
# A sweep's streaming recurrence (chunks x rounds x nodes x 17 fragment-sync steps): about 5,000
# a second here (one chunk of 210 scenarios at 10^3 rounds, 68,000 steps, took 14 s), so the
# default bound is about ten minutes (the 10^6-scenario sweep of benchmarks/bench_sweep.py takes
# 1.36 M of them).
SWEEP_STEPS = 3_000_000
SWEEP_STEPS_LARGE = 60_000_000


def large_help(unit: str = "timeline rows (nodes x rounds, summed over the strategies)",
               limits: tuple[int, int] = (WORK_ROWS, WORK_ROWS_LARGE)) -> str:
    """--large's help, in the user's words: the two limits and what they count."""
    return f"allow work beyond {limits[0]:,} {unit}, up to {limits[1]:,} (it takes longer)"


def check_work(rows_by_strategy: dict[str, int], large: bool = False, unit: str = "timeline rows",
               output: str | None = None, limits: tuple[int, int] = (WORK_ROWS, WORK_ROWS_LARGE),
               duration: str = "about a minute") -> str | None:
    """Why the estimated work is refused, or None. One line: the largest strategy's rows, the total,
    the output it would write (`output`: "csv" or "parquet", where rows are written), the limit and
    what to do. `limits`: (the default bound, the bound with --large)."""
    default_rows, large_rows = limits
    total = sum(rows_by_strategy.values())
    if total <= (large_rows if large else default_rows):
        return None
    worst = max(rows_by_strategy, key=rows_by_strategy.get)
    what = (f"strategy {worst}: {rows_by_strategy[worst]:,} {unit}"
            + (f" ({total:,} over {len(rows_by_strategy)} strategies)" if len(rows_by_strategy) > 1 else "")
            + (f", about {total * BYTES_PER_ROW[output] / 1e9:.1f} GB of output" if output else ""))
    if large or total > large_rows:
        return f"{what}; expected at most {large_rows:,} (fewer training.rounds, local_steps, nodes or strategies)"
    return (f"{what}; expected at most {default_rows:,} by default ({duration}); add --large to allow up to "
            f"{large_rows:,}, or use fewer training.rounds, local_steps, nodes or strategies")
