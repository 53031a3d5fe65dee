"""Atomic output writing: every file appears whole or not at all (temp name, then os.replace).

`write_output_set(out, files)` writes all the outputs of one command: every file goes first
into a temporary directory in or beside `out` (same file system), and only once all are written
(a full disk fails here, before anything is replaced) are they renamed into `out`. Targets
that are not regular files (a directory where plan.csv goes) are refused before anything is
written. Files that another geodt command writes (OWNED: plan.csv, timeline.csv, ...) and
this one does not are removed and named, so `out` never mixes two commands' outputs.
"""
from __future__ import annotations

import csv
import io
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from formats.owners import TEMP_SUFFIX, remove_orphan_temps, temp_prefix


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    write_bytes(path, csv_bytes(frame))


def agg_figure(**figure_kwargs):
    """A matplotlib Figure drawn by Agg, without pyplot: nothing registered to close, and pyplot's own
    import (its backend machinery, about 50 ms) left out of the commands that only write PNGs."""
    import matplotlib  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn
    from matplotlib.figure import Figure  # noqa: PLC0415  deferred: matplotlib (~0.5 s) only when a figure is drawn

    if "matplotlib.pyplot" not in sys.modules:  # else pyplot's backend is the user's: left alone
        matplotlib.use("Agg")  # resolved now: reading every rcParam (boxplot does) would import pyplot for it
    fig = Figure(**figure_kwargs)
    FigureCanvasAgg(fig)
    return fig


def laid_out_png(fig) -> bytes:
    """PNG bytes (figure_bytes) of a figure laid out once by tight_layout: savefig would otherwise
    draw it once more, with rendering off, for the placeholder layout engine tight_layout leaves
    behind (it lays out nothing; the same bytes without that draw)."""
    fig.tight_layout()
    fig.set_layout_engine(None)  # None, not "none": "none" keeps the placeholder and its extra draw
    return figure_bytes(fig)


def figure_bytes(fig, **savefig_kwargs) -> bytes:
    """A matplotlib figure as PNG bytes without the Software/date metadata, so reruns are identical."""
    buffer = io.BytesIO()
    savefig_kwargs.setdefault("metadata", {"Software": None})
    fig.savefig(buffer, format="png", **savefig_kwargs)
    return buffer.getvalue()


def save_figure(fig, path: str | Path, **savefig_kwargs) -> Path:
    write_bytes(path, figure_bytes(fig, **savefig_kwargs))
    return Path(path)


# What simulate, plan and sweep --table write: one of them found in --out but not written by
# the command now running is an earlier command's output, stale beside the new ones.
OWNED = ("plan.csv", "timeline.csv", "summary.csv", "syncs.csv", "scenario.toml", "table.csv", "table.md",
         "trace.json", "timeline.parquet", "syncs.parquet", "loss.png", "idle.png")


class OutputError(OSError):
    """The outputs could not be written; nothing was replaced. str() is the one-line reason."""


FLOAT_FORMAT = "%.9g"  # every CSV geodt writes: 9 significant digits, stable, loads straight into pandas


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """`frame.to_csv(index=False, float_format="%.9g")`, byte for byte, formatted column by column.

    pandas formats a frame value by value through a Python callback (1.1 s for a timeline of
    2·10^5 rows); here each column becomes one list of Python values and all rows are formatted
    by one `%` of a repeated row template (0.3 s). Columns of other kinds (dates, complex,
    mixed objects that are not text) and frames of one column (csv quotes a lone empty cell)
    go through pandas itself. tests/test_outputs.py checks both paths give the same bytes.
    """
    columns = [_csv_column(frame.iloc[:, j]) for j in range(frame.shape[1])]
    if frame.shape[1] < 2 or isinstance(frame.columns, pd.MultiIndex) or any(c is None for c in columns):
        return frame.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n").encode()
    header = ",".join(_csv_cell(str(name)) for name in frame.columns) + "\n"
    rows = len(frame)
    if not rows:
        return header.encode()
    cells = np.empty((rows, len(columns)), dtype=object)
    for j, (_, values) in enumerate(columns):
        cells[:, j] = values
    template = ",".join(spec for spec, _ in columns) + "\n"
    return (header + (template * rows) % tuple(cells.ravel().tolist())).encode()


def _csv_cell(text: str) -> str:
    """One cell as the csv module writes it (QUOTE_MINIMAL: quoted when it holds , " or a line break)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([text, ""])
    return buffer.getvalue()[:-2]


def _text_cells(values) -> list[str]:
    """Cells of text-like values as pandas writes them: missing -> empty, others str(), then quoted."""
    quoted: dict[str, str] = {}
    cells = []
    for value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
            cells.append("")
            continue
        text = value if isinstance(value, str) else str(value)
        if text not in quoted:
            quoted[text] = _csv_cell(text)
        cells.append(quoted[text])
    return cells


def _csv_column(series: pd.Series) -> tuple[str, list] | None:
    """(format spec, one Python value per row) for the row template, or None: leave it to pandas."""
    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        if dtype.categories.dtype.kind in "Mmc":
            return None
        cells = np.array(_text_cells(list(dtype.categories)) + [""], dtype=object)
        return "%s", cells[series.cat.codes.to_numpy()].tolist()  # code -1 (missing) takes the last: ""
    if dtype.kind == "f" and not isinstance(dtype, pd.api.extensions.ExtensionDtype):
        values = series.to_numpy().tolist()
        if not series.isna().any():
            return FLOAT_FORMAT, values
        return "%s", ["" if v != v else FLOAT_FORMAT % v for v in values]
    if dtype.kind in "iu" and not isinstance(dtype, pd.api.extensions.ExtensionDtype):
        return "%d", series.to_numpy().tolist()
    if dtype.kind == "b" and not isinstance(dtype, pd.api.extensions.ExtensionDtype):
        return "%s", series.to_numpy().astype(str).tolist()
    if dtype.kind == "O" or isinstance(dtype, pd.StringDtype):
        values = series.to_numpy(dtype=object)
        if not all(isinstance(v, str) or v is None or v is pd.NA or (isinstance(v, float) and v != v)
                   for v in values):
            return None
        return "%s", _text_cells(values)
    return None


def write_output_set(out: str | Path, files: dict[str, bytes], owned: tuple[str, ...] = OWNED) -> list[str]:
    """Write {name: bytes} into `out` as a set (module docstring); returns stale names removed."""
    with StagedOutput(out, list(files), owned) as stage:
        for name, data in files.items():
            with stage.open(name) as handle:
                handle.write(data)
        return stage.commit()


class StagedOutput:
    """An output set written file by file into a stage (a temporary directory in or beside `out`),
    renamed into `out` only by commit(): files too large to hold whole (the timeline of a long
    simulation) are written there as they are produced. Leaving the `with` block without commit()
    (an error, Ctrl-C) removes the stage: `out` is as it was."""

    def __init__(self, out: str | Path, names: list[str], owned: tuple[str, ...] = OWNED):
        self.out, self.names, self.owned = Path(out), list(names), owned
        out = self.out
        for name in names:
            target = out / name
            if os.path.lexists(target) and not (target.is_file() and not target.is_symlink()):
                raise OutputError(f"{target}: exists and is not a regular file; expected a file path for {name}")
        if os.path.lexists(out) and not out.is_dir():
            raise OutputError(f"{out}: exists and is not a directory; expected an output directory")
        # Staged inside out if it exists (its parent may not be writable: --out .), else beside it;
        # there, the stages of writers that were killed (SIGKILL leaves them) go first.
        where = out if out.is_dir() else out.absolute().parent
        remove_orphan_temps(where, only=None if where == out else out.absolute().name)
        try:
            where.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=temp_prefix(out.absolute().name), suffix=TEMP_SUFFIX, dir=where))
        except OSError as exc:
            raise OutputError(f"{out}: cannot write there ({exc.strerror or exc}); "
                              "expected a writable directory") from None

    def __enter__(self) -> StagedOutput:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def file(self, name: str) -> Path:
        """The staged path of output `name` (one of the names given), its folder made."""
        if name not in self.names:
            raise ValueError(f"{name}: not one of this output set's files")
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def open(self, name: str):
        try:
            return open(self.file(name), "wb")
        except OSError as exc:
            raise OutputError(f"{self.out}: cannot write the outputs ({exc.strerror or exc}); "
                              "nothing was replaced") from None

    def commit(self) -> list[str]:
        """Rename every staged file into `out`; remove other commands' files there (OWNED); the
        stale names removed."""
        out = self.out
        missing = [n for n in self.names if not (self.path / n).is_file()]
        if missing:
            raise OutputError(f"{out}: {', '.join(missing)} not written; nothing was replaced")
        try:
            mode = 0o666 & ~_umask()
            for name in self.names:
                os.chmod(self.path / name, mode)
            out.mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{out}: cannot create the output directory ({exc.strerror or exc})") from None
        previous = [n for n in self.owned if n not in self.names and os.path.lexists(out / n)]
        for name in self.names:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path / name, out / name)
        stale = [n for n in previous if (out / n).is_file() and not (out / n).is_symlink()]
        for name in stale:
            (out / name).unlink()
        return stale


def check_writable(out_dir: str | Path) -> Path:
    """The output directory, created if needed; an OSError becomes the caller's one-line error."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise PermissionError(f"{out}: directory is not writable")
    return out
