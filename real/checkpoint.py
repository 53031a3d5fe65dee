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
refused naming the key, as are global weights that differ between nodes. `node_state` and
`restore_node_state` turn a running node (real/worker.py's Node) into such a file's contents
and back; `resume` agrees with the other nodes on the round to resume from and loads it.
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


# --- a node's state, and resuming --------------------------------------------------------

def node_state(node) -> dict:
    """What a Node's checkpoint holds (module docstring); a sharded node's gathered whole (a
    collective of the node's processes)."""
    if node.layout is not None:
        outer = {key: node.layout.gather(value) for key, value in node.outer.state_dict().items()}
        inner = node.layout.full_optimizer_state(node.optimizer)
    else:
        outer, inner = node.outer.state_dict(), node.optimizer.state_dict()
    return {
        "rounds_done": node.rounds_done, "node": node.me.node, "nodes": len(node.plan.nodes),
        "gpus": node.me.gpus, "local_steps": node.me.local_steps, "batch_size": node.batch,
        "run_config": node.config,
        "outer": outer, "inner_optimizer": inner,
        "scaler": node.scaler.state_dict() if node.scaler is not None else None,
        "inner_step": node.inner_step, "data_position": node.data_position,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(node.device) if node.device.type == "cuda" else None,
        "trace": node.trace, "time_offset_s": node.time_offset_s,
        "streaming": node.streaming.state_dict() if node.streaming is not None else None,
    }


def restore_node_state(node, state: dict, source: str) -> None:
    """Load `state` into the Node; ValueError naming the key when it was made by another plan or settings."""
    for key, mine in (("nodes", len(node.plan.nodes)), ("node", node.me.node), ("gpus", node.me.gpus),
                      ("local_steps", node.me.local_steps), ("batch_size", node.batch)):
        if state[key] != mine:
            raise ValueError(f"{source}: {key}: checkpoint has {state[key]!r}, this run has {mine!r}; "
                             f"resume with the same plan")
    saved = state["run_config"]
    for key, mine in node.config.items():
        if saved.get(key) != mine:
            raise ValueError(f"{source}: {key}: the checkpoints were made with {saved.get(key)!r}, this run "
                             f"has {mine!r}; resume with the same settings (or start afresh in another --out)")
    outer = state["outer"]
    node.loaded_digest = weights_digest(outer["global_flat"], outer["momentum"])
    if node.layout is not None:
        node.outer.load_state_dict({key: node.layout.local_slice(value) for key, value in outer.items()})
        node.layout.load_optimizer_state(node.optimizer, state["inner_optimizer"])
    else:
        node.outer.load_state_dict(outer)
        node.optimizer.load_state_dict(state["inner_optimizer"])
    node.outer.load_into_model()
    if node.streaming is not None:  # the model's own weights, which streaming keeps apart from θ_g
        node.streaming.load_state_dict(state["streaming"])
    if node.scaler is not None and state["scaler"] is not None:
        node.scaler.load_state_dict(state["scaler"])
    node.rounds_done = int(state["rounds_done"])
    node.inner_step = int(state["inner_step"])
    node.data_position = int(state["data_position"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and node.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], node.device)
    node.trace = [dict(row) for row in state["trace"]] if node.groups.is_leader else []
    node.time_offset_s = max((row["round_end_s"] + row["ckpt_s"] for row in state["trace"]), default=0.0)


def _common_round(node, mine: dict[int, Path]) -> int | None:
    """The latest round every node can load (an all-gather of each node's two newest), or None
    when no node has saved anything yet; ValueError when the nodes' checkpoints share none."""
    groups, plan = node.groups, node.plan
    rounds = sorted(mine, reverse=True)[:2]
    everyone = groups.all_gather_ints(rounds + [-1] * (2 - len(rounds)))
    per_node = [set(r for r in everyone[plan.first_rank(i)] if r >= 0) for i in range(len(plan.nodes))]
    common = set.intersection(*per_node)
    if not common:
        if any(per_node):
            raise ValueError(f"{node_path(node.opts.out_dir, groups.index).parent}: the nodes' "
                             f"checkpoints share no round ({[sorted(s) for s in per_node]}); cannot resume")
        return None
    return max(common)


def _check_same_weights(node, path: Path, round_: int) -> None:
    """Every process must have loaded the same global weights and outer momentum (digests of
    the canonical, gathered form)."""
    groups, plan = node.groups, node.plan
    digests = [d[0] for d in groups.all_gather_ints([node.loaded_digest])]
    leaders = [digests[plan.first_rank(i)] for i in range(len(plan.nodes))]
    if len(set(digests)) != 1:
        odd = [plan.nodes[i].node for i, d in enumerate(leaders) if leaders.count(d) <= len(leaders) // 2]
        raise ValueError(f"{path.parent}: round {round_}: the nodes' checkpoints hold different global "
                         f"weights (node {', '.join(odd) or 'processes of one node'} differ{'s' if len(odd) == 1 else ''}); "
                         f"a checkpoint was altered or mixed from another run; refusing to resume")


def resume(node) -> None:
    """Load the latest round that every node holds intact (agreed by an all-gather of the
    rounds each node can load), then check that every node loaded the same global weights."""
    mine = load_node_candidates(node.opts.out_dir, node.groups.index, report=node.groups.is_leader)
    round_ = _common_round(node, mine)
    if round_ is None:
        return  # nothing saved yet: start from the beginning
    path = mine[round_]
    restore_node_state(node, load_node(path), str(path))
    _check_same_weights(node, path, round_)
    # Every node's offset becomes the latest, so the resumed timeline stays common.
    node.time_offset_s = node.groups.max_float(node.time_offset_s)
