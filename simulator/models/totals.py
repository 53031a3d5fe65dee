"""RunTotals: what a simulation's summary and metrics need, accumulated over its timeline in chunks.

`geodt simulate` writes the timeline as the engine produces it (simulator/outputs/run_outputs.py) and
keeps only these totals: per node compute, idle, comm and tokens (summary.csv), the column sums
and the tokens of every row (the tokens the rounds trained on: an adaptive plan's vary), the
rounds and the wall time (simulator/outputs/sweep_table.py timeline_metrics, the answer's table). Built
from one whole timeline (`RunTotals.of`), the numbers are the ones a whole-frame groupby and sum
give, bit for bit; chunk by chunk, the chunks' sums added in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

PARTS = ["compute_s", "idle_s", "comm_s"]


@dataclass
class RunTotals:
    nodes: list[str] = field(default_factory=list)  # in the plan's order
    per_node: np.ndarray | None = None  # (nodes, 3): compute_s, idle_s, comm_s summed over rounds
    sums: np.ndarray = field(default_factory=lambda: np.zeros(3))  # the same, summed over every row
    node_tokens: np.ndarray | None = None  # (nodes,) int64: tokens summed over rounds; None without a tokens column
    tokens: int = 0  # every row's tokens
    rounds: int = 0
    wall_s: float = 0.0
    staleness: list = field(default_factory=list)  # per chunk, its merges' staleness (plans without a barrier)

    @classmethod
    def of(cls, timeline: pd.DataFrame) -> RunTotals:
        totals = cls()
        totals.add(timeline)
        return totals

    def add(self, timeline: pd.DataFrame) -> None:
        """Add a chunk of whole rounds (timeline columns; rounds after those added before)."""
        by_node = timeline.groupby("node", sort=False, observed=True)[PARTS].sum()
        if self.per_node is None:
            self.nodes = [str(n) for n in by_node.index]
            self.per_node = by_node.to_numpy(dtype=float)
        else:
            self.per_node = self.per_node + by_node.to_numpy(dtype=float)
        if "tokens" in timeline:
            by_node_tokens = timeline.groupby("node", sort=False, observed=True)["tokens"].sum().to_numpy(np.int64)
            self.node_tokens = by_node_tokens if self.node_tokens is None else self.node_tokens + by_node_tokens
            self.tokens += int(timeline["tokens"].sum())
        self.sums = self.sums + np.array([float(timeline[c].sum()) for c in PARTS])
        self.rounds += int(timeline["round"].nunique())
        if "staleness" in timeline:
            self.staleness.append(timeline["staleness"].to_numpy(float))
        self.wall_s = max(self.wall_s, float(timeline["round_end_s"].max()))

    def staleness_stats(self) -> tuple[float, float]:
        """(mean, 90th percentile, linear) of the merges' staleness in global updates; (0, 0) with a barrier."""
        if not self.staleness:
            return 0.0, 0.0
        values = np.concatenate(self.staleness)
        return float(values.mean()), float(np.percentile(values, 90))

    def node_frame(self) -> pd.DataFrame:
        """Per node (plan order): node, compute_s, idle_s, comm_s."""
        frame = pd.DataFrame(self.per_node, columns=PARTS)
        frame.insert(0, "node", self.nodes)
        return frame
