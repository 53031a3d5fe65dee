"""The output directory of a run, before any process starts: one run at a time (its lock),
what killed runs left behind removed, and room for the run's checkpoints checked.

- The lock: DIR/.run.lock (formats/files.py's FileLock, taken without waiting), the holder's
  pid written in it, so that a second `geodt run`, `geodt validate` or `python -m real` on the
  same --out is refused in one line naming the first (exit 2) instead of interleaving its
  checkpoints and replacing its outputs.
- Stale temporaries: the temporary files and staging folders of geodt's outputs that a killed
  writer left, by their own names only and once their process is gone (formats/owners.py:
  a user's `.tmp/` is not geodt's); the nodes' own checkpoint temporaries are removed by each
  node (real/checkpoint/ckpt_set.py).
- Rendezvous folders: a local run's FileStore lives in `$TMPDIR/geodt-rdzv-<pid>-*`; a launcher
  killed with SIGKILL cannot remove its own, so every launch removes those of launchers that
  are gone (same user only).
- Disk space: the run's peak footprint on this machine (KEEP + 1 checkpoint sets of each
  local node, the final weights twice while replaced), less what its existing checkpoints
  already take, must fit in the free space, else one line and exit 2.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from formats.files import FileLock
from formats.owners import pid_alive, remove_orphan_temps

LOCK_NAME = ".run.lock"
RDZV_PREFIX = "geodt-rdzv-"


class OutDirError(ValueError):
    """The directory cannot take this run; str() is the one-line report."""


def take_lock(out_dir: str | Path) -> FileLock:
    """DIR's run lock (held until release() or this process ends); OutDirError naming the holder otherwise."""
    path = Path(out_dir) / LOCK_NAME
    lock = FileLock.take_now(path, OutDirError, lambda: (
        f"{out_dir}: another run (pid {_holder(path)}) is using this directory; wait for it to end or choose "
        "another --out"))
    lock.handle.truncate(0)
    lock.handle.write(f"{os.getpid()}\n")
    lock.handle.flush()
    return lock


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def remove_stale_outputs(out_dir: str | Path) -> list[Path]:
    """geodt's temporary files and staging folders in DIR whose writer is gone (hold the lock)."""
    return remove_orphan_temps(out_dir)


def rendezvous_dir() -> tempfile.TemporaryDirectory:
    """A temporary folder for the local rendezvous, named after this process (after removing
    those of launchers that are gone)."""
    remove_orphan_rendezvous()
    return tempfile.TemporaryDirectory(prefix=f"{RDZV_PREFIX}{os.getpid()}-")


def remove_orphan_rendezvous(root: str | None = None) -> list[Path]:
    """Remove this user's geodt-rdzv-<pid>-* folders whose launcher is no longer running."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{RDZV_PREFIX}*"):
        match = re.match(rf"{RDZV_PREFIX}(\d+)-", path.name)
        try:
            if match is None or path.lstat().st_uid != os.getuid() or not path.is_dir() or pid_alive(int(match[1])):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def check_space(out_dir: str | Path, node_indices: list[int], params: int, streaming: bool,
                checkpoints: bool, free_bytes: int | None = None) -> None:
    """OutDirError (one line) when the run's checkpoints and final weights cannot fit in DIR."""
    # deferred: torch (checkpoints); the run lock and stale outputs are read without it
    from real.checkpoint.ckpt_set import KEEP, node_dir, set_bytes  # noqa: PLC0415

    per_set = set_bytes(params, streaming)
    sets = (KEEP + 1) * len(node_indices) if checkpoints else 0
    final = 2 * 4 * params  # final_weights.pt (fp32) and its temporary copy while it is replaced
    have = sum(_tree_bytes(node_dir(out_dir, i)) for i in node_indices)
    need = sets * per_set + final - have
    free = shutil.disk_usage(out_dir).free if free_bytes is None else free_bytes
    if need > free:
        raise OutDirError(
            f"{out_dir}: {_size(free)} free; the run needs about {_size(need)} more ({sets} checkpoint sets of "
            f"{_size(per_set)}: {KEEP + 1} per node, and {_size(final)} for the final weights); free space or "
            f"choose another --out")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
