"""Checkpoints at every outer sync: one self-contained file per node, written atomically.

Each node saves what it alone knows (its inner AdamW state, data position, RNG states, trace
rows) plus the global weights and outer momentum, which are identical on every node. So a
node resumes from its own disk, as it must across machines. The previous file is kept as
`.prev`: if a crash hits between two nodes' writes, the nodes resume from the latest round
that every node still holds. Everything stored is a tensor or plain Python data, so files
load with `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT = 1


def node_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"node{rank}.pt"


def _prev(path: Path) -> Path:
    return path.with_suffix(".prev.pt")


def save_node(out_dir: str | Path, rank: int, state: dict) -> None:
    """Write temp, keep the last file as .prev, move the new one in (each step atomic)."""
    path = node_path(out_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"format": FORMAT, **state}, tmp)
    if path.exists():
        os.replace(path, _prev(path))
    os.replace(tmp, path)


def load_node_candidates(out_dir: str | Path, rank: int) -> dict[int, Path]:
    """{rounds_done: file} of this node's readable checkpoints (latest and previous)."""
    found = {}
    path = node_path(out_dir, rank)
    for candidate in (path, _prev(path)):
        if candidate.exists():
            state = torch.load(candidate, map_location="cpu", weights_only=True)
            if state.get("format") == FORMAT:
                found.setdefault(int(state["rounds_done"]), candidate)
    return found


def load_node(path: str | Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)
