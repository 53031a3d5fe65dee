"""Convergence profiles on disk: the columns `geodt calibrate convergence` writes and the checked reader.

One row per run, node and round of a short real training run (docs/DESIGN.md, "Convergence
profile"): what the node trained on in that round and its mean inner-step loss, beside what
the run was (strategy, averaging, payload, fragments, the model and corpus). The simulator
fits its loss model from it (simulator/models/convergence.py). A run without a barrier (async) adds the
node-round's `staleness` (trace.csv's: global updates the server applied between the node's pull
and its push); a profile written before that column existed reads with 0 there (every run of it
had a barrier). Torch-free.
"""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from formats.files import read_regular_file, short

# run-level columns (the same on every row of a run), then the node-round's own
RUN_COLUMNS: tuple[str, ...] = (
    "run", "strategy", "model", "params", "seq_len", "corpus", "seed", "nodes", "rounds", "base_local_steps",
    "base_batch_size", "averaging", "payload_dtype", "fragments", "sync_delay_steps", "fragment_alpha",
    "inner_lr", "host", "torch_version", "measured_at",
)
ROW_COLUMNS: tuple[str, ...] = ("node", "round", "gpus", "batch_size", "local_steps", "tokens", "loss", "round_end_s",
                                 "staleness")
COLUMNS: tuple[str, ...] = RUN_COLUMNS + ROW_COLUMNS
# columns a profile may lack (written before they existed) and the value their rows had: last in COLUMNS,
# so an old profile's rows are its old text with the default after them
OPTIONAL: dict[str, float] = {"staleness": 0}
NUMERIC: tuple[str, ...] = ("params", "seq_len", "seed", "nodes", "rounds", "base_local_steps", "base_batch_size",
                            "fragments", "sync_delay_steps", "fragment_alpha", "inner_lr", "round", "gpus",
                            "batch_size", "local_steps", "tokens", "loss", "round_end_s", "staleness")
MAX_PROFILE_BYTES = 64 << 20


class ConvergenceProfileError(ValueError):
    """A convergence profile that cannot be used: '<path>: <column or row>: expected ...'."""


def read_convergence_profile(path: str | Path) -> pd.DataFrame:
    """The profile as a frame (numeric columns as numbers), checked; ConvergenceProfileError otherwise."""
    path = Path(path)
    data = read_regular_file(path, "a convergence profile CSV", MAX_PROFILE_BYTES, ConvergenceProfileError)
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype={c: str for c in COLUMNS if c not in NUMERIC},
                            keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise ConvergenceProfileError(f"{short(path)}: unreadable ({type(exc).__name__}); expected a convergence "
                                      "profile CSV (geodt calibrate convergence)") from None
    for column, default in OPTIONAL.items():
        if column not in frame.columns:
            frame[column] = default
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ConvergenceProfileError(f"{short(path)}: no column {missing[0]!r}; expected the columns of "
                                      "formats/convergence.py (geodt calibrate convergence writes them)")
    for column in NUMERIC:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() | ~values.abs().lt(float("inf"))
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0]) + 1
            shown = short(repr(frame[column].iloc[row - 1]))  # a 128 KiB cell is not echoed whole
            raise ConvergenceProfileError(f"{short(path)}: row {row}: {column} = {shown}; expected a finite number")
        frame[column] = values
    if frame.empty:
        raise ConvergenceProfileError(f"{short(path)}: no rows; expected a run's node-rounds")
    if "baseline" not in set(frame["strategy"]):
        raise ConvergenceProfileError(f"{short(path)}: no baseline run; expected one (its loss curve is the "
                                      "reference every other run is measured against)")
    one = frame.groupby("run")[list(RUN_COLUMNS[1:17])].nunique().max()
    if (one > 1).any():
        raise ConvergenceProfileError(f"{short(path)}: run-level column {one[one > 1].index[0]!r} differs within "
                                      "a run; expected one value per run")
    if frame[["model", "seq_len", "corpus"]].drop_duplicates().shape[0] > 1:
        raise ConvergenceProfileError(f"{short(path)}: runs of several models, sequence lengths or corpora; "
                                      "expected one (one profile per model and corpus)")
    check_learning(frame, short(path))
    return frame


def check_learning(frame: pd.DataFrame, shown: str) -> None:
    """What a profile claims of its runs: tokens >= 0 and some in every run (all zero gave "SVD did
    not converge"), params and seq_len positive, and its reference run's loss falling with tokens
    (a rising one was fitted and predicted loss 1.0); ConvergenceProfileError naming the field."""
    for column in ("tokens", "staleness"):
        bad = frame[column] < 0
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0]) + 1
            raise ConvergenceProfileError(f"{shown}: row {row}: {column} = {frame[column].iloc[row - 1]:g}; "
                                          "expected a number >= 0")
    for column in ("params", "seq_len"):
        if not (frame[column] > 0).all():
            raise ConvergenceProfileError(f"{shown}: {column} = {frame[column].min():g}; expected a positive "
                                          "number (the model the profile was measured on)")
    idle = frame.groupby("run", sort=False)["tokens"].sum()
    if (idle <= 0).any():
        raise ConvergenceProfileError(f"{shown}: run {short(str(idle[idle <= 0].index[0]))}: tokens: 0 on every "
                                      "row; expected the tokens each node-round trained on")
    named = frame[frame["run"] == "baseline"]
    base = named if len(named) else frame[frame["strategy"] == "baseline"]
    base = base[base["run"] == base["run"].iloc[0]]
    trained = base[base["tokens"] > 0].groupby("round")["loss"].mean().sort_index()
    if len(trained) >= 2 and not trained.iloc[-1] < trained.iloc[0]:
        raise ConvergenceProfileError(
            f"{shown}: run {short(str(base['run'].iloc[0]))}: loss: {trained.iloc[0]:.4g} at round "
            f"{int(trained.index[0])}, {trained.iloc[-1]:.4g} at round {int(trained.index[-1])}; expected a loss "
            "that falls with tokens (a learning run)")
