"""Writing a profile CSV row by row, so an interrupted calibration keeps what it finished.

Each new row is committed by rewriting the whole (small) file to a temporary name and
`os.replace`-ing it over the profile: the file on disk is always complete rows under the
header, never half a line, even if the process is killed mid-write. A rerun into the same
file loads the rows already there and measures only the missing batch sizes; a file made for
another device, model, seq_len or dtype is refused (ProfileError). A last row cut mid-line
(no line end, or fewer fields than the header: a copy killed half-way) is left out, said so,
and remeasured. Two calibrations into one file would each rewrite it from their own rows and
lose the other's: the writer holds an exclusive lock (fcntl.flock on `.<name>.lock` beside
the profile) for its whole life, and a second writer fails at once with one line.
"""
from __future__ import annotations

import csv
import io
import os
import sys
import tempfile
from pathlib import Path

from formats.files import FileLock
from formats.profile import COLUMNS, IDENTITY, ProfileError, read_profile_frame


def format_cell(value) -> str:
    """CSV text of one value: '' for None, lowercase booleans, full-precision floats."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def check_writable(path: Path) -> None:
    """ProfileError unless `path` can be created or replaced (checked before any measuring)."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.exists() and not path.is_file():
        raise ProfileError(f"{path}: not a regular file; expected a path for the profile CSV")
    if not parent.is_dir():
        raise ProfileError(f"{path}: directory {str(parent)!r} does not exist; expected an existing directory")
    try:  # os.access says yes to root even on read-only mounts: try for real
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ProfileError(f"{path}: directory {str(parent)!r} is not writable ({exc.strerror}); "
                           "expected a writable output path") from None


def _file_mode(path: Path) -> int:
    """The mode a new file would get from the umask, or the existing file's mode."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class ProfileWriter:
    """The rows of one profile file: those already on disk plus those appended now."""

    def __init__(self, path: str | Path, identity: dict[str, str], force: bool = False):
        """Open `path` for a profile of `identity` (IDENTITY column -> value as written); `force`:
        a file there that is not such a profile is written over instead of refused (--force)."""
        self.path = Path(path)
        check_writable(self.path)
        identity = {"compiled": False, **identity}  # an eager step unless said otherwise
        self.identity = {k: format_cell(identity[k]) for k in IDENTITY}
        self.rows: list[dict[str, str]] = []
        self._lock = self._take_lock()
        try:
            self._read_existing()
        except ProfileError:
            if not force:
                self.close()
                raise
            self.rows = []  # --force: the file is replaced by this profile's rows
        except BaseException:  # a refused --out leaves no lock file behind
            self.close()
            raise

    def _read_existing(self) -> None:
        """The rows already in the file, which must be of this profile's identity."""
        if self.path.exists():
            frame = read_profile_frame(self.path, drop_truncated=True)
            if self._has_cut_row():
                print(f"geodt calibrate: {self.path}: the last row was cut mid-line; it is left out and "
                      "remeasured", file=sys.stderr)
            for column in IDENTITY:
                have = sorted(set(frame[column]))
                if have and have != [self.identity[column]]:
                    raise ProfileError(
                        f"{self.path}: column {column!r}: file holds {', '.join(map(repr, have))}; expected "
                        f"{self.identity[column]!r} (a profile is one device, model, seq_len and dtype; "
                        "use another --out, or --force to write over it)")
            self.rows = frame[list(COLUMNS)].to_dict("records")

    def _take_lock(self) -> FileLock:
        lock_path = self.path.with_name(f".{self.path.name}.lock")
        return FileLock.take_now(lock_path, ProfileError, lambda: (
            f"{self.path}: another geodt calibrate is writing this profile (lock {lock_path.name}); "
            "expected one calibration per file at a time"))

    def close(self) -> None:
        """Release the lock and remove its file (a killed process leaves it: harmless, reused)."""
        if getattr(self, "_lock", None) is not None:
            self._lock.release()
            self._lock = None

    def _has_cut_row(self) -> bool:
        try:
            data = self.path.read_bytes()
        except OSError:
            return False
        if not data or data.endswith(b"\n"):
            lines = data.decode("utf-8", "replace").splitlines()
            if len(lines) < 2:
                return False
            header, last = next(csv.reader([lines[0]])), next(csv.reader([lines[-1]]), [])
            return len(last) != len(header)
        return data.count(b"\n") >= 1

    def measured(self) -> dict[int, dict[str, str]]:
        """Rows already in the file, by batch size."""
        return {int(row["batch_size"]): row for row in self.rows}

    def append(self, row: dict) -> None:
        """Add one row (every column of COLUMNS) and commit the file atomically."""
        row = {"compiled": False, "warmup_steps": None, "warmup_s": None, "outer_step_cpu_ns_per_param": None,
               "outer_step_device_ns_per_param": None, "ckpt_snapshot_ns_per_byte": None,
               "ckpt_write_ns_per_byte": None, **row}  # rows built before the columns
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise ValueError(f"profile row lacks column {missing[0]!r}")
        self.rows.append({c: format_cell(row[c]) for c in COLUMNS})
        self._commit()

    def set_column(self, column: str, value) -> None:
        """Set one column on every row (a figure of the whole profile) and commit the file atomically."""
        if column not in COLUMNS:
            raise ValueError(f"profile has no column {column!r}")
        for row in self.rows:
            row[column] = format_cell(value)
        self._commit()

    def _commit(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent or ".")
        try:
            os.chmod(tmp, _file_mode(self.path))  # mkstemp's 0600 would otherwise survive the replace
            with os.fdopen(fd, "w", newline="") as handle:
                handle.write(buffer.getvalue())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(exc, OSError) and exc.filename is None:  # a write's error names no file: this one
                raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            raise


def write_new_profile(path: str | Path, rows: list[dict]) -> None:
    """Replace `path` with a profile of exactly `rows` (one measurement, nothing kept from before);
    each row committed as ProfileWriter commits it."""
    path = Path(path)
    path.unlink(missing_ok=True)
    writer = ProfileWriter(path, {k: rows[0][k] for k in IDENTITY})
    try:
        for row in rows:
            writer.append(row)
    finally:
        writer.close()


def set_profile_columns(path: str | Path, values: dict) -> None:
    """Set whole-profile figures (column -> value, the same on every row) in an existing profile,
    under the writer's lock, committed as ProfileWriter commits rows."""
    frame = read_profile_frame(path, drop_truncated=True)
    writer = ProfileWriter(path, {k: frame[k].iloc[0] for k in IDENTITY})
    try:
        for column, value in values.items():
            writer.set_column(column, value)
    finally:
        writer.close()


def out_paths(out: Path, devices: list[str]) -> list[Path]:
    """The profile file of each device: OUT itself for one, OUT-cudaN.csv for several."""
    if len(devices) == 1:
        return [out]
    return [out.with_name(f"{out.stem}-{d.replace(':', '')}{out.suffix or '.csv'}") for d in devices]
