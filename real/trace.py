"""trace.csv: docs/DESIGN.md's timeline columns plus loss and tokens, one row per node and round.

Extra columns: `overrun_steps` (under --emulate, inner steps whose real compute took longer
than the emulated step time, so the step could not be padded to it), `ckpt_s` (the
checkpoint written after the sync, outside the round), `local_steps`, `batch_size` (per
device), `bytes_sent` (bytes this node put on the wire in that sync; real/sync.py) and
`peak_mem_bytes` (the largest peak memory of the node's device processes during the round,
compute and sync: CUDA torch.cuda.max_memory_allocated, CPU the peak resident set size;
real/sharding.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from formats.timeline import TRACE_COLUMNS

NUMERIC_COLUMNS = TRACE_COLUMNS[2:]  # what travels between nodes as a float64 tensor
INT_COLUMNS = ("round", "tokens", "overrun_steps", "local_steps", "batch_size", "bytes_sent", "peak_mem_bytes")


def trace_frame(rows: list[dict], node_order: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=TRACE_COLUMNS)
    order = {name: i for i, name in enumerate(node_order)}
    frame = frame.sort_values(["round", "node"], key=lambda col: col.map(order) if col.name == "node" else col)
    return frame.reset_index(drop=True)


def write_trace(rows: list[dict], node_order: list[str], path: str | Path) -> pd.DataFrame:
    """Write the trace whole or not at all (temp file, then os.replace)."""
    path = Path(path)
    frame = trace_frame(rows, node_order)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return frame


def summary(frame: pd.DataFrame) -> str:
    """Per node, totals over the rounds: compute, idle, sync, tokens, and the final loss."""
    lines = [f"{'node':<16} {'compute_s':>10} {'idle_s':>9} {'sync_s':>9} {'tokens':>12} {'final_loss':>10}"]
    for node, rows in frame.groupby("node", sort=False):
        lines.append(f"{str(node):<16} {rows['compute_s'].sum():>10.3f} {rows['idle_s'].sum():>9.3f} "
                     f"{rows['comm_s'].sum():>9.3f} {int(rows['tokens'].sum()):>12d} {rows['loss'].iloc[-1]:>10.4f}")
    return "\n".join(lines)
