"""Checkpoints of a DiLoCo node: every `checkpoint_every` rounds, snapshotted to host memory and
written in the background as a set whose files prove themselves (real/checkpoint/ckpt_set.py).

Each node's leader saves what the node alone knows (its inner AdamW state, data position,
RNG states, trace rows) plus the global weights and outer momentum, which are identical on
every node; the node's other processes hold the same state (their gradients are averaged
every step) and resume from the leader's files, on the same machine. So a node resumes from
its own disk, as it must across machines. Everything stored is a tensor or plain Python data,
so files load with `torch.load(weights_only=True)`, and only after their digests verify.

Saving (`save`) blocks training only for the snapshot (a copy of the state into host memory;
a sharded node's gather) and for the previous set's write if it has not finished; the write
itself (torch.save, sha256, fsync, rename) runs in a thread while the next rounds train. The
trace's `ckpt_block_s` is the blocking part, `ckpt_background_s` the write (filled in when it
has finished; real/rounds/trace.py). A round's set is due every `checkpoint_every` rounds (`due_here`:
given, or the Young/Daly interval for a checkpoint's cost, timed on a stand-in beside the first
round, and the scenario's MTBF), and after the last round only when --stop-after or
--checkpoint-final asks (so a stopped run is resumable, and a finished one pays for no write it
will not use).

Resuming (`resume`): each node verifies its sets (every digest, its manifest), the nodes
agree on the newest round every node holds intact (an all-gather), and each node says which
newer sets it skipped and why; rank 0 names the nodes that lacked a newer round. The DiLoCo
state that must agree across nodes (θ_g, outer momentum, round) is compared by digest after
loading, and the run's settings (`run_config`) key by key: resuming with other values is
refused naming the key.

An async run (real/rounds/round_async.py) has no round its nodes end together, so its sets are a
consistent cut (Chandy–Lamport): each leader keeps in host memory a snapshot of its state right
after each pull (replaced at every pull, while a cut is still due); the server records its own
state (θ_g, delayed Nesterov state, version, each node's last pull and pushes) when its version
reaches a due cut (`async_cuts`: every K·n pushes for --checkpoint-every K, the cut of
--stop-after R at R·n pushes, the last push with --checkpoint-final; no Young/Daly default, which
needs a round every node ends together), and each node writes the snapshot of its last pull at or
before the cut when its next reply's version passes it (node 0 adds the server's state), or at the
end for a node whose rounds are done. A set is named by the cut's version; resuming loads each
node's part of the newest cut every node holds, the server's state on node 0, and checks that the
server's record of every node's last pull and pushes is that node's (`_check_cut`); each node then
redoes its work since its snapshot, the same pseudo-gradients. A quorum run (real/rounds/round_quorum.py)
is cut the same way, its cuts counted in the server's arrivals instead of its versions and each
reply marked with the first cut it is in (that module's doc): the server's part adds the late pushes
the next close will merge and leaves out the pushes of the nodes waiting for a close.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from formats.scenario import rounds_between_checkpoints
from real.checkpoint import ckpt_set
from real.checkpoint.ckpt_set import CheckpointWriteError, set_bytes
from real.core.diloco import timing_sizes
from real.rounds.round_quorum import QuorumServer
from real.rounds.round_server import Cuts

__all__ = [
    "CheckpointWriteError",
    "async_cuts",
    "begin",
    "due",
    "due_here",
    "latest_state",
    "resume",
    "resume_own",
    "save",
    "set_bytes",
    "start_afresh",
    "stopped",
    "verified_sets",
    "wait_writes",
    "weights_digest",
]


def due(rounds_done: int, every: int, last: int, final: bool = False) -> bool:
    """Whether the set after `rounds_done` rounds is written: every `every`, and the run's last when `final`."""
    return rounds_done % every == 0 or (final and rounds_done == last)


def due_here(node, last: int) -> bool:
    """Whether this round (node.rounds_done rounds done) ends in a checkpoint. Called by every
    process of the run after every round (the cadence's choice is a collective). Every
    --checkpoint-every K, else [training] checkpoint_every K rounds; neither given, a checkpoint
    is timed in the background during the first round (`probe_cost_s`) and the next round
    chooses the Young/Daly interval. The run's
    last round ends in one only when asked (--checkpoint-final) or when it stops early
    (--stop-after), so that --resume continues it. An async or quorum run: every round (a snapshot
    at each pull, `_after_pull`) while a cut is still due for this node."""
    opts = node.opts
    if node.plan.round_kind.checkpoints == "cut":
        cuts = node.async_cuts.due
        return bool(cuts) and cuts[-1] > node.async_written
    if not opts.checkpoint:
        return False
    final = opts.checkpoint_final or opts.stop_after is not None
    k = opts.checkpoint_every or node.spec.checkpoint_every
    if k:
        return due(node.rounds_done, k, last, final)
    first = getattr(node, "ckpt_first", None)
    if first is None:  # the first round of this process: a checkpoint's cost is timed beside the next
        node.ckpt_first, node.ckpt_mark = node.rounds_done, time.perf_counter()
        if node.is_leader and node.rounds_done < last:
            _writer(node).submit(lambda: probe_cost_s(node), None)
        return final and node.rounds_done == last
    if getattr(node, "ckpt_every", None) is None:
        _choose_every(node, time.perf_counter() - node.ckpt_mark)
    return due(node.rounds_done - first, node.ckpt_every, last - first, final)


PROBE_PARAMS = 1 << 22  # the timed stand-in's parameters: 64 MiB of state, whatever the model's size


def probe_cost_s(node) -> float:
    """About the seconds one of the node's checkpoints costs (snapshot + write), timed on a
    stand-in of at most PROBE_PARAMS parameters (`time_checkpoint`, in the node's checkpoint
    folder) and scaled by bytes: the model's own state is not copied, so the timing takes no
    more memory than the stand-in's."""
    params = node.layout.full_numel if node.layout is not None else node.outer.global_flat.numel()
    probe = min(params, PROBE_PARAMS)
    folder = ckpt_set.node_dir(node.opts.out_dir, node.index)
    folder.mkdir(parents=True, exist_ok=True)
    snapshots, writes = time_checkpoint(probe, 1, node.device, folder)
    return (snapshots[0] + writes[0]) * set_bytes(params, node.streaming is not None) / set_bytes(probe, False)


def _choose_every(node, round_s: float) -> int:
    """The Young/Daly cadence in rounds, the same on every process: a checkpoint's cost
    (`probe_cost_s`: its blocking snapshot plus its write, which on a CPU node takes the cores
    training uses) and the round's seconds, the largest over the processes, and [simulation] mtbf_s."""
    cost_s = (_finished(node) or 0.0) if node.is_leader else 0.0  # probe_cost_s's
    # Under --on-node-loss continue each node chooses alone: its sets need not share rounds (the
    # members agree on the newest at a resume), and a joiner times its own first round later than
    # the members, so a collective here would pair with none. A node's processes agree (a sharded
    # node's all take part in each set).
    if node.opts.on_node_loss != "continue":
        cost_s, round_s = node.groups.max_float(cost_s), node.groups.max_float(round_s)
    else:
        cost_s, round_s = (node.groups.node_max(round(value * 1e9)) / 1e9 for value in (cost_s, round_s))
    node.ckpt_every = rounds_between_checkpoints(cost_s, node.spec.mtbf_s, round_s)
    if node.rank == 0:
        print(f"real: a checkpoint every {node.ckpt_every} round{'s' if node.ckpt_every > 1 else ''} (Young/Daly: "
              f"{cost_s:.2f} s a checkpoint, {round_s:.2f} s a round, MTBF {node.spec.mtbf_s:g} s; "
              f"--checkpoint-every sets it)", file=sys.stderr, flush=True)
    return node.ckpt_every


def remove_stale(out_dir, index: int) -> list[Path]:
    """What killed writers of node `index` left behind (real/checkpoint/ckpt_set.py's remove_stale)."""
    return ckpt_set.remove_stale(out_dir, index)


def save_whole(obj, path) -> None:
    """torch.save `obj` to `path` whole or not at all (temp name, fsync, rename); the temp file
    is removed when the write fails (a full disk), and the OSError names `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        ckpt_set.save_file(obj, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def weights_digest(*tensors: torch.Tensor, round_: int | None = None) -> int:
    """A 63-bit digest of the tensors' bytes (and the round), to check that every node holds the same state."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    if round_ is not None:
        h.update(round_.to_bytes(8, "little"))
    return int.from_bytes(h.digest()[:8], "little") >> 1


def identity(node) -> str:
    nodes = [(n.node, n.gpus, n.batch_size, n.local_steps) for n in node.plan.nodes]
    return ckpt_set.run_identity(node.config, nodes)


# --- a node's state ---------------------------------------------------------------------------

def node_state(node) -> dict:
    """What a Node's checkpoint holds (module docstring); a sharded node's gathered whole (a
    collective of the node's processes). Tensors may be the live ones: `snapshot` copies."""
    if node.layout is not None:
        outer = {key: node.layout.gather(value) for key, value in node.outer.state_dict().items()}
        inner = node.layout.full_optimizer_state(node.optimizer)
    else:
        outer, inner = node.outer.state_dict(), node.optimizer.state_dict()
    return {
        "format": ckpt_set.FORMAT,
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
        **({node.plan.sync: node.round.state_dict()} if node.plan.round_kind.checkpoints == "cut" else {}),  # a cut
    }


def _host_copy(value):
    """A deep copy of `value` whose tensors are fresh CPU tensors (training goes on changing the originals)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item) for item in value)
    return value


def snapshot(node) -> dict[str, dict]:
    """The set's parts in host memory: {"global.pt": {...}, "node.pt": {...}}."""
    state = _host_copy(node_state(node))
    outer = state.pop("outer")
    return {"global.pt": {"format": ckpt_set.FORMAT, "rounds_done": node.rounds_done, "outer": outer},
            "node.pt": state}


def time_checkpoint(params: int, repeats: int, device: str | torch.device,
                    directory) -> tuple[list[float], list[float]]:
    """Seconds of `snapshot`'s copy and of the background write (ckpt_set.save_file: torch.save,
    sha256, fsync) of a checkpoint of `params` parameters, one pair per repeat after a warm-up.
    Its state is laid out as a node's (16 bytes a parameter): the two AdamW moments on `device`,
    the global weights and outer momentum on the host (outer_state = "cpu"), each in tensors of
    the outer step's timing size. The write goes to a temporary file in `directory`, removed after."""
    sizes = timing_sizes(params)
    state = {"inner_optimizer": [[torch.ones(n, device=device) for n in sizes] for _ in range(2)],
             "outer": [[torch.ones(n) for n in sizes] for _ in range(2)]}
    path = Path(directory) / f".geodt-ckpt-timing.tmp{os.getpid()}"
    snapshots, writes = [], []
    try:
        for i in range(repeats + 1):
            start = time.perf_counter()
            copy = _host_copy(state)
            copied = time.perf_counter()
            ckpt_set.save_file(copy, path)
            if i:  # the first pass pays page faults on fresh buffers
                snapshots.append(copied - start)
                writes.append(time.perf_counter() - copied)
            del copy
    finally:
        path.unlink(missing_ok=True)
    return snapshots, writes


def _writer(node) -> ckpt_set.BackgroundWriter:
    if getattr(node, "ckpt_writer", None) is None:
        node.ckpt_writer = ckpt_set.BackgroundWriter()
    return node.ckpt_writer


def _finished(node) -> float | None:
    """Wait for the write in flight; put its duration in its round's trace row; its seconds (None: none in flight)."""
    outcome = _writer(node).wait()
    if outcome is None:
        return None
    row, seconds = outcome
    if row is not None:
        row["ckpt_background_s"] = seconds
    return seconds


def save(node, row: dict | None) -> float:
    """Snapshot the node's state (every process of a sharded node takes part) and, on the
    leader, hand it to the background writer; returns the seconds training was blocked.
    `row` (the leader's trace row of the round) gets the write's seconds once it has finished."""
    if node.plan.round_kind.checkpoints == "cut":
        return _after_pull(node, row)
    start = time.perf_counter()
    if node.is_leader:
        _finished(node)  # one write in flight at a time; raises CheckpointWriteError if it failed
    if not node.is_leader:
        node_state(node)  # its part of the sharded node's gathers; the leader writes
        return time.perf_counter() - start
    parts = snapshot(node)
    block_s = time.perf_counter() - start
    out_dir, index, round_, ident = node.opts.out_dir, node.index, node.rounds_done, identity(node)
    _writer(node).submit(lambda: ckpt_set.write_set(out_dir, index, round_, ident, parts, block_s), row)
    return block_s


def wait_writes(node) -> None:
    """Before the run's outputs (after the round's close: an async or quorum server has served every
    push): the last set is on disk (or its failure raised). An async or quorum node writes its part
    of the cuts after its last pull first (its rounds are done: its state at them is its last snapshot)."""
    if node.is_leader and node.plan.round_kind.checkpoints == "cut" and due_here(node, 0):
        for cut in node.async_cuts.between(node.async_written, node.async_cuts.due[-1]):
            _write_cut(node, cut, node.async_snapshot, None)
    if node.is_leader:
        _finished(node)


def start_afresh(node) -> None:
    """A run without --resume: the node's sets from an earlier run in --out are removed (a later
    --resume must never mix them with this run's), saying so."""
    sets = ckpt_set.set_rounds(node.opts.out_dir, node.index)
    if sets:
        for path in sets.values():
            shutil.rmtree(path, ignore_errors=True)
        print(f"real: {ckpt_set.node_dir(node.opts.out_dir, node.index)}: removed an earlier run's checkpoints "
              f"(rounds {', '.join(map(str, sorted(sets)))}); --resume continues a run instead",
              file=sys.stderr, flush=True)


def restore_node_state(node, state: dict, source: str, manifest: dict | None = None) -> None:
    """Load `state` into the Node; ValueError naming the key when it was made by another plan or settings."""
    check_settings(node, state, source, manifest)
    apply_state(node, state, manifest)


def check_settings(node, state: dict, source: str, manifest: dict | None = None) -> None:
    """ValueError naming the key when `state` was made by another plan, settings or run."""
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
    if manifest is not None and manifest["run_identity"] != identity(node):
        raise ValueError(f"{source}: run_identity: the checkpoints were made by another run "
                         f"({manifest['run_identity']}, this run is {identity(node)}); refusing to resume")


def apply_state(node, state: dict, manifest: dict | None = None) -> None:
    """Load a checked `state` (check_settings) into the Node's model, optimizers, position, RNG and trace."""
    outer = state["outer"]
    node.loaded_digest = weights_digest(outer["global_flat"], outer["momentum"], round_=int(state["rounds_done"]))
    if node.layout is not None:
        node.outer.load_state_dict({key: node.layout.local_slice(value) for key, value in outer.items()})
        node.layout.load_optimizer_state(node.optimizer, state["inner_optimizer"])
    else:
        node.outer.load_state_dict(outer)
        node.optimizer.load_state_dict(state["inner_optimizer"])
    node.outer.load_into_model()
    if node.plan.round_kind.checkpoints == "cut":  # the node's last pull; on node 0 the server as the cut recorded it
        node.round.load_state_dict(state[node.plan.sync])
        if node.round.server is not None:
            node.round.server.load_state_dict(state["server"])
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
    trace = [dict(row) for row in state["trace"]]
    if trace and manifest is not None:  # the set's own round: its times were known only after the snapshot
        trace[-1]["ckpt_block_s"] = float(manifest["ckpt_block_s"])
        trace[-1]["ckpt_background_s"] = float(manifest["ckpt_background_s"])
    node.trace = trace if node.groups.is_leader else []
    node.time_offset_s = max((row["round_end_s"] + row["ckpt_block_s"] for row in trace), default=0.0)


# --- resuming ---------------------------------------------------------------------------------

def verified_sets(out_dir, index: int, report: bool = True) -> dict[int, tuple[Path, dict]]:
    """{round: (directory, manifest)} of the node's sets that verify; each one that does not is
    named with its reason in one line (when `report`)."""
    good = {}
    for round_, directory in sorted(ckpt_set.set_rounds(out_dir, index).items(), reverse=True):
        try:
            good[round_] = (directory, ckpt_set.verify(directory, round_, index))
        except (ValueError, OSError, KeyError, TypeError) as exc:
            if report:
                print(f"real: {directory}: skipped: {exc}", file=sys.stderr, flush=True)
    return good


def latest_state(out_dir, index: int) -> dict:
    """The newest verified set's state of node `index` (for tools and tests); FileNotFoundError if none."""
    good = verified_sets(out_dir, index, report=False)
    if not good:
        raise FileNotFoundError(f"{ckpt_set.node_dir(out_dir, index)}: no checkpoint that verifies")
    return ckpt_set.load_set(good[max(good)][0])


def _common_round(node, mine: dict) -> int | None:
    """The newest round every node holds intact (an all-gather of each node's newest KEEP + 1),
    or None to start from the beginning (no node has saved anything, or one node nothing that
    verifies); ValueError when every node holds sets but they share none. Rank 0 names the nodes
    that lacked a newer round."""
    groups, plan = node.groups, node.plan
    width = ckpt_set.KEEP + 1
    rounds = sorted(mine, reverse=True)[:width]
    everyone = groups.all_gather_ints(rounds + [-1] * (width - len(rounds)))
    per_node = [{r for r in everyone[plan.first_rank(i)] if r >= 0} for i in range(len(plan.nodes))]
    common = set.intersection(*per_node)
    if not common and any(per_node) and not all(per_node):
        # A node has none (its first write was cut short: an interrupt kills the workers while a
        # background write runs): the start of the run, the same on every node, is what they share.
        if node.rank == 0:
            lacking = ", ".join(plan.nodes[i].node for i, s in enumerate(per_node) if not s)
            print(f"real: resuming from the start: node {lacking} has no checkpoint that verifies; skipped "
                  f"round{'s' if len(set().union(*per_node)) > 1 else ''} "
                  f"{', '.join(map(str, sorted(set().union(*per_node))))}", file=sys.stderr, flush=True)
        return None
    if not common:
        if any(per_node):
            raise ValueError(f"{ckpt_set.node_dir(node.opts.out_dir, groups.index).parent}: the nodes' "
                             f"checkpoints share no round that verifies ({[sorted(s) for s in per_node]}); "
                             f"cannot resume")
        return None
    chosen = max(common)
    newer = sorted(r for r in set().union(*per_node) if r > chosen)
    if node.rank == 0 and newer:
        lacking = [f"round {r}: node {', '.join(plan.nodes[i].node for i, s in enumerate(per_node) if r not in s)} "
                   f"has none that verifies" for r in newer]
        print(f"real: resuming from round {chosen}, the newest every node holds intact; skipped {'; '.join(lacking)}",
              file=sys.stderr, flush=True)
    return chosen


def _check_same_state(node, path: Path, round_: int) -> None:
    """Every process must have loaded the same θ_g, outer momentum and round (digests of the
    canonical, gathered form)."""
    groups, plan = node.groups, node.plan
    digests = [d[0] for d in groups.all_gather_ints([node.loaded_digest])]
    leaders = [digests[plan.first_rank(i)] for i in range(len(plan.nodes))]
    if len(set(digests)) != 1:
        odd = [plan.nodes[i].node for i, d in enumerate(leaders) if leaders.count(d) <= len(leaders) // 2]
        raise ValueError(f"{path.parent}: round {round_}: the nodes' checkpoints hold different global "
                         f"weights (node {', '.join(odd) or 'processes of one node'} "
                         f"differ{'s' if len(odd) == 1 else ''}); "
                         f"a checkpoint was altered or mixed from another run; refusing to resume")


def _loaded(node, directory: Path, manifest: dict) -> bool:
    """Load the set into the Node; whether every process of the run did (an all-gather). A set
    that passes its digests but will not load (torch.load refuses it, or a tensor does not fit
    the model) is named in one line and skipped; other settings or another run still refuse."""
    try:
        state = ckpt_set.load_set(directory)
        check_settings(node, state, str(directory), manifest)
    except ValueError:
        raise
    except Exception as exc:
        state = exc
    if not isinstance(state, Exception):
        try:
            apply_state(node, state, manifest)
        except Exception as exc:
            state = exc
    failed = isinstance(state, Exception)
    if failed:
        _skipped(directory, state)
    return not any(flag for (flag,) in node.groups.all_gather_ints([int(failed)]))


def resume(node) -> None:
    """Load the newest round whose sets verify on every node, then check that every node
    loaded the same global weights, outer momentum and round."""
    mine = verified_sets(node.opts.out_dir, node.groups.index, report=node.groups.is_leader)
    legacy = Path(node.opts.out_dir) / "checkpoints" / f"node{node.groups.index}.pt"
    if not mine and legacy.exists():
        raise ValueError(f"{legacy}: a checkpoint of an earlier geodt (one file per node, without digests); "
                         f"this version resumes only checkpoint sets (format {ckpt_set.FORMAT}): rerun the run")
    unloadable = []
    while True:
        round_ = _common_round(node, mine)
        if round_ is None and unloadable:  # a failed load may have changed part of the state
            raise ValueError(f"{unloadable[-1]}: no earlier set that every node holds loads; cannot resume "
                             f"(start afresh in another --out)")
        if round_ is None:
            return  # nothing saved yet: start from the beginning
        directory, manifest = mine[round_]
        if _loaded(node, directory, manifest):
            break
        unloadable.append(directory)
        del mine[round_]  # a process could not load it: every node tries the previous round they share
    if node.plan.round_kind.checkpoints == "cut":
        node.resumed_cut = round_
        _check_cut(node, directory, round_)
    else:
        _check_same_state(node, directory, round_)
    # Every node's offset becomes the latest, so the resumed timeline stays common.
    node.time_offset_s = node.groups.max_float(node.time_offset_s)


def resume_own(node) -> dict | None:
    """--resume under --on-node-loss continue: this node's newest set that verifies and loads, loaded
    with no collective (the members then take the newest round any of them holds, as they enter the
    run's first epoch: real/membership/members.py); its state, or None when it holds none (the node
    starts from the beginning and is brought to that round like a joiner). Another run's or other
    settings' set refuses (ValueError), as `resume` does."""
    mine = verified_sets(node.opts.out_dir, node.index)
    for round_ in sorted(mine, reverse=True):
        directory, manifest = mine[round_]
        try:
            state = ckpt_set.load_set(directory)
        except Exception as exc:
            _skipped(directory, exc)
            continue
        check_settings(node, state, str(directory), manifest)
        try:
            apply_state(node, state, manifest)
            return state
        except Exception as exc:
            _skipped(directory, exc)
    return None


def _skipped(directory: Path, exc: Exception) -> None:
    """Say that a set which passes its digests does not load, and that the previous one is tried."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"real: {directory}: skipped: passes its digests but does not load ({type(exc).__name__}: "
          f"{reason[:200]}); trying the previous set", file=sys.stderr, flush=True)


# --- async and quorum runs: consistent cuts (module docstring; real/rounds/round_async.py, round_quorum.py) ---

def async_cuts(node) -> Cuts:
    """The run's cuts in pushes (an async server's versions, a quorum server's arrivals), those after
    the cut it resumed from: every K·n pushes
    (--checkpoint-every K, else [training] checkpoint_every), --stop-after R's at R·n (where the run
    stops), and with --checkpoint-final the last push's, n·rounds."""
    n, rounds, opts = len(node.plan.nodes), node.spec.rounds, node.opts
    stop = min(opts.stop_after, rounds) * n if opts.stop_after is not None else None
    last = stop if stop is not None else rounds * n
    due = set()
    if opts.checkpoint:
        every = opts.checkpoint_every or node.spec.checkpoint_every
        if every:
            due.update(range(every * n, last + 1, every * n))
        if stop is not None or opts.checkpoint_final:
            due.add(last)
    resumed = getattr(node, "resumed_cut", 0)
    return Cuts(tuple(sorted(v for v in due if v > resumed)), stop, resumed)


def begin(node) -> None:
    """After resuming or starting afresh, before the first round: an async or quorum run's cuts go
    to its round (and server), and each leader takes its first snapshot (its state at its last pull:
    the start, or the resumed one). Nothing for other runs."""
    if node.plan.round_kind.checkpoints != "cut":
        return
    node.async_cuts = async_cuts(node)
    node.round.set_cuts(node.async_cuts)
    node.async_written = node.async_cuts.resumed  # the newest cut this node has written its part of
    node.async_snapshot = _async_snapshot(node) if node.is_leader and due_here(node, 0) else None


def stopped(node) -> bool:
    """Whether the node does no more rounds: an async or quorum run past its stop cut (others stop at `last`)."""
    return node.plan.round_kind.checkpoints == "cut" and node.round.stopped()


def _async_snapshot(node) -> tuple[dict, float]:
    """The node's state now (right after a pull) in host memory, and the seconds the copy took."""
    start = time.perf_counter()
    parts = snapshot(node)
    return parts, time.perf_counter() - start


def _after_pull(node, row: dict | None) -> float:
    """An async or quorum leader after its pull: its part of each due cut passed since its last pull
    (the snapshot held then; a cut at this very pull: the new one), and the new snapshot. Returns the
    seconds training was blocked (the copy, and waits for the previous write)."""
    start = time.perf_counter()
    held = node.async_snapshot
    node.async_snapshot = _async_snapshot(node)
    if node.round.marks_cuts:
        # A reply marked m is in cut m, which may not be taken yet (a close on the grace timer comes
        # before the arrival that takes it): it is written at the next pull or at the end; the
        # cuts before m have the previous pull as this node's last.
        for cut in node.async_cuts.between(node.async_written, node.round.mark - 1):
            _write_cut(node, cut, held, row)
        return time.perf_counter() - start
    version = node.round.pulled_version
    for cut in node.async_cuts.between(node.async_written, version):
        _write_cut(node, cut, node.async_snapshot if cut == version else held, row)
    return time.perf_counter() - start


def _write_cut(node, cut: int, held: tuple[dict, float], row: dict | None) -> None:
    """Hand the node's part of `cut` (on node 0 with the server's state at it) to the background writer."""
    parts, block_s = held
    server = node.round.server
    if server is not None:
        parts = {**parts, "node.pt": {**parts["node.pt"], "server": server.take_recorded(cut)}}
    out_dir, index, ident, floor = node.opts.out_dir, node.index, identity(node), node.round.complete
    _finished(node)  # one write in flight at a time; raises CheckpointWriteError if it failed
    _writer(node).submit(lambda: ckpt_set.write_set(out_dir, index, cut, ident, parts, block_s, floor), row)
    node.async_written = cut


def _check_cut(node, path: Path, cut: int) -> None:
    """The loaded parts are one cut: the server's cut is this one (an async server's version), and
    its record of each node's last pull (the closes a quorum node pulled) and pushes is what that
    node loaded (an all-gather; rank 0 hosts the server)."""
    plan, server, n = node.plan, node.round.server, len(node.plan.nodes)
    if isinstance(server, QuorumServer):
        view = [server.cut, *server.pulled, *server.arrived]
    else:
        view = [server.version, *server.pulled, *server.pushes] if server is not None else [-1] * (1 + 2 * n)
    everyone = node.groups.all_gather_ints([node.round.pulled_version, node.rounds_done, *view])
    version, pulled, pushes = everyone[0][2], everyone[0][3:3 + n], everyone[0][3 + n:]
    odd = [plan.nodes[i].node for i in range(n) if everyone[plan.first_rank(i)][:2] != [pulled[i], pushes[i]]]
    if version != cut or odd:
        who = f"node {', '.join(odd)} holds another state than the server's record of it" if odd else \
            f"the server's state is at version {version}"
        raise ValueError(f"{path.parent}: cut {cut}: {who}; a checkpoint was altered or mixed from another run; "
                         f"refusing to resume")
