"""Reading input files safely: regular files only, of a bounded size (torch-free).

A FIFO given as a profile or config.json would block the read forever, /dev/zero would fill
memory; both are refused from `os.stat` before the file is opened.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def short(path) -> str:
    """A path for a one-line message: long paths keep their start and end."""
    text = str(path)
    return text if len(text) <= 120 else text[:60] + "..." + text[-40:]


def read_regular_file(path: str | Path, what: str, max_bytes: int, error: type[Exception],
                      missing: str = "file") -> bytes:
    """The bytes of `path`, which must be a regular file of at most max_bytes; else error(one line)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{short(path)}: {missing} not found; expected {what}") from None
    except (OSError, ValueError) as exc:
        raise error(f"{short(path)}: cannot read ({getattr(exc, 'strerror', None) or exc}); expected {what}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{short(path)}: not a regular file; expected {what}")
    if st.st_size > max_bytes:
        raise error(f"{short(path)}: {st.st_size} bytes; expected {what} of at most {max_bytes} bytes")
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{short(path)}: cannot read ({exc.strerror or exc}); expected {what}") from None
    if len(data) > max_bytes:
        raise error(f"{short(path)}: grew past {max_bytes} bytes while read; expected {what}")
    return data
