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

A node's `Checkpointer`, which real/process/worker.py's Node owns, does all of this on the node's
`NodeState` (real/rounds/state.py: its state_dict is what a set holds), never on the Node; its
bookkeeping is its own: the cadence chosen, the background writer, an async or quorum run's cuts.
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
from real.rounds.state import NodeState

__all__ = [
    "CheckpointWriteError",
    "Checkpointer",
    "async_cuts",
    "due",
    "latest_state",
    "set_bytes",
    "snapshot",
    "verified_sets",
    "weights_digest",
]


def due(rounds_done: int, every: int, last: int, final: bool = False) -> bool:
    """Whether the set after `rounds_done` rounds is written: every `every`, and the run's last when `final`."""
    return rounds_done % every == 0 or (final and rounds_done == last)


PROBE_PARAMS = 1 << 22  # the timed stand-in's parameters: 64 MiB of state, whatever the model's size


def probe_cost_s(state: NodeState) -> float:
    """About the seconds one of the node's checkpoints costs (snapshot + write), timed on a
    stand-in of at most PROBE_PARAMS parameters (`time_checkpoint`, in the node's checkpoint
    folder) and scaled by bytes: the model's own state is not copied, so the timing takes no
    more memory than the stand-in's."""
    params = state.layout.full_numel if state.layout is not None else state.outer.global_flat.numel()
    probe = min(params, PROBE_PARAMS)
    folder = ckpt_set.node_dir(state.opts.out_dir, state.index)
    folder.mkdir(parents=True, exist_ok=True)
    snapshots, writes = time_checkpoint(probe, 1, state.device, folder)
    return (snapshots[0] + writes[0]) * set_bytes(params, state.kind.supports("fragments")) / set_bytes(probe, False)


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


def identity(state: NodeState) -> str:
    nodes = [(n.node, n.gpus, n.batch_size, n.local_steps) for n in state.plan.nodes]
    return ckpt_set.run_identity(state.config, nodes)


# --- a node's state ---------------------------------------------------------------------------

def _host_copy(value):
    """A deep copy of `value` whose tensors are fresh CPU tensors (training goes on changing the originals)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item) for item in value)
    return value


def snapshot(state: NodeState) -> dict[str, dict]:
    """The set's parts in host memory: {"global.pt": {...}, "node.pt": {...}} (node.pt: the node's
    state_dict but its outer state, after the format; a sharded node's gathered: a collective)."""
    saved = _host_copy({"format": ckpt_set.FORMAT, **state.state_dict()})
    outer = saved.pop("outer")
    return {"global.pt": {"format": ckpt_set.FORMAT, "rounds_done": state.rounds_done, "outer": outer},
            "node.pt": saved}


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


def check_settings(state: NodeState, saved: dict, source: str, manifest: dict | None = None) -> None:
    """ValueError naming the key when `saved` was made by another plan, settings or run."""
    for key, mine in (("nodes", len(state.plan.nodes)), ("node", state.me.node), ("gpus", state.me.gpus),
                      ("local_steps", state.me.local_steps), ("batch_size", state.batch)):
        if saved[key] != mine:
            raise ValueError(f"{source}: {key}: checkpoint has {saved[key]!r}, this run has {mine!r}; "
                             f"resume with the same plan")
    config = saved["run_config"]
    for key, mine in state.config.items():
        if config.get(key) != mine:
            raise ValueError(f"{source}: {key}: the checkpoints were made with {config.get(key)!r}, this run "
                             f"has {mine!r}; resume with the same settings (or start afresh in another --out)")
    if manifest is not None and manifest["run_identity"] != identity(state):
        raise ValueError(f"{source}: run_identity: the checkpoints were made by another run "
                         f"({manifest['run_identity']}, this run is {identity(state)}); refusing to resume")


def with_set_times(saved: dict, manifest: dict | None) -> dict:
    """`saved` with its own round's checkpoint times in the trace's last row: they were known only after
    the snapshot (the set's manifest holds them)."""
    trace = [dict(row) for row in saved["trace"]]
    if trace and manifest is not None:
        trace[-1]["ckpt_block_s"] = float(manifest["ckpt_block_s"])
        trace[-1]["ckpt_background_s"] = float(manifest["ckpt_background_s"])
    return {**saved, "trace": trace}


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


def _common_round(state: NodeState, mine: dict) -> int | None:
    """The newest round every node holds intact (an all-gather of each node's newest KEEP + 1),
    or None to start from the beginning (no node has saved anything, or one node nothing that
    verifies); ValueError when every node holds sets but they share none. Rank 0 names the nodes
    that lacked a newer round."""
    groups, plan = state.groups, state.plan
    width = ckpt_set.KEEP + 1
    rounds = sorted(mine, reverse=True)[:width]
    everyone = groups.all_gather_ints(rounds + [-1] * (width - len(rounds)))
    per_node = [{r for r in everyone[plan.first_rank(i)] if r >= 0} for i in range(len(plan.nodes))]
    common = set.intersection(*per_node)
    if not common and any(per_node) and not all(per_node):
        # A node has none (its first write was cut short: an interrupt kills the workers while a
        # background write runs): the start of the run, the same on every node, is what they share.
        if state.rank == 0:
            lacking = ", ".join(plan.nodes[i].node for i, s in enumerate(per_node) if not s)
            print(f"real: resuming from the start: node {lacking} has no checkpoint that verifies; skipped "
                  f"round{'s' if len(set().union(*per_node)) > 1 else ''} "
                  f"{', '.join(map(str, sorted(set().union(*per_node))))}", file=sys.stderr, flush=True)
        return None
    if not common:
        if any(per_node):
            raise ValueError(f"{ckpt_set.node_dir(state.opts.out_dir, groups.index).parent}: the nodes' "
                             f"checkpoints share no round that verifies ({[sorted(s) for s in per_node]}); "
                             f"cannot resume")
        return None
    chosen = max(common)
    newer = sorted(r for r in set().union(*per_node) if r > chosen)
    if state.rank == 0 and newer:
        lacking = [f"round {r}: node {', '.join(plan.nodes[i].node for i, s in enumerate(per_node) if r not in s)} "
                   f"has none that verifies" for r in newer]
        print(f"real: resuming from round {chosen}, the newest every node holds intact; skipped {'; '.join(lacking)}",
              file=sys.stderr, flush=True)
    return chosen


def _check_same_state(state: NodeState, digest: int, path: Path, round_: int) -> None:
    """Every process must have loaded the same θ_g, outer momentum and round (`digest`: this process's,
    of the canonical, gathered form)."""
    groups, plan = state.groups, state.plan
    digests = [d[0] for d in groups.all_gather_ints([digest])]
    leaders = [digests[plan.first_rank(i)] for i in range(len(plan.nodes))]
    if len(set(digests)) != 1:
        odd = [plan.nodes[i].node for i, d in enumerate(leaders) if leaders.count(d) <= len(leaders) // 2]
        raise ValueError(f"{path.parent}: round {round_}: the nodes' checkpoints hold different global "
                         f"weights (node {', '.join(odd) or 'processes of one node'} "
                         f"differ{'s' if len(odd) == 1 else ''}); "
                         f"a checkpoint was altered or mixed from another run; refusing to resume")


REFUSED = 2  # _loaded's all-gathered flag: 0 loaded, 1 did not load (skipped), 2 refused (other settings or run)


def _skipped(directory: Path, exc: Exception) -> None:
    """Say that a set which passes its digests does not load, and that the previous one is tried."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"real: {directory}: skipped: passes its digests but does not load ({type(exc).__name__}: "
          f"{reason[:200]}); trying the previous set", file=sys.stderr, flush=True)


# --- async and quorum runs: consistent cuts (module docstring; real/rounds/round_async.py, round_quorum.py) ---

def async_cuts(state: NodeState, resumed: int = 0) -> Cuts:
    """The run's cuts in pushes (an async server's versions, a quorum server's arrivals), those after
    the cut it resumed from (`resumed`): every K·n pushes
    (--checkpoint-every K, else [training] checkpoint_every), --stop-after R's at R·n (where the run
    stops), and with --checkpoint-final the last push's, n·rounds."""
    n, rounds, opts = len(state.plan.nodes), state.plan.rounds, state.opts
    stop = min(opts.stop_after, rounds) * n if opts.stop_after is not None else None
    last = stop if stop is not None else rounds * n
    due = set()
    if opts.checkpoint:
        every = state.spec.training.checkpoint_every
        if every:
            due.update(range(every * n, last + 1, every * n))
        if stop is not None or opts.checkpoint_final:
            due.add(last)
    return Cuts(tuple(sorted(v for v in due if v > resumed)), stop, resumed)


def _check_cut(state: NodeState, path: Path, cut: int) -> None:
    """The loaded parts are one cut: the server's cut is this one (an async server's version), and
    its record of each node's last pull (the closes a quorum node pulled) and pushes is what that
    node loaded (an all-gather; rank 0 hosts the server)."""
    plan, server, n = state.plan, state.round.server, len(state.plan.nodes)
    if isinstance(server, QuorumServer):
        view = [server.cut, *server.pulled, *server.arrived]
    else:
        view = [server.version, *server.pulled, *server.pushes] if server is not None else [-1] * (1 + 2 * n)
    everyone = state.groups.all_gather_ints([state.round.pulled_version, state.rounds_done, *view])
    version, pulled, pushes = everyone[0][2], everyone[0][3:3 + n], everyone[0][3 + n:]
    odd = [plan.nodes[i].node for i in range(n) if everyone[plan.first_rank(i)][:2] != [pulled[i], pushes[i]]]
    if version != cut or odd:
        who = f"node {', '.join(odd)} holds another state than the server's record of it" if odd else \
            f"the server's state is at version {version}"
        raise ValueError(f"{path.parent}: cut {cut}: {who}; a checkpoint was altered or mixed from another run; "
                         f"refusing to resume")


# --- the node's checkpointer --------------------------------------------------------------------

class Checkpointer:
    """A node's checkpoints (module doc), owned by real/process/worker.py's Node: when a set is due,
    its snapshot and background write, a resume, an async or quorum run's cuts; all on the node's
    `state`, its own bookkeeping kept here."""

    def __init__(self, state: NodeState):
        self.state = state
        self.writer: ckpt_set.BackgroundWriter | None = None  # made at the first write
        # the Young/Daly cadence (`due_here`): the first round this process ran, perf_counter at its
        # end, and the rounds between sets once chosen
        self.first: int | None = None
        self.mark = 0.0
        self.every: int | None = None
        # an async or quorum run (`begin`): its cuts, the newest this node wrote its part of, the
        # snapshot at its last pull (with the seconds its copy took), the cut it resumed from
        self.cuts: Cuts | None = None
        self.written = 0
        self.held: tuple[dict, float] | None = None
        self.resumed_cut = 0

    # --- the cadence ----------------------------------------------------------------------
    def due_here(self, last: int) -> bool:
        """Whether this round (state.rounds_done rounds done) ends in a checkpoint. Called by every
        process of the run after every round (the cadence's choice is a collective). Every
        --checkpoint-every K, else [training] checkpoint_every K rounds; neither given, a checkpoint
        is timed in the background during the first round (`probe_cost_s`) and the next round
        chooses the Young/Daly interval. The run's
        last round ends in one only when asked (--checkpoint-final) or when it stops early
        (--stop-after), so that --resume continues it. An async or quorum run: every round (a snapshot
        at each pull, `_after_pull`) while a cut is still due for this node."""
        state = self.state
        opts = state.opts
        if state.plan.round_kind.checkpoints == "cut":
            cuts = self.cuts.due
            return bool(cuts) and cuts[-1] > self.written
        if not opts.checkpoint:
            return False
        final = opts.checkpoint_final or opts.stop_after is not None
        k = state.spec.training.checkpoint_every
        if k:
            return due(state.rounds_done, k, last, final)
        if self.first is None:  # the first round of this process: a checkpoint's cost is timed beside the next
            self.first, self.mark = state.rounds_done, time.perf_counter()
            if state.is_leader and state.rounds_done < last:
                self._writer().submit(lambda: probe_cost_s(state), None)
            return final and state.rounds_done == last
        if self.every is None:
            self._choose_every(time.perf_counter() - self.mark)
        return due(state.rounds_done - self.first, self.every, last - self.first, final)

    def _choose_every(self, round_s: float) -> int:
        """The Young/Daly cadence in rounds, the same on every process: a checkpoint's cost
        (`probe_cost_s`: its blocking snapshot plus its write, which on a CPU node takes the cores
        training uses) and the round's seconds, the largest over the processes, and [simulation] mtbf_s."""
        state = self.state
        cost_s = (self._finished() or 0.0) if state.is_leader else 0.0  # probe_cost_s's
        # Under --on-node-loss continue each node chooses alone: its sets need not share rounds (the
        # members agree on the newest at a resume), and a joiner times its own first round later than
        # the members, so a collective here would pair with none. A node's processes agree (a sharded
        # node's all take part in each set).
        if state.opts.on_node_loss != "continue":
            cost_s, round_s = state.groups.max_float(cost_s), state.groups.max_float(round_s)
        else:
            cost_s, round_s = (state.groups.node_max(round(value * 1e9)) / 1e9 for value in (cost_s, round_s))
        self.every = rounds_between_checkpoints(cost_s, state.spec.simulation.mtbf_s, round_s)
        if state.rank == 0:
            print(f"real: a checkpoint every {self.every} round{'s' if self.every > 1 else ''} (Young/Daly: "
                  f"{cost_s:.2f} s a checkpoint, {round_s:.2f} s a round, MTBF {state.spec.simulation.mtbf_s:g} s; "
                  f"--checkpoint-every sets it)", file=sys.stderr, flush=True)
        return self.every

    # --- saving ---------------------------------------------------------------------------
    def _writer(self) -> ckpt_set.BackgroundWriter:
        if self.writer is None:
            self.writer = ckpt_set.BackgroundWriter()
        return self.writer

    def _finished(self) -> float | None:
        """Wait for the write in flight; put its duration in its round's trace row; its seconds (None:
        none in flight)."""
        outcome = self._writer().wait()
        if outcome is None:
            return None
        row, seconds = outcome
        if row is not None:
            row["ckpt_background_s"] = seconds
        return seconds

    def save(self, row: dict | None) -> float:
        """Snapshot the node's state (every process of a sharded node takes part) and, on the
        leader, hand it to the background writer; returns the seconds training was blocked.
        `row` (the leader's trace row of the round) gets the write's seconds once it has finished."""
        state = self.state
        if state.plan.round_kind.checkpoints == "cut":
            return self._after_pull(row)
        start = time.perf_counter()
        if state.is_leader:
            self._finished()  # one write in flight at a time; raises CheckpointWriteError if it failed
        if not state.is_leader:
            state.state_dict()  # its part of the sharded node's gathers; the leader writes
            return time.perf_counter() - start
        parts = snapshot(state)
        block_s = time.perf_counter() - start
        out_dir, index, round_, ident = state.opts.out_dir, state.index, state.rounds_done, identity(state)
        self._writer().submit(lambda: ckpt_set.write_set(out_dir, index, round_, ident, parts, block_s), row)
        return block_s

    def wait_writes(self) -> None:
        """Before the run's outputs (after the round's close: an async or quorum server has served every
        push): the last set is on disk (or its failure raised). An async or quorum node writes its part
        of the cuts after its last pull first (its rounds are done: its state at them is its last snapshot)."""
        state = self.state
        if state.is_leader and state.plan.round_kind.checkpoints == "cut" and self.due_here(0):
            for cut in self.cuts.between(self.written, self.cuts.due[-1]):
                self._write_cut(cut, self.held, None)
        if state.is_leader:
            self._finished()

    def start_afresh(self) -> None:
        """A run without --resume: the node's sets from an earlier run in --out are removed (a later
        --resume must never mix them with this run's), saying so."""
        out_dir, index = self.state.opts.out_dir, self.state.index
        sets = ckpt_set.set_rounds(out_dir, index)
        if sets:
            for path in sets.values():
                shutil.rmtree(path, ignore_errors=True)
            print(f"real: {ckpt_set.node_dir(out_dir, index)}: removed an earlier run's checkpoints "
                  f"(rounds {', '.join(map(str, sorted(sets)))}); --resume continues a run instead",
                  file=sys.stderr, flush=True)

    # --- resuming -------------------------------------------------------------------------
    def load(self, saved: dict, manifest: dict | None = None) -> int:
        """Load a checked set's state (check_settings) into the node (NodeState.load_state_dict, the set's
        own times in its trace); the digest of the global weights, momentum and round it held."""
        outer = saved["outer"]
        digest = weights_digest(outer["global_flat"], outer["momentum"], round_=int(saved["rounds_done"]))
        self.state.load_state_dict(with_set_times(saved, manifest))
        return digest

    def _loaded(self, directory: Path, manifest: dict) -> int | None:
        """Load the set into the node; its digest (`load`) when every process of the run did (an
        all-gather), else None. A set that passes its digests but will not load (torch.load refuses
        it, or a tensor does not fit the model) is named in one line and skipped; other settings or
        another run refuse, on every process at once: the refusal travels in the same all-gather, so a
        peer (on another machine, under torchrun) stops now instead of at its collective timeout."""
        refusal = None
        try:
            saved = ckpt_set.load_set(directory)
            check_settings(self.state, saved, str(directory), manifest)
        except ValueError as exc:
            saved = refusal = exc
        except Exception as exc:
            saved = exc
        digest = None
        if not isinstance(saved, Exception):
            try:
                digest = self.load(saved, manifest)
            except Exception as exc:
                saved = exc
        failed = isinstance(saved, Exception) and refusal is None
        if failed:
            _skipped(directory, saved)
        flags = [flag for (flag,) in self.state.groups.all_gather_ints([REFUSED if refusal else int(failed)])]
        if refusal is not None:
            raise refusal
        refused = self._named(flags)
        if refused:
            raise ValueError(f"{directory}: node {', '.join(refused)} refused to resume from its set (its own "
                             "line says why); refusing with it")
        return digest if not any(flags) else None

    def _named(self, flags: list[int]) -> list[str]:
        """The nodes whose processes' all-gathered flag is REFUSED."""
        plan = self.state.plan
        return sorted({plan.nodes[plan.node_of_rank(r)].node for r, flag in enumerate(flags) if flag == REFUSED})

    def resume(self) -> None:
        """Load the newest round whose sets verify on every node, then check that every node
        loaded the same global weights, outer momentum and round."""
        state = self.state
        mine = verified_sets(state.opts.out_dir, state.groups.index, report=state.groups.is_leader)
        legacy = Path(state.opts.out_dir) / "checkpoints" / f"node{state.groups.index}.pt"
        old = not mine and legacy.exists()
        # every process learns at once (as _loaded's refusals): a peer would otherwise wait at its timeout
        holders = self._named([flag for (flag,) in state.groups.all_gather_ints([REFUSED if old else 0])])
        if old:
            raise ValueError(f"{legacy}: a checkpoint of an earlier geodt (one file per node, without digests); "
                             f"this version resumes only checkpoint sets (format {ckpt_set.FORMAT}): rerun the run")
        if holders:
            raise ValueError(f"{state.opts.out_dir}: node {', '.join(holders)} holds a checkpoint of an earlier "
                             "geodt (its own line says which); refusing with it")
        unloadable = []
        while True:
            round_ = _common_round(state, mine)
            if round_ is None and unloadable:  # a failed load may have changed part of the state
                raise ValueError(f"{unloadable[-1]}: no earlier set that every node holds loads; cannot resume "
                                 f"(start afresh in another --out)")
            if round_ is None:
                return  # nothing saved yet: start from the beginning
            directory, manifest = mine[round_]
            digest = self._loaded(directory, manifest)
            if digest is not None:
                break
            unloadable.append(directory)
            del mine[round_]  # a process could not load it: every node tries the previous round they share
        if state.plan.round_kind.checkpoints == "cut":
            self.resumed_cut = round_
            _check_cut(state, directory, round_)
        else:
            _check_same_state(state, digest, directory, round_)
        # Every node's offset becomes the latest, so the resumed timeline stays common.
        state.time_offset_s = state.groups.max_float(state.time_offset_s)

    def resume_own(self) -> dict | None:
        """--resume under --on-node-loss continue: this node's newest set that verifies and loads, loaded
        with no collective (the members then take the newest round any of them holds, as they enter the
        run's first epoch: real/membership/members.py); its state, or None when it holds none (the node
        starts from the beginning and is brought to that round like a joiner). Another run's or other
        settings' set refuses (ValueError), as `resume` does."""
        mine = verified_sets(self.state.opts.out_dir, self.state.index)
        for round_ in sorted(mine, reverse=True):
            directory, manifest = mine[round_]
            try:
                saved = ckpt_set.load_set(directory)
            except Exception as exc:
                _skipped(directory, exc)
                continue
            check_settings(self.state, saved, str(directory), manifest)
            try:
                self.load(saved, manifest)
                return saved
            except Exception as exc:
                _skipped(directory, exc)
        return None

    # --- async and quorum runs: consistent cuts -------------------------------------------
    def begin(self) -> None:
        """After resuming or starting afresh, before the first round: an async or quorum run's cuts go
        to its round (and server), and each leader takes its first snapshot (its state at its last pull:
        the start, or the resumed one). Nothing for other runs."""
        state = self.state
        if state.plan.round_kind.checkpoints != "cut":
            return
        self.cuts = async_cuts(state, self.resumed_cut)
        state.round.set_cuts(self.cuts)
        self.written = self.cuts.resumed  # the newest cut this node has written its part of
        self.held = self._async_snapshot() if state.is_leader and self.due_here(0) else None

    def stopped(self) -> bool:
        """Whether the node does no more rounds: an async or quorum run past its stop cut (others stop at `last`)."""
        return self.state.plan.round_kind.checkpoints == "cut" and self.state.round.stopped()

    def _async_snapshot(self) -> tuple[dict, float]:
        """The node's state now (right after a pull) in host memory, and the seconds the copy took."""
        start = time.perf_counter()
        parts = snapshot(self.state)
        return parts, time.perf_counter() - start

    def _after_pull(self, row: dict | None) -> float:
        """An async or quorum leader after its pull: its part of each due cut passed since its last pull
        (the snapshot held then; a cut at this very pull: the new one), and the new snapshot. Returns the
        seconds training was blocked (the copy, and waits for the previous write)."""
        start = time.perf_counter()
        held = self.held
        self.held = self._async_snapshot()
        if self.state.round.marks_cuts:
            # A reply marked m is in cut m, which may not be taken yet (a close on the grace timer comes
            # before the arrival that takes it): it is written at the next pull or at the end; the
            # cuts before m have the previous pull as this node's last.
            for cut in self.cuts.between(self.written, self.state.round.mark - 1):
                self._write_cut(cut, held, row)
            return time.perf_counter() - start
        version = self.state.round.pulled_version
        for cut in self.cuts.between(self.written, version):
            self._write_cut(cut, self.held if cut == version else held, row)
        return time.perf_counter() - start

    def _write_cut(self, cut: int, held: tuple[dict, float], row: dict | None) -> None:
        """Hand the node's part of `cut` (on node 0 with the server's state at it) to the background writer."""
        state = self.state
        parts, block_s = held
        server = state.round.server
        if server is not None:
            parts = {**parts, "node.pt": {**parts["node.pt"], "server": server.take_recorded(cut)}}
        out_dir, index, ident, floor = state.opts.out_dir, state.index, identity(state), state.round.complete
        self._finished()  # one write in flight at a time; raises CheckpointWriteError if it failed
        self._writer().submit(lambda: ckpt_set.write_set(out_dir, index, cut, ident, parts, block_s, floor), row)
        self.written = cut
