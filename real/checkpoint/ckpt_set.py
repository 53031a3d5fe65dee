"""A node's checkpoint sets on disk: files that prove themselves, written whole or not at all.

One set per checkpointed round (an async run's: per cut, named by the server's version at the cut,
real/rounds/round_async.py), in its own directory:

    checkpoints/node{i}/round-{R:06d}/global.pt      θ_g and the outer momentum (the same on every node)
                                     /node.pt        what the node alone knows (inner AdamW, data
                                                     position, RNG, trace rows, streaming state)
                                     /manifest.json  format, round, node, the run's identity, the
                                                     digest's algorithm, each file's digest and size,
                                                     the checkpoint's times, and the sha256 of the
                                                     manifest itself

A set is written into `.round-{R:06d}.tmp{pid}` (every file fsynced as it is hashed), the
directory fsynced, then renamed into place: a set exists whole or not at all, and a reader
checks every digest before it loads anything (`verify`), so a flipped bit anywhere, a file cut
short or a file from another set is caught, named, and the set skipped. Files are digested with
BLAKE2b (hashlib; 1.75x less CPU than sha256 on a CPU without SHA instructions, measured on this
project's 2-core machine: the write's hashing runs beside training), named in the manifest's
`digest`; a set without that key is from before it and verifies with sha256. torch.load's own zip
checks do not catch a flipped bit in a tensor's bytes; the digests do. Files load with
`torch.load(weights_only=True)` only after they verify.

The newest KEEP sets of a node are kept, so a crash between two nodes' writes, or a set that
fails its check, leaves every node a round they all hold intact. A node's newest intact set can
be two checkpoints behind a peer's: its write of round R fails in the background, it learns so
only when the next checkpoint (R + k) is due, after that round's sync, while the peer has
written R and R + k; so three are kept. `BackgroundWriter` writes a
set in a thread from a snapshot in host memory while training goes on; a failed write
(a full disk) removes its temporary directory and raises `CheckpointWriteError` (one line naming
the path) at the next wait, leaving the sets already written untouched.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import torch

FORMAT = 4  # 4: a set per round (global.pt, node.pt, manifest.json) with digests
DIGEST = "blake2b"  # new sets' file digest; `digest` in the manifest, sha256 where absent (older sets)
DIGESTS = ("blake2b", "sha256")
KEEP = 3    # complete sets kept per node (one more exists while a new one is written)
PARTS = ("global.pt", "node.pt")
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 16
_CHUNK = 1 << 22


class CheckpointWriteError(OSError):
    """A set could not be written; str() is the one-line report (path, reason)."""


def node_dir(out_dir: str | Path, index: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"node{index}"


def set_dir(out_dir: str | Path, index: int, round_: int) -> Path:
    return node_dir(out_dir, index) / f"round-{round_:06d}"


def set_rounds(out_dir: str | Path, index: int) -> dict[int, Path]:
    """{round: directory} of the node's set directories (complete or not), by name."""
    found = {}
    root = node_dir(out_dir, index)
    if root.is_dir():
        for entry in root.iterdir():
            name = entry.name
            if name.startswith("round-") and name[6:].isdigit() and entry.is_dir():
                found[int(name[6:])] = entry
    return found


def remove_stale(out_dir: str | Path, index: int) -> list[Path]:
    """Delete what killed writers of this node left: temporary set directories (`.round-*.tmp*`,
    `.round-*.old*`), and temporary files of the format before sets (node{i}.tmp*)."""
    root = node_dir(out_dir, index)
    stale = sorted(root.glob(".*.tmp*")) + sorted(root.glob(".*.old*")) if root.is_dir() else []
    legacy = Path(out_dir) / "checkpoints"
    stale += sorted(legacy.glob(f"node{index}.tmp*")) if legacy.is_dir() else []
    for path in stale:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return stale


# --- digests ---------------------------------------------------------------------------------

class _HashingFile:
    """A write-only file object that hashes what passes through (torch.save writes sequentially;
    a tensor's storage in one call, so hashlib releases the GIL while it hashes)."""

    def __init__(self, handle, algorithm: str = DIGEST):
        self.handle, self.hash, self.size = handle, hashlib.new(algorithm), 0
        self.error: OSError | None = None  # torch's zip writer turns it into a RuntimeError: kept here

    def write(self, data) -> int:
        view = memoryview(data)
        self.hash.update(view)
        self.size += view.nbytes
        try:
            return self.handle.write(view)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.handle.flush()


def file_digest(path: Path, algorithm: str = DIGEST) -> tuple[str, int]:
    h, size = hashlib.new(algorithm), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _manifest_digest(fields: dict) -> str:
    body = {k: v for k, v in fields.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def run_identity(config: dict, nodes: list) -> str:
    """The run's identity: a digest of its settings (real.core.options.run_config) and its nodes'
    (name, devices, batch, local steps); two sets of one run carry the same one."""
    text = json.dumps({"config": config, "nodes": nodes}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- writing -----------------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_file(obj, path: Path) -> dict:
    """torch.save to `path`, fsynced; its digest (keyed by DIGEST) and size. A failed write is an
    OSError naming `path`."""
    with open(path, "wb") as handle:
        sink = _HashingFile(handle)
        try:
            torch.save(obj, sink)
        except RuntimeError:
            if sink.error is None:
                raise
            raise OSError(sink.error.errno, sink.error.strerror, str(path)) from None
        handle.flush()
        os.fsync(handle.fileno())
    return {DIGEST: sink.hash.hexdigest(), "bytes": sink.size}


def write_set(out_dir: str | Path, index: int, round_: int, identity: str, parts: dict,
              block_s: float, floor: int | None = None) -> float:
    """Write round_'s set whole (temp directory, fsync, rename), then drop sets beyond KEEP, except
    those at or after `floor` (an async run's newest cut that every node has written its part of:
    a slow node may not have written the cuts a fast one passed since); returns the seconds it
    took. CheckpointWriteError (one line) when it cannot be written: its temporary directory is
    removed and the sets already there are untouched."""
    start = time.perf_counter()
    final = set_dir(out_dir, index, round_)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        files = {name: save_file(parts[name], tmp / name) for name in PARTS}
        manifest = {"format": FORMAT, "round": round_, "node": index, "run_identity": identity,
                    "digest": DIGEST, "files": files, "ckpt_block_s": block_s,
                    "ckpt_background_s": time.perf_counter() - start}
        manifest["manifest_sha256"] = _manifest_digest(manifest)
        with open(tmp / MANIFEST, "w") as handle:
            json.dump(manifest, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same round written again after a resume from an earlier one
            old = final.with_name(f".{final.name}.old{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(exc.errno, _write_failure(exc, tmp, round_)) from None
    try:  # what is on disk is what was hashed, before any older set goes
        verify(final, round_, index)
    except (ValueError, OSError) as exc:
        raise CheckpointWriteError(errno.EIO, f"{final}: the set just written does not verify ({exc}); the "
                                              f"earlier rounds' checkpoints are kept") from None
    for old_round in rotated(set_rounds(out_dir, index), round_, floor):
        shutil.rmtree(set_dir(out_dir, index, old_round), ignore_errors=True)
    return time.perf_counter() - start


def rotated(rounds, written: int, floor: int | None = None) -> list[int]:
    """The sets the keep rotation removes once round `written` is on disk and verified: those before
    it beyond the newest KEEP - 1 (with it, KEEP), except those at or after `floor`. Sets after it
    (an earlier timeline's, after a resume from an older round) stay until this run replaces them:
    a set written at a lower round never makes a newer one the oldest, nor itself."""
    older = sorted(r for r in rounds if r < written)
    return [r for r in older[:max(len(older) - (KEEP - 1), 0)] if floor is None or r < floor]


def _write_failure(exc: OSError, tmp: Path, round_: int) -> str:
    where = exc.filename or tmp
    reason = "no space left on device" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
    return (f"{where}: {reason} while writing round {round_}'s checkpoint; its temporary files were removed "
            f"and the earlier rounds' checkpoints are intact (free space, then --resume)")


class BackgroundWriter:
    """One set written at a time, in a thread; `wait()` returns (or raises) the last write's outcome."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.outcome = None  # (row, seconds) or the exception

    def submit(self, fn, row) -> None:
        """Run fn() (returns seconds) in the background; `row` rides along to wait()'s result."""
        self.wait()

        def target():
            try:
                self.outcome = (row, fn())
            except BaseException as exc:
                self.outcome = exc

        self.thread = threading.Thread(target=target, name="geodt-checkpoint", daemon=True)
        self.thread.start()

    def wait(self):
        """Block until the write in flight (if any) ends; its (row, seconds), or None; re-raises its error."""
        if self.thread is None:
            return None
        self.thread.join()
        self.thread, outcome, self.outcome = None, self.outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


# --- reading -----------------------------------------------------------------------------------

def read_manifest(directory: Path) -> dict:
    """The set's manifest, checked against its own digest; ValueError (the reason) otherwise."""
    path = directory / MANIFEST
    if not path.exists():
        raise ValueError("no manifest (a write that did not finish)")
    with open(path, "rb") as handle:
        data = handle.read(MAX_MANIFEST_BYTES + 1)
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("manifest.json is not readable JSON (altered or corrupt)") from None
    if not isinstance(manifest, dict) or manifest.get("manifest_sha256") != _manifest_digest(manifest):
        raise ValueError("manifest.json fails its own digest (altered or corrupt)")
    return manifest


def verify(directory: Path, round_: int, index: int) -> dict:
    """The set's manifest once every file matches its digest; ValueError naming what does not."""
    manifest = read_manifest(directory)
    algorithm = manifest.get("digest", "sha256")
    if algorithm not in DIGESTS:
        raise ValueError(f"manifest.json names digest {algorithm!r}, expected one of {', '.join(DIGESTS)}")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"checkpoint format {manifest.get('format')!r}, expected {FORMAT}")
    if manifest.get("round") != round_ or manifest.get("node") != index:
        raise ValueError(f"manifest.json is for node {manifest.get('node')} round {manifest.get('round')} "
                         f"(moved or mixed from another set)")
    for name in PARTS:
        want = manifest["files"].get(name)
        path = directory / name
        if want is None or not path.exists():
            raise ValueError(f"{name} is missing")
        digest, size = file_digest(path, algorithm)
        if size != want["bytes"]:
            raise ValueError(f"{name} has {size} bytes, its manifest says {want['bytes']} (cut short or altered)")
        if digest != want.get(algorithm):
            raise ValueError(f"{name} fails its {algorithm} digest (a flipped bit or an altered file)")
    return manifest


def unresumable(out_dir: str | Path, names: list[str], width: int = 120) -> str | None:
    """Why --resume must not start: a node holding sets none of which verifies (its sets named, each
    one's reason cut to `width`), with what the other nodes hold; None when every node that holds a
    set holds one that verifies. A resume from the start would replace every node's sets, so nothing
    is touched: the user restores the node's sets or moves them aside. Each node's sets are read
    newest first up to the first that verifies (the nodes read them again as they resume); all of
    them only to word a refusal."""
    bad = [(name, index, reasons) for index, name in enumerate(names)
           if (reasons := _failures(out_dir, index, width, stop_at_good=True)) is not None and reasons]
    if not bad:
        return None
    held = {name: sorted(set(set_rounds(out_dir, index)) - set(_failures(out_dir, index, width) or {}))
            for index, name in enumerate(names) if all(name != b[0] for b in bad)}
    name, index, reasons = bad[0]
    sets = "; ".join(f"round {r}: {why}" for r, why in sorted(reasons.items()))
    others = "; ".join(f"{n}: rounds {', '.join(map(str, rs))}" for n, rs in held.items() if rs) or "none"
    also = f" (so do node {', '.join(b[0] for b in bad[1:])})" if len(bad) > 1 else ""
    return (f"--resume: node {name} has no checkpoint that verifies{also}: {node_dir(out_dir, index)} holds {sets}; "
            f"sets that verify: {others}; nothing was changed: restore node {name}'s sets, or move "
            f"{node_dir(out_dir, index)} aside to resume from the start")


def _failures(out_dir, index: int, width: int, stop_at_good: bool = False) -> dict[int, str] | None:
    """{round: reason} of node `index`'s sets that fail `verify`, newest first; with `stop_at_good`,
    None as soon as one verifies (the node can resume)."""
    reasons = {}
    for round_, directory in sorted(set_rounds(out_dir, index).items(), reverse=True):
        try:
            verify(directory, round_, index)
            if stop_at_good:
                return None
        except (ValueError, OSError, KeyError, TypeError) as exc:
            reasons[round_] = str(exc)[:width]
    return reasons


def load_set(directory: Path) -> dict:
    """The set's state: node.pt's entries and global.pt's `outer` (verify it first)."""
    state = torch.load(directory / "node.pt", map_location="cpu", weights_only=True)
    state["outer"] = torch.load(directory / "global.pt", map_location="cpu", weights_only=True)["outer"]
    return state


def set_bytes(params: int, streaming: bool) -> int:
    """About the bytes of one node's set for a model of `params` parameters: fp32 θ_g and
    momentum (global.pt), AdamW's two fp32 moments (node.pt), the model's own weights when
    streaming, plus 1 MiB for the rest (RNG, trace rows, zip headers)."""
    return (4 + (1 if streaming else 0)) * 4 * params + (1 << 20)
