"""Checkpoints at every outer sync: one self-contained file per node, written atomically.

Each node's leader saves what the node alone knows (its inner AdamW state, data position,
RNG states, trace rows) plus the global weights and outer momentum, which are identical on
every node; the node's other processes hold the same state (their gradients are averaged
every step) and resume from the leader's file, on the same machine. So a node resumes from
its own disk, as it must across machines. The previous file is kept as `.prev`: a crash
between two nodes' writes, or a file that no longer loads, sends the nodes back to the
latest round that every node still holds intact. Everything stored is a tensor or plain
Python data, so files load with `torch.load(weights_only=True)`.

Each file also records the run's settings (`run_config`); resuming with other values is
refused naming the key (real/worker.py), as are global weights that differ between nodes.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch

FORMAT = 3  # 3: trace rows carry peak_mem_bytes; a sharded node saves the canonical (gathered) form


def node_path(out_dir: str | Path, index: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"node{index}.pt"


def _prev(path: Path) -> Path:
    return path.with_suffix(".prev.pt")


def remove_stale_temps(out_dir: str | Path, index: int) -> list[Path]:
    """Delete node{index}.tmp<PID> files a killed run left behind; returns them."""
    path = node_path(out_dir, index)
    stale = sorted(path.parent.glob(f"{path.stem}.tmp*")) if path.parent.exists() else []
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


def save_node(out_dir: str | Path, index: int, state: dict) -> None:
    """Write temp, keep the last file as .prev, move the new one in (each step atomic)."""
    path = node_path(out_dir, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"format": FORMAT, **state}, tmp)
    if path.exists():
        os.replace(path, _prev(path))
    os.replace(tmp, path)


def load_node_candidates(out_dir: str | Path, index: int, report: bool = True) -> dict[int, Path]:
    """{rounds_done: file} of this node's readable checkpoints (latest and previous).

    A file that does not load is skipped with a one-line message naming it (when `report`)."""
    found = {}
    path = node_path(out_dir, index)
    for candidate in (path, _prev(path)):
        if not candidate.exists():
            continue
        try:
            state = torch.load(candidate, map_location="cpu", weights_only=True)
            rounds = int(state["rounds_done"]) if state.get("format") == FORMAT else None
        except Exception as exc:  # noqa: BLE001 - any unreadable file: zip, pickle, truncation
            if report:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"real: {candidate}: unreadable checkpoint ({reason[:160]}); trying the previous round's copy",
                      file=sys.stderr, flush=True)
            continue
        if rounds is None:
            if report:
                print(f"real: {candidate}: checkpoint of another format (expected {FORMAT}); ignored",
                      file=sys.stderr, flush=True)
            continue
        found.setdefault(rounds, candidate)
    return found


def load_node(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def weights_digest(*tensors: torch.Tensor) -> int:
    """A 63-bit digest of the tensors' bytes (to check that every node holds the same weights)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") >> 1
