"""Whose files an output folder holds: each command's outputs, --force, geodt's temporary names.

Torch-free: simulator/, real/ and geodt/ all use it.

- Outputs: OUTPUTS names, per command, the entries it writes at the top of its --out. A
  command writing into a folder that holds another command's outputs (a name of OUTPUTS that
  is not its own) is refused in one line before anything is written, unless --force; so
  is a run (not --resume) into a folder holding an earlier run's checkpoints. The same
  command into its own folder is a rerun and goes ahead. Files that are no command's are
  never looked at: they are the user's. A command writing one file (a profile) refuses an
  existing file that is not such a profile (check_file_owner); `geodt paper`, whose names
  (README.md) are a user's too, refuses those an earlier `geodt paper` did not write
  (check_paper_owner); so does `geodt plan --export torchft` (run_all.sh: check_marked_owner).
- Temporaries: every temporary file or staging folder geodt makes in a folder is named
  `.NAME.geodt<pid>-XXXXXXXX.tmp` (temp_prefix, TEMP_SUFFIX; the executor's own writers use
  `.NAME.tmp<pid>` with NAME one of the outputs). remove_orphan_temps removes exactly those
  names whose process is gone, nothing else: a user's `.tmp/` or `.vimrc.tmpl` stays.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from formats.files import short

_RUN = {"plan.csv", "scenario.toml", "trace.csv", "trace.json", "syncs.csv", "final_weights.pt", "checkpoints",
        "wan.csv", "timeline.csv", "validation.csv", "validation.png", "loss.png"}  # and validate --trace's
OUTPUTS = {
    "plan": {"plan.csv", "scenario.toml", "idle.png"},
    "simulate": {"plan.csv", "scenario.toml", "timeline.csv", "timeline.parquet", "syncs.csv", "syncs.parquet",
                 "summary.csv", "trace.json", "loss.png", "idle.png"},
    "table": {"table.csv", "table.md", "plan.csv", "summary.csv", "scenario.toml"},
    "sweep": {"spec.json", "sweep", "sweep.sha256", "sweep.csv", "sweep.csv.sha256", "scenario.toml",
              "idle_left.png", "winners.png", "speedup.png"},
    "run": _RUN,
    "validate": _RUN,
}
_PARTS = re.compile(r"parts-chunk\d+")  # a sweep's resumable parts (simulator/sweep/sweep_cli.py)
ALL_OUTPUTS = frozenset().union(*OUTPUTS.values())

TEMP_SUFFIX = ".tmp"
_OWN_TEMP = re.compile(r"\.(?P<name>.+)\.geodt(?P<pid>\d+)-[a-z0-9_]{8}\.tmp")
_EXEC_TEMP = re.compile(r"\.(?P<name>.+)\.tmp(?P<pid>\d+)")


def output_name(name: str) -> bool:
    """Whether a top-level entry of --out is a geodt command's output."""
    return name in ALL_OUTPUTS or _PARTS.fullmatch(name) is not None


def foreign_outputs(out: str | Path, command: str) -> list[str]:
    """The entries of `out` that another command wrote (sorted), [] when out is new or its own."""
    try:
        names = os.listdir(out)
    except (FileNotFoundError, NotADirectoryError):
        return []
    own = OUTPUTS[command]
    return sorted(n for n in names
                  if output_name(n) and n not in own and not (command == "sweep" and _PARTS.fullmatch(n)))


def check_owner(out: str | Path, command: str, force: bool, checkpoints: bool = False) -> str | None:
    """Why `command` may not write into `out`, or None. `checkpoints`: out holds an earlier run's
    checkpoints and this run does not resume them."""
    if force:
        return None
    foreign = foreign_outputs(out, command)
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        return (f"--out {out}: holds another command's outputs ({shown}); expected a new folder, or --force to "
                f"write over them")
    if checkpoints:
        return (f"--out {out}: holds an earlier run's checkpoints ({Path(out) / 'checkpoints'}); expected a new "
                f"folder, --resume to continue that run, or --force to start over (they are replaced)")
    return None


def check_file_owner(path: str | Path, kind: str, reader, force: bool) -> str | None:
    """Why a command writing the one file `path` (a profile) may not, or None: it exists and is
    not a `kind` as `reader` (raising ValueError) reads it: a user's notes, a run's plan.csv, a
    profile that fails its checks (never taken for an empty one). An earlier `kind` is the command's
    own (a rerun replaces or completes it); --force writes over anything that is a file."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        return f"--out {short(path)}: not a regular file; expected a path for the {kind}"
    if force:
        return None
    try:
        reader(path)
    except ValueError as exc:
        reason = short(str(exc).removeprefix(f"{path}: ").removeprefix(f"{short(path)}: "))
        return (f"--out {short(path)}: holds a file that is not a {kind} ({reason}); expected a new file, an "
                f"earlier {kind} to replace, or --force to write over it")
    return None


PAPER_MARK = "Generated by `geodt paper`"  # in the README.md `geodt paper` writes (geodt/paper/template.py)


def check_paper_owner(out: str | Path, names, force: bool) -> str | None:
    """Why `geodt paper` may not write its files `names` into `out`, or None: out holds another
    command's outputs, or files of paper's names that an earlier `geodt paper` did not write (its
    README.md, which carries PAPER_MARK, says it did): a user's README.md or predictions.csv."""
    if force:
        return None
    try:
        entries = set(os.listdir(out))
    except (FileNotFoundError, NotADirectoryError):
        return None
    names = set(names)
    foreign = sorted(n for n in entries if output_name(n) and n not in names)
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        return (f"--out {out}: holds another command's outputs ({shown}); expected a new folder, or --force to "
                f"write over them")
    present = sorted(entries & names)
    if present and not _marked(Path(out) / "README.md", PAPER_MARK):
        shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
        return (f"--out {out}: holds files `geodt paper` would replace and did not write ({shown}); expected a "
                f"new folder, an earlier `geodt paper` output, or --force to write over them")
    return None


def check_marked_owner(out: str | Path, names, mark: str, command: str, force: bool) -> str | None:
    """Why `command` may not write its files `names` into `out`, or None: files of those names that
    it did not write, those without `mark` in their first 4 KB (a user's run_all.sh)."""
    if force:
        return None
    present = sorted(n for n in names if os.path.lexists(Path(out) / n))
    theirs = [n for n in present if not _marked(Path(out) / n, mark)]
    if theirs:
        shown = ", ".join(theirs[:4]) + (", ..." if len(theirs) > 4 else "")
        return (f"--out {out}: holds files `{command}` would replace and did not write ({shown}); expected a new "
                f"folder, an earlier `{command}` output, or --force to write over them")
    return None


def _marked(path: Path, mark: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return mark.encode() in handle.read(4096)
    except OSError:
        return False


def temp_prefix(name: str) -> str:
    """The start of a temporary name for `name` made by this process (then XXXXXXXX and TEMP_SUFFIX:
    tempfile.mkstemp / mkdtemp with this prefix and suffix)."""
    return f".{name}.geodt{os.getpid()}-"


def own_temp(name: str) -> int | None:
    """The pid of the process that made the geodt temporary `name`, or None when geodt did not name it."""
    match = _OWN_TEMP.fullmatch(name)
    if match is None:
        match = _EXEC_TEMP.fullmatch(name)
        if match is None or not (output_name(match["name"]) or match["name"] == "geodt-ckpt-timing"):
            return None
    return int(match["pid"])


def remove_orphan_temps(directory: str | Path, only: str | None = None) -> list[Path]:
    """Remove geodt's temporaries in `directory` (own_temp) whose process is gone, this user's only;
    `only`: those made for that name. The paths removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        pid = own_temp(entry.name)
        if pid is None or (only is not None and not entry.name.startswith(f".{only}.")) or pid_alive(pid):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process pid exists (one of another user counts as alive)."""
    if pid <= 0:
        return True  # kill(0) / kill(-1) would ask about groups: never taken as gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


FORCE_HELP = ("write into an --out that holds another command's outputs (or, for a run, an earlier run's "
              "checkpoints), replacing those of the same names; without it such a folder is refused")


def add_force_argument(parser) -> None:
    """--force, the same for every command that writes an --out (check_owner)."""
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
