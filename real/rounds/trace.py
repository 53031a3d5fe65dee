"""trace.csv: docs/DESIGN.md's timeline columns plus loss and tokens, one row per node and round.

Extra columns: `overrun_steps` (under --emulate, inner steps whose real compute took longer
than the emulated step time, so the step could not be padded to it), `ckpt_block_s` (the
part of the checkpoint after the sync that blocked training: the snapshot to host memory, and
the wait for the previous write when it had not finished; 0 in rounds without a checkpoint),
`ckpt_background_s` (the write itself, in a background thread while the next rounds trained;
real/checkpoint/checkpoint.py), `local_steps`, `batch_size` (per
device), `bytes_sent` (bytes this node put on the wire in that sync; real/core/sync.py) and
`peak_mem_bytes` (the largest peak memory of the node's device processes during the round,
compute and sync: CUDA torch.cuda.max_memory_allocated, CPU the peak resident set size;
real/core/sharding.py). Then the run's own columns, the same on every row (formats/timeline.py
RUN_COLUMNS): `mode` (`measured`, or `emulated` under --emulate) and `time_scale` (--time-scale
under --emulate, else 1), so that `geodt validate --trace` labels and scales the run as it ran.

Each node's leader makes its rows (`trace_row`); at the end `gather_tables` brings every
leader's rows to rank 0 as float64 tensors (nothing travels as pickles), which writes
trace.csv (and, under Streaming DiLoCo, syncs.csv: real/core/streaming.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from formats.plan import NodePlan, Plan
from formats.timeline import MODES, RUN_COLUMNS, TRACE_COLUMNS
from real.core.options import run_collective

NUMERIC_COLUMNS = TRACE_COLUMNS[2:]  # what travels between nodes as a float64 tensor
INT_COLUMNS = ("round", "tokens", "overrun_steps", "local_steps", "batch_size", "bytes_sent", "peak_mem_bytes")


def trace_row(strategy: str, node: NodePlan, r: int, *, compute_s: float, idle_s: float, comm_s: float,
              start_s: float, end_s: float, loss: float, tokens: int, overruns: int, bytes_sent: int,
              peak_mem_bytes: int) -> dict:
    """One node's row of round r (the ckpt_ columns are filled in by real/checkpoint/checkpoint.py)."""
    return {
        "strategy": strategy, "node": node.node, "round": r,
        "compute_s": compute_s, "idle_s": idle_s, "comm_s": comm_s, "round_start_s": start_s, "round_end_s": end_s,
        "loss": loss, "tokens": tokens, "overrun_steps": overruns, "ckpt_block_s": 0.0, "ckpt_background_s": 0.0,
        "local_steps": node.local_steps, "batch_size": node.batch_size, "bytes_sent": bytes_sent,
        "peak_mem_bytes": peak_mem_bytes,
    }


def gather_tables(groups, n: int, rows: list[dict], columns: list[str]) -> list[list[list[float]]] | None:
    """Every leader's rows (the numeric `columns`, as float64; padded over the leaders' group to
    the longest node's count), in plan order, on rank 0; None on every other process."""
    if not groups.is_leader:
        return None
    tables = _gather_tables(groups, n, rows, columns)
    return tables if groups.rank == 0 else None


def trace_rows(plan: Plan, tables: list[list[list[float]]], extra: list[str] = ()) -> list[dict]:
    """trace.csv's rows from the gathered tables (NUMERIC_COLUMNS then the `extra` columns' values,
    plan order; extra: an async run's staleness, real/rounds/round_async.py)."""
    columns = [*NUMERIC_COLUMNS, *extra]
    rows = []
    for node, table in zip(plan.nodes, tables):
        for values in table:
            row = {"strategy": plan.strategy, "node": node.node, **dict(zip(columns, values))}
            for c in (*INT_COLUMNS, *extra):
                row[c] = int(row[c])
            rows.append(row)
    return rows


def _gather_tables(groups, n: int, rows: list[dict], columns: list[str]) -> list[list[list[float]]]:
    """Leaders only: every leader's rows (the numeric columns, as float64) in plan order."""
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


def run_columns(opts) -> dict:
    """The run's own columns (RUN_COLUMNS) from its options: whether its steps were padded, and by what scale."""
    return {"mode": MODES[bool(opts.emulate)], "time_scale": float(opts.time_scale) if opts.emulate else 1.0}


def trace_frame(rows: list[dict], node_order: list[str], run: dict, extra: list[str] = ()) -> pd.DataFrame:
    """run: run_columns(opts), written on every row after TRACE_COLUMNS, before `extra`."""
    frame = pd.DataFrame(rows, columns=TRACE_COLUMNS + list(extra))
    for k, column in enumerate(RUN_COLUMNS):
        frame.insert(len(TRACE_COLUMNS) + k, column, run[column])
    order = {name: i for i, name in enumerate(node_order)}
    frame = frame.sort_values(["round", "node"], key=lambda col: col.map(order) if col.name == "node" else col)
    return frame.reset_index(drop=True)


def write_trace(rows: list[dict], node_order: list[str], path: str | Path, run: dict,
                extra: list[str] = ()) -> pd.DataFrame:
    """Write the trace whole or not at all (temp file, then os.replace); run: run_columns(opts);
    `extra`: columns after those (--on-node-loss continue's `members`, real/membership/members.py)."""
    path = Path(path)
    frame = trace_frame(rows, node_order, run, extra)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return frame


def summary(frame: pd.DataFrame) -> str:
    """Per node, totals over the rounds: compute, idle, sync, tokens, and the final loss."""
    lines = [f"{'node':<16} {'compute_s':>10} {'idle_s':>9} {'sync_s':>9} {'tokens':>12} {'final_loss':>10}"]
    for node, rows in frame.groupby("node", sort=False):
        lines.append(f"{node!s:<16} {rows['compute_s'].sum():>10.3f} {rows['idle_s'].sum():>9.3f} "
                     f"{rows['comm_s'].sum():>9.3f} {int(rows['tokens'].sum()):>12d} {rows['loss'].iloc[-1]:>10.4f}")
    return "\n".join(lines)


def _spans(rounds: list[int]) -> str:
    """[3, 4, 5, 8] -> "3-5, 8"."""
    spans, start = [], None
    for i, r in enumerate(rounds):
        if start is None:
            start = r
        if i + 1 == len(rounds) or rounds[i + 1] != r + 1:
            spans.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ", ".join(spans)


def membership_lines(frame: pd.DataFrame, node_order: list[str]) -> list[str]:
    """--on-node-loss continue: per node that missed rounds, when it left and rejoined (from the
    trace's rows: a node's round is absent when it took no part in that round's average)."""
    last = int(frame["round"].max())
    lines = []
    for node in node_order:
        rows = frame[frame["node"] == node].set_index("round")
        missing = [r for r in range(last + 1) if r not in rows.index]
        if not missing:
            continue
        left = missing[0] - 1
        said = (f"left after round {left} (its last sync ended at {rows.loc[left, 'round_end_s']:.2f} s)"
                if left in rows.index else "took part in no round before")
        back = [r for r in rows.index if r > missing[0]]
        came = (f"rejoined at round {back[0]} (started at {rows.loc[back[0], 'round_start_s']:.2f} s)" if back
                else "did not rejoin")
        lines.append(f"node {node}: absent from rounds {_spans(missing)}: {said}, {came}")
    return lines
