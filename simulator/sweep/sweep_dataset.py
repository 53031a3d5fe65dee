"""A sweep's results as a Parquet dataset, written chunk by chunk; its findings read from it in one pass.

`geodt sweep --out DIR` writes DIR/sweep/part-NNNNN.parquet, one file per chunk of scenarios
(every strategy of those scenarios, sweep.csv's columns and rows in order), each the same bytes
for the same chunk on any run (`part_bytes`: no pandas or time metadata), and
DIR/sweep.sha256: one `digest  sweep/part-NNNNN.parquet` line per part, written last, so a
dataset cut short or altered is detected and redone. `pd.read_parquet(DIR / "sweep")` loads it
(small sweeps); `SweepStats.from_parts` reads it one part at a time, the few columns the
findings and figures need, keeping per scenario only its winners and per strategy the values
whose medians and quartiles are drawn: memory bounded by those columns, not the table.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.scenario import load_scenario
from simulator.sweep.sweep import KindTables, chunk_frame, node_kinds
from simulator.sweep.sweep_drift import parse_drift

NEEDED = ["scenario_id", "strategy", "bandwidth_gbps", "speed_ratio", "idle_left", "speedup", "tokens_per_s",
          "idle_s_equal_tokens"]
# Read where the dataset has it: a sweep's parts from before the column existed still load (no marks).
COMPARABLE = "comparable"
CRITERIA = (("tokens_per_s", "max"), ("idle_s_equal_tokens", "min"))
# With a target loss (geodt sweep --target-loss): the scenario's winner is also the earliest to it
TARGET_CRITERION = ("time_to_target_s", "min")


def part_bytes(frame: pd.DataFrame) -> bytes:
    """One chunk's rows as Parquet bytes, the same for the same frame on every run."""
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


_TABLES: dict = {}  # this process's node tables, for the spec they were built for


def kind_tables(spec):
    """The sweep's node tables (simulator/sweep/sweep.py KindTables), built once per process and spec."""
    if _TABLES.get("spec") != spec:
        _TABLES.clear()
        _TABLES.update(spec=spec, tables=KindTables(load_scenario(spec.base, spec.overrides), node_kinds(spec)))
    return _TABLES["tables"]


def sweep_drift(spec) -> tuple:
    """--drift's events (simulator/sweep/sweep_drift.py), parsed: () without drift."""
    if not spec.drift:
        return ()
    return parse_drift(spec.drift)


def chunk_bytes(spec, first: int, kinds, bw) -> bytes:
    """One chunk of scenarios (ids from first), every strategy, as its Parquet part: the unit of
    work on local processes and on a cluster alike (drift drawn from the spec's seed)."""
    return part_bytes(chunk_frame(kind_tables(spec), kinds, bw, spec.strategies, first, sweep_drift(spec), spec.seed))


def read_part(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    return pq.read_table(path, columns=columns).to_pandas()


def winners(frame: pd.DataFrame, column: str, best: str) -> pd.DataFrame:
    """One row per scenario: its winner by `column` (ties: the first strategy in the table's order)."""
    order = {s: i for i, s in enumerate(dict.fromkeys(frame["strategy"]))}
    ranked = frame.assign(_o=frame["strategy"].map(order))
    ranked = ranked.sort_values(["scenario_id", column, "_o"], ascending=[True, best == "min", True])
    return ranked.groupby("scenario_id", sort=True).head(1)


@dataclass
class SweepStats:
    """What the findings (simulator/sweep/sweep_summary.py) and figures (simulator/sweep/sweep_figures.py) use."""
    strategies: list[str] = field(default_factory=list)  # the table's order
    scenarios: int = 0
    scenarios_with_idle: int = 0  # scenarios with some strategy's idle_left known
    baseline_no_idle: int = 0  # baseline rows whose idle_left is unknown (no baseline idle)
    idle_left: dict = field(default_factory=dict)  # strategy -> values (NaN kept)
    speedup: dict = field(default_factory=dict)  # (strategy, bandwidth) -> values
    # (strategy, bandwidth) -> scenarios where it does other work (not `comparable`: simulator/sweep/sweep.py)
    other_work: dict = field(default_factory=dict)
    wins: dict = field(default_factory=dict)  # criterion column -> frame: strategy, bandwidth_gbps, speed_ratio

    @property
    def bandwidths(self) -> list[float]:
        return sorted({bw for _, bw in self.speedup})

    def other_work_mark(self, strategy: str, bw: float | None = None) -> str:
        """The mark `geodt simulate`'s table puts on other work: "*" where the strategy does other work in
        some of the scenarios (at bandwidth bw, or at any); "" otherwise, or where the dataset does not say."""
        bws = self.bandwidths if bw is None else [bw]
        return "*" if any(self.other_work.get((strategy, b), 0) for b in bws) else ""

    @classmethod
    def of_frame(cls, frame: pd.DataFrame) -> SweepStats:
        stats = cls()
        stats._add(frame)
        return stats._done()

    @classmethod
    def from_parts(cls, paths) -> SweepStats:
        stats = cls()
        for path in paths:
            names = pq.read_schema(path).names
            stats._add(read_part(path, NEEDED + [c for c in (TARGET_CRITERION[0], COMPARABLE) if c in names]))
        return stats._done()

    def _add(self, frame: pd.DataFrame) -> None:
        """A chunk of whole scenarios (every strategy's rows)."""
        for s in dict.fromkeys(frame["strategy"]):
            if s not in self.strategies:
                self.strategies.append(s)
        self.scenarios += int(frame["scenario_id"].nunique())
        self.scenarios_with_idle += int(frame.loc[frame["idle_left"].notna(), "scenario_id"].nunique())
        self.baseline_no_idle += int(frame.loc[frame["strategy"] == "baseline", "idle_left"].isna().sum())
        for s, rows in frame.groupby("strategy", sort=False):
            # copies: a column's array is a view of its frame's whole block, which it would keep alive
            self.idle_left.setdefault(s, []).append(np.array(rows["idle_left"], dtype=float))
            for bw, at in rows.groupby("bandwidth_gbps", sort=False):
                self.speedup.setdefault((s, bw), []).append(np.array(at["speedup"], dtype=float))
                if COMPARABLE in at:
                    other = int((~at[COMPARABLE].astype(bool)).sum())
                    self.other_work[(s, bw)] = self.other_work.get((s, bw), 0) + other
        criteria = CRITERIA + ((TARGET_CRITERION,) if TARGET_CRITERION[0] in frame else ())
        for column, best in criteria:  # per scenario three numbers, not a frame (10^6 of them)
            won = winners(frame, column, best)
            if column == TARGET_CRITERION[0]:  # a scenario no strategy brings to the target has no winner
                won = won[np.isfinite(won[column].to_numpy(dtype=float))]
            codes = pd.Categorical(won["strategy"], categories=self.strategies).codes.astype(np.int16)
            self.wins.setdefault(column, []).append((codes, np.array(won["bandwidth_gbps"], dtype=float),
                                                     np.array(won["speed_ratio"], dtype=float)))

    def _done(self) -> SweepStats:
        self.idle_left = {s: np.concatenate(v) for s, v in self.idle_left.items()}
        self.speedup = {k: np.concatenate(v) for k, v in self.speedup.items()}
        self.wins = {c: pd.DataFrame({"strategy": pd.Categorical.from_codes(np.concatenate([w[0] for w in v]),
                                                                           self.strategies),
                                      "bandwidth_gbps": np.concatenate([w[1] for w in v]),
                                      "speed_ratio": np.concatenate([w[2] for w in v])})
                     for c, v in self.wins.items()}
        return self


def stats_of(data) -> SweepStats:
    """SweepStats of a frame (sweep.csv loaded), or the stats themselves."""
    return data if isinstance(data, SweepStats) else SweepStats.of_frame(data)
