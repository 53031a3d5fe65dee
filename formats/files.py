"""Reading input files safely (regular files only, of a bounded size), and file locks (torch-free).

A FIFO given as a profile or config.json would block the read forever, /dev/zero would fill
memory; both are refused from `os.stat` before the file is opened.
"""
from __future__ import annotations

import fcntl
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


def child_path(directory: str | Path, name: str) -> Path:
    """directory/name, `name` one plain file name (no / or \\, not starting with .): a name taken
    from input never makes a path outside `directory`; ValueError otherwise."""
    if not name or "/" in name or "\\" in name or "\0" in name or name.startswith("."):
        raise ValueError(f"{name!r}: expected a plain file name (no / or \\, not starting with .)")
    return Path(directory) / name


class FileLock:
    """An exclusive fcntl.flock on a lock file, removed again on release.

    The lock is taken on an open file and then checked to still be the file at `path` (by
    inode): a process that opened the file just before its holder removed it retries on the new
    one, so two processes never both hold "the" lock. A killed holder leaves the file behind;
    its lock dies with it, and the next process reuses the file."""

    def __init__(self, path: str | Path, wait: bool, on_wait=None):
        self.path = Path(path)
        self.handle = None
        for _ in range(1000):
            handle = open(self.path, "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    handle.close()
                    raise
                if on_wait is not None:
                    on_wait()
                    on_wait = None
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                if os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino:
                    self.handle = handle
                    return
            except FileNotFoundError:
                pass
            handle.close()
        raise BlockingIOError(f"{self.path}: could not take the lock")

    @classmethod
    def take_now(cls, path: str | Path, error: type[Exception], busy) -> FileLock:
        """The lock at `path` without waiting; error(busy()) while another process holds it,
        error(one line) when the lock file cannot be opened."""
        try:
            return cls(path, wait=False)
        except BlockingIOError:
            raise error(busy()) from None
        except OSError as exc:
            raise error(f"{path}: cannot open the lock file ({exc.strerror}); expected a writable directory") from None

    def release(self) -> None:
        if self.handle is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.handle.close()
            self.handle = None
