"""Atomic output writing: every file appears whole or not at all (temp name, then os.replace).

`write_output_set(out, files)` writes all the outputs of one command: every file goes first
into a temporary directory in or beside `out` (same file system), and only once all are written
(a full disk fails here, before anything is replaced) are they renamed into `out`. Targets
that are not regular files (a directory where plan.csv goes) are refused before anything is
written. Files that another geodt command writes (OWNED: plan.csv, timeline.csv, ...) and
this one does not are removed and named, so `out` never mixes two commands' outputs.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import pandas as pd


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
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
    write_text(path, frame.to_csv(index=False, float_format="%.9g"))


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
         "trace.json")


class OutputError(OSError):
    """The outputs could not be written; nothing was replaced. str() is the one-line reason."""


def csv_bytes(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False, float_format="%.9g").encode()


def write_output_set(out: str | Path, files: dict[str, bytes], owned: tuple[str, ...] = OWNED) -> list[str]:
    """Write {name: bytes} into `out` as a set (module docstring); returns stale names removed."""
    import shutil

    out = Path(out)
    for name in files:
        target = out / name
        if os.path.lexists(target) and not (target.is_file() and not target.is_symlink()):
            raise OutputError(f"{target}: exists and is not a regular file; expected a file path for {name}")
    if os.path.lexists(out) and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a directory; expected an output directory")
    # Staged inside out if it exists (its parent may not be writable: --out .), else beside it.
    where = out if out.is_dir() else out.absolute().parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.absolute().name}.", suffix=".tmp", dir=where))
    except OSError as exc:
        raise OutputError(f"{out}: cannot write there ({exc.strerror or exc}); expected a writable directory") from None
    try:
        try:
            mode = 0o666 & ~_umask()
            for name, data in files.items():
                path = stage / name
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as handle:
                    handle.write(data)
                os.chmod(path, mode)
        except OSError as exc:
            raise OutputError(f"{out}: cannot write the outputs ({exc.strerror or exc}); nothing was replaced") from None
        try:
            out.mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{out}: cannot create the output directory ({exc.strerror or exc})") from None
        previous = [n for n in owned if n not in files and os.path.lexists(out / n)]
        for name in files:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, out / name)
        stale = [n for n in previous if (out / n).is_file() and not (out / n).is_symlink()]
        for name in stale:
            (out / name).unlink()
        return stale
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def check_writable(out_dir: str | Path) -> Path:
    """The output directory, created if needed; an OSError becomes the caller's one-line error."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise PermissionError(f"{out}: directory is not writable")
    return out
