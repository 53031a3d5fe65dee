"""`geodt simulate`'s outputs written while the engines run: timeline, syncs, summary and trace.json.

The engines hand their records on in chunks of whole rounds (simulator/engines/engine.py
simulate_chunks; CHUNK_NODE_ROUNDS node-rounds a chunk); each chunk is written at once and
dropped, so memory grows with the nodes, not the node-rounds. Per strategy a PlanSink keeps
only the totals (simulator/models/totals.py: summary.csv and the answer) and the first rounds that
trace.json draws.

Tables go into Parquet (pyarrow; default: timeline.parquet, syncs.parquet) or CSV (`--csv`:
timeline.csv, syncs.csv, the bytes the whole-frame writer gives): one file over every strategy,
the same columns (docs/DESIGN.md, "Outputs"). A strategy of more than TIMELINE_FULL_MAX_ROWS
node-rounds is aggregated unless --full-timeline: its timeline holds one row per node and block
of `rounds` consecutive rounds (compute_s, idle_s, comm_s, tokens summed, round_start_s the block's
first start, round_end_s its last end, round the block's first), and syncs only its first whole
rounds within TIMELINE_FULL_MAX_ROWS rows. Then the timeline has one more column, `rounds`.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.models.loss_prediction import plan_rounds
from simulator.models.totals import RunTotals
from simulator.outputs.outputs import csv_bytes

# Above this many rows (node-rounds) a strategy's timeline is aggregated by default: about 40 MB
# of Parquet or 90 MB of CSV, what pandas loads in a second or two.
TIMELINE_FULL_MAX_ROWS = 1_000_000
# Rows the engines hand on at a time: ~20 MB of frames (timeline and syncs), small next to the
# run and large enough that per-chunk costs vanish (1024 nodes: 256 rounds a chunk).
CHUNK_NODE_ROUNDS = 262_144


class TableWriter:
    """One output table (timeline or syncs of every strategy) written frame by frame.

    Parquet: each frame is converted here and encoded and written by one thread of the writer's own, in
    order, while the caller goes on (pyarrow encodes without the GIL: the engine's next chunk, the loss
    model and the figures run meanwhile on another core); a write's error is raised by the next write
    or by close()."""

    def __init__(self, handle, fmt: str, columns: list[str]):
        self.handle, self.fmt, self.columns = handle, fmt, columns
        self.parquet = None
        self.header = True
        self._writing = None  # the pending write's future (Parquet)
        self._thread = None  # its one thread: writes stay in order

    def write(self, frame: pd.DataFrame) -> None:
        frame = frame[self.columns]
        if self.fmt == "csv":
            data = csv_bytes(frame)
            self.handle.write(data if self.header else data[data.index(b"\n") + 1:])
            self.header = False
            return

        table = pa.Table.from_pandas(frame, preserve_index=False)
        schema = pa.schema([pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type)
                            for f in table.schema])
        table = table.cast(schema).replace_schema_metadata(None)  # no pandas metadata: reads the same anywhere
        if self.parquet is None:
            self.parquet = pq.ParquetWriter(self.handle, schema)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geodt-parquet")
        self._wait()
        self._writing = self._thread.submit(self.parquet.write_table, table)

    def _wait(self) -> None:
        """The pending write finished (its error raised here)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def abandon(self) -> None:
        """After a failed write (a full disk): drop the Parquet writer unfinished, the stage being
        removed, so that its finaliser does not write again and print a second error."""
        try:
            self._wait()  # a write still running ends before its file goes
        except Exception:  # the error that brought us here is the one reported
            pass
        if self._thread is not None:
            self._thread.shutdown()
        if self.parquet is not None:
            self.parquet.is_open = False
            self.parquet = None

    def close(self) -> None:
        if self.parquet is not None:
            try:
                self._wait()
            finally:
                self._thread.shutdown()
            self.parquet.close()
        elif self.header and self.fmt == "csv":
            self.handle.write(csv_bytes(pd.DataFrame(columns=self.columns)))


def block_rounds(rounds: int, nodes: int, full: bool) -> int:
    """Rounds per timeline row: 1 when full or within TIMELINE_FULL_MAX_ROWS, else the fewest
    that bring the strategy's rows within it."""
    if full or rounds * nodes <= TIMELINE_FULL_MAX_ROWS:
        return 1
    return math.ceil(rounds / max(1, TIMELINE_FULL_MAX_ROWS // nodes))


def chunk_rounds(nodes: int, block: int) -> int:
    """Rounds per chunk: about CHUNK_NODE_ROUNDS node-rounds, a multiple of the block."""
    return block * max(1, CHUNK_NODE_ROUNDS // (nodes * block))


def aggregate(timeline: pd.DataFrame, block: int, nodes: int) -> pd.DataFrame:
    """A chunk of whole rounds (its first a multiple of block) as one row per node and block."""
    rows = len(timeline) // nodes
    starts = np.arange(0, rows, block)
    last = np.minimum(starts + block, rows) - 1
    grid = lambda c: timeline[c].to_numpy().reshape(rows, nodes)
    out = {c: np.add.reduceat(grid(c), starts, axis=0).ravel() for c in ("compute_s", "idle_s", "comm_s", "tokens")}
    out["round_start_s"] = grid("round_start_s")[starts].ravel()
    out["round_end_s"] = grid("round_end_s")[last].ravel()
    keys = timeline.iloc[np.repeat(starts * nodes, nodes) + np.tile(np.arange(nodes), len(starts))]
    frame = keys[["strategy", "node", "round"]].reset_index(drop=True).assign(**out)
    frame["rounds"] = np.repeat(last - starts + 1, nodes)
    return frame


class PlanSink:
    """One strategy's chunks: written to the tables, totalled, the first rounds kept for the trace."""

    def __init__(self, plan, rounds: int, timeline: TableWriter, syncs: TableWriter, block: int,
                 trace_rounds: int | None):
        self.plan, self.rounds, self.block = plan, rounds, block
        self.n = len(plan.nodes)
        self.timeline, self.syncs = timeline, syncs
        self.totals = RunTotals()
        self.sync_rounds = rounds if block == 1 else max(1, TIMELINE_FULL_MAX_ROWS // (self.n * plan.fragments))
        self.trace_rounds = rounds if trace_rounds is None else trace_rounds
        self.heads: list[tuple[pd.DataFrame, pd.DataFrame]] = []
        # per round: what the loss model reads (simulator/models/convergence.py)
        self.round_parts: list[pd.DataFrame] = []

    def add(self, timeline: pd.DataFrame, syncs: pd.DataFrame) -> None:
        self.totals.add(timeline)
        self.round_parts.append(plan_rounds(self.plan, timeline))
        first = int(timeline["round"].iat[0])
        if "rounds" in self.timeline.columns:
            self.timeline.write(aggregate(timeline, self.block, self.n))
        else:
            self.timeline.write(timeline)
        if first < self.sync_rounds:
            self.syncs.write(syncs if first + len(timeline) // self.n <= self.sync_rounds
                             else syncs[syncs["round"].to_numpy() < self.sync_rounds])
        if first < self.trace_rounds:
            keep = lambda f: f if first + len(timeline) // self.n <= self.trace_rounds else \
                f[f["round"].to_numpy() < self.trace_rounds]
            self.heads.append((keep(timeline), keep(syncs)))
