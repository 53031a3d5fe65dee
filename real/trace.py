"""trace.csv: docs/DESIGN.md's timeline columns plus loss and tokens, one row per node and round.

Extra columns: `overrun_steps` (under --emulate, inner steps whose real compute took longer
than the emulated step time, so the step could not be padded to it), `ckpt_s` (the
checkpoint written after the sync, outside the round), `local_steps`, `batch_size` (per
device) and `bytes_sent` (bytes this node put on the wire in that sync; real/sync.py).

Each node's leader makes its rows (`trace_row`); at the end `gather_rows` brings them to
rank 0 as float64 tensors (nothing travels as pickles), which writes trace.csv (and, under
Streaming DiLoCo, fragments.csv: real/streaming.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from formats.plan import NodePlan, Plan
from formats.timeline import TRACE_COLUMNS

NUMERIC_COLUMNS = TRACE_COLUMNS[2:]  # what travels between nodes as a float64 tensor
INT_COLUMNS = ("round", "tokens", "overrun_steps", "local_steps", "batch_size", "bytes_sent")


def trace_row(strategy: str, node: NodePlan, r: int, *, compute_s: float, idle_s: float, comm_s: float,
              start_s: float, end_s: float, loss: float, tokens: int, overruns: int, bytes_sent: int) -> dict:
    """One node's row of round r (ckpt_s is filled in once the checkpoint is written)."""
    return {
        "strategy": strategy, "node": node.node, "round": r,
        "compute_s": compute_s, "idle_s": idle_s, "comm_s": comm_s, "round_start_s": start_s, "round_end_s": end_s,
        "loss": loss, "tokens": tokens, "overrun_steps": overruns, "ckpt_s": 0.0,
        "local_steps": node.local_steps, "batch_size": node.batch_size, "bytes_sent": bytes_sent,
    }


def gather_rows(groups, plan: Plan, rows: list[dict], numeric: list[str], ints) -> list[dict] | None:
    """Every leader's rows, on rank 0 (None elsewhere): the `numeric` columns as float64 tensors
    over the leaders' group (padded to the longest node's count), the `ints` among them made
    integers again, strategy and node added."""
    if not groups.is_leader:
        return None
    tables = _gather_tables(groups, len(plan.nodes), rows, numeric)
    if groups.rank != 0:
        return None
    gathered = []
    for node, table in zip(plan.nodes, tables):
        for values in table:
            row = {"strategy": plan.strategy, "node": node.node, **dict(zip(numeric, values))}
            for c in ints:
                row[c] = int(row[c])
            gathered.append(row)
    return gathered


def _gather_tables(groups, n: int, rows: list[dict], columns: list[str]) -> list[list[list[float]]]:
    """Leaders only: every leader's rows (the numeric columns, as float64) in plan order."""
    import torch
    import torch.distributed as dist

    from real.options import run_collective

    device = groups.device
    mine = torch.tensor([[float(row[c]) for c in columns] for row in rows],
                        dtype=torch.float64, device=device).reshape(-1, len(columns))
    if n == 1:
        return [mine.cpu().tolist()]
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    run_collective(dist.all_gather, counts, torch.tensor([mine.shape[0]], device=device), group=groups.leaders)
    longest = max(int(c) for c in counts)
    padded = torch.zeros(longest, len(columns), dtype=torch.float64, device=device)
    padded[:mine.shape[0]] = mine
    tables = [torch.empty_like(padded) for _ in range(n)]
    run_collective(dist.all_gather, tables, padded, group=groups.leaders)
    return [t[:int(c)].cpu().tolist() for t, c in zip(tables, counts)]


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
