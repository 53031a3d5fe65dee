"""A plan: per node, the batch size b_i (per GPU) and local steps H_i of one round."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

PLAN_COLUMNS = ["strategy", "node", "gpus", "batch_size", "local_steps", "step_s",
                "tokens_per_round", "comm_s"]


@dataclass(frozen=True)
class NodePlan:
    node: str
    gpus: int
    batch_size: int
    local_steps: int
    step_s: float  # t_i(b_i): one inner step at this node's batch

    def tokens_per_round(self, seq_len: int) -> int:
        return self.local_steps * self.batch_size * self.gpus * seq_len

    @property
    def compute_s(self) -> float:
        return self.local_steps * self.step_s


@dataclass(frozen=True)
class Plan:
    strategy: str
    nodes: tuple[NodePlan, ...]
    comm_s: float  # one outer sync
    seq_len: int
    note: str = ""  # what the strategy decided and why, for the printed report
    # Optional overrides of the scenario (None = the scenario's own), for strategies that
    # change how often or how the nodes sync: sync-ddp syncs every step (rounds = R × H of
    # one step each), network-aware picks the collective and the payload dtype.
    rounds: int | None = None
    collective: str | None = None
    payload_dtype: str | None = None

    def to_frame(self) -> pd.DataFrame:
        rows = [(self.strategy, n.node, n.gpus, n.batch_size, n.local_steps, n.step_s,
                 n.tokens_per_round(self.seq_len), self.comm_s) for n in self.nodes]
        return pd.DataFrame(rows, columns=PLAN_COLUMNS)

    @property
    def tokens_per_round(self) -> int:
        return sum(n.tokens_per_round(self.seq_len) for n in self.nodes)

    @property
    def round_s(self) -> float:
        """Deterministic round time: the slowest node's compute plus the sync."""
        return max(n.compute_s for n in self.nodes) + self.comm_s
