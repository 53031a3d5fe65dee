"""Atomic output writing: every file appears whole or not at all (temp name, then os.replace)."""
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


def check_writable(out_dir: str | Path) -> Path:
    """The output directory, created if needed; an OSError becomes the caller's one-line error."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK):
        raise PermissionError(f"{out}: directory is not writable")
    return out
