"""Who is in the run: the policy the one round loop (real/process/worker.py `Node.run`) consults to start,
to run each round, to look for joiners after it, and to finish.

`Fixed` (--on-node-loss stop): the plan's nodes throughout, in one run-wide process group; a lost
peer ends the process (PeerLost, real/process/process.py) and the run is resumed from its checkpoints.

`Elastic` (--on-node-loss continue): the members move through epochs (real/membership/membership.py: each a
fresh run-wide gloo group over the members, allocated by the launcher when a member dies and by
the first member when nodes ask to join). Entering an epoch, the node rebuilds what depends on the
group (`Node.bind`: real/core/groups.py over the members, a sharded node's model sharded again over
its node's new group, the averaging weights and cross-node average over them, the round of the plan's
kind) and the members agree on the state: every member's completed rounds (all-reduce MAX), then θ_g
and the outer momentum (with an adaptive plan's estimates; with sync-ddp, whose replicas are one
model, the inner optimizer's state too) from the first member holding the most, through the leaders
(`share_state`). Every kind of round, collective and payload runs in it unchanged.

A round that fails (a member died) is finished among the survivors:
- a member behind (its sync failed while another's completed) takes the state: its pseudo-
  gradient was in that average, so the round is its too (its trace row ends when it learns so);
- a member at the latest round retries what failed. A DiLoCo round keeps its inner steps and
  syncs again (`Round.retry_sync`): only the lost node's round is lost. Kinds whose syncs run
  between the inner steps (Streaming DiLoCo's fragments, sync-ddp's gradients) cannot resume
  mid-round: the node restores the state it held at the round's start (kept in host memory each
  round, as a checkpoint's snapshot) and runs the round again with the survivors.
A joiner (a lost node's restarted process, or all of a node's G processes: a node leaves and joins
as one, real/membership/membership.py) takes θ_g, the momentum and the round, sets its
learning-rate schedule and data position to where they would be, and trains on with fresh inner
AdamW state (with sync-ddp, the source's). After every round the members learn, in one all-reduce
MAX of a flag per node, whether a node asked to join (geodt/join/<i>); if so the first member opens
the next epoch with it and all enter it. Each round's trace row (and a streaming round's fragment
rows) goes into the store at once, so rows of a node that died are still written; the first member
writes the outputs from them, and every member leaves the digest of its final global weights for
the launcher's check (real/process/respawn.py).

Checkpoints: each node writes its own sets, as under stop. `--resume` loads each node's own newest
(real/checkpoint/checkpoint.py Checkpointer.resume_own, no collective) and the members take the newest round any
of them holds as they enter the first epoch; a node whose set is older (it was away when the run
stopped) comes back as a joiner does.

A policy works on the node's state (real/rounds/state.py NodeState) and its checkpointer, never on the
worker's Node; what only the worker can do (build the parts and the round for a process group, leave
it, gather the final weights, write a fixed run's outputs) it asks through `WorkerHooks`.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from formats.plan import Plan
from real.checkpoint.checkpoint import Checkpointer, save_whole, snapshot
from real.core.groups import Groups
from real.core.options import ExecOptions, PeerLost, run_collective
from real.core.streaming import SYNC_NUMERIC, write_syncs
from real.membership.inject import Faults
from real.membership.membership import (
    agree,
    ask_to_join,
    enter_next_epoch,
    join_requests,
    leave,
    open_next_epoch,
    wait_for_admission,
)
from real.rounds.rounds import Origin, round_row
from real.rounds.state import NodeState
from real.rounds.trace import NUMERIC_COLUMNS, membership_lines, run_columns, summary, write_trace

ROW_KEYS = [*NUMERIC_COLUMNS, "members"]  # a trace row in the store (json)


@dataclass(frozen=True)
class WorkerHooks:
    """What a policy asks of the worker (real/process/worker.py Node), which alone builds a node's parts
    and round: work in a run-wide group (`bind`, Node.bind) and leave it (`unbind`, Node.unbind), the
    final weights (a collective of a sharded node's processes), a fixed run's outputs (`finish`)."""

    bind: Callable[[Groups], None]
    unbind: Callable[[], None]
    final_weights: Callable[[], dict[str, torch.Tensor]]
    finish: Callable[[], None]


class Fixed:
    """--on-node-loss stop: the plan's nodes throughout (the module doc)."""

    def __init__(self, state: NodeState, ckpt: Checkpointer, hooks: WorkerHooks):
        self.state, self.ckpt, self.hooks = state, ckpt, hooks
        self.joining = False

    def prepare(self) -> None:
        """Before the first round: --resume loads the newest round every node holds intact; else the
        sets an earlier run left in --out go."""
        if self.state.opts.resume:
            self.ckpt.resume()
        elif self.state.groups.is_leader:
            self.ckpt.start_afresh()

    def start(self) -> Origin:
        self.state.groups.barrier()
        return Origin(time.perf_counter(), self.state.time_offset_s)

    def run_round(self, r: int, origin: Origin, bar) -> dict:
        return self.state.round.run(r, origin, bar)

    def after_round(self, r: int, row: dict) -> None:
        pass

    def finish(self) -> None:
        self.hooks.finish()


class Elastic:
    """--on-node-loss continue: rounds whose membership changes while the run goes on (the module doc)."""

    def __init__(self, state: NodeState, ckpt: Checkpointer, hooks: WorkerHooks, store, joining: bool):
        self.state, self.ckpt, self.hooks = state, ckpt, hooks
        self.store, self.joining = store, joining
        self.n, self.timeout_s = len(state.plan.nodes), state.opts.collective_timeout_s()
        self.epoch = None
        self.in_flight: int | None = None  # the round that failed, while the node recovers
        self.snapshot: dict | None = None  # the state at the running round's start (kinds without retry_sync)
        # an injected outage of this node (ExecOptions.outage): (round it is lost at, round it rejoins at)
        self.outage = next(((r, r + k) for i, r, k in state.opts.outage or () if i == state.index), None)
        self.faults = Faults(state.me.node, joining)

    # --- the run -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Before the first epoch: --resume loads this node's own newest set, with no collective (the
        members take the newest round any of them holds as they enter the epoch: _enter); else the sets
        an earlier run left in --out go. A joiner keeps the sets its lost process wrote in this run."""
        state = self.state
        if self.joining:
            return
        if not state.opts.resume:
            if state.groups.is_leader:
                self.ckpt.start_afresh()
            return
        self.ckpt.resume_own()  # a round's own state is held for the round built at bind (NodeState.take_round_state)

    def start(self) -> Origin:
        """Enter the first epoch (0, or the one a joiner is admitted to); the run's time axis (a
        resumed run's continues from the newest set's, agreed in _enter)."""
        state = self.state
        if not self.joining:
            self._enter_first(0)
            self._post_rows()  # a resumed run's rows so far: the outputs are written from the store
            t0 = time.perf_counter()
            if self._coordinates():  # node 0 may be the one lost before round 0
                self.store.set("geodt/t0", repr(time.time() - state.time_offset_s))
            return Origin(t0, state.time_offset_s)
        ready = time.time()
        ask_to_join(self.store, state.index, self.outage[1] if self.outage else 0, state.me.gpus)
        self.faults.at("asked")
        number = wait_for_admission(self.store, state.index, self.timeout_s)
        self.faults.at("admitted")
        self._enter_first(number)
        if state.is_leader:  # its lost process's rows, so that the sets it writes hold the node's whole trace
            state.trace = stored_rows(self.store, state.index, state.rounds_done)
            if state.kind.supports("fragments"):  # and its fragment rows (syncs.csv)
                state.round.rows = stored_syncs(self.store, state, state.rounds_done)
        return rejoined(self.store, state.index, f"node {state.me.node} (rank {state.rank})", state.rounds_done,
                        ready, say=state.is_leader)

    def run_round(self, r: int, origin: Origin, bar) -> dict:
        """Round r, finished among the survivors should a member be lost (the module doc); its row names
        the members it ended with (before a checkpoint takes the row)."""
        row = self._run_round(r, origin, bar)
        row["members"] = "+".join(self.state.plan.nodes[i].node for i in self.epoch.members)
        return row

    def _run_round(self, r: int, origin: Origin, bar) -> dict:
        state = self.state
        if self.outage is not None and not self.joining and r == self.outage[0]:
            os.kill(os.getpid(), signal.SIGKILL)  # the injected loss: a real one, at the round's start
        self.faults.at("round", r)
        self.snapshot = None if state.round.retries_sync else snapshot(state)
        retry = False
        while True:
            try:
                if retry and state.round.retries_sync:
                    return state.round.retry_sync(r, origin)
                return state.round.run(r, origin, bar)
            except PeerLost as exc:
                lost = PeerLost(str(exc))  # not the exception itself: its frames hold the epoch's group
            failed_at = time.perf_counter()
            progress = state.round.progress
            self.in_flight = r
            self._recover(lost)
            self.in_flight = None
            if state.rounds_done > r:  # completed elsewhere: this node's row ends now
                return lost_round_row(state, r, origin, progress, failed_at)
            retry = True

    def after_round(self, r: int, row: dict) -> None:
        """The round's rows into the store; then whether a node asked to join (and if so, admit it)."""
        self._post_rows([row])
        lost = None
        try:
            asked = join_requests(self.store, self.n, self.epoch.members, r)
            run_collective(self.epoch.all_reduce, asked, torch.distributed.ReduceOp.MAX)
        except PeerLost as exc:
            lost = PeerLost(str(exc))  # recovered from outside this block (run_round says why)
        if lost is None and asked.any():
            if self._coordinates():
                open_next_epoch(self.store, self.epoch.members,
                                [i for i in range(self.n) if asked[i] > 0 and i not in self.epoch.members])
            self.hooks.unbind()
            try:
                self._enter(self.epoch.number + 1)
            except PeerLost as exc:
                lost = PeerLost(str(exc))
        if lost is not None:
            self._recover(lost)

    def finish(self) -> None:
        """Every member leaves its weights' digest; the first writes the outputs (write_outputs). A member lost
        meanwhile: the others enter the next epoch (their state agreed as at any) and finish among themselves."""
        self.state.round.close()
        self.ckpt.wait_writes()  # the last set on disk, its write's seconds in its row:
        self._post_rows()        # so the rows go into the store again
        if self.faults.skew:  # injected (real/membership/inject.py): the launcher must catch the mismatch
            self.state.outer.global_flat.add_(1e-3)
        self.faults.at("finish")
        while True:
            try:
                self._finish_in_epoch()
                return
            except PeerLost as exc:
                lost = PeerLost(str(exc))  # not the exception itself: its frames hold the epoch's group
            self._recover(lost)
            self.state.round.close()

    def _finish_in_epoch(self) -> None:
        state = self.state
        # a sharded node's θ_g gathered whole on its leader: the digest of the canonical layout, as unsharded
        flat = state.layout.gather(state.outer.global_flat) if state.layout is not None else state.outer.global_flat
        if state.is_leader:
            self.store.set(f"geodt/digest/{state.index}", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
        weights = None
        if state.index == self.epoch.members[0]:  # its processes all take part when its weights are sharded
            weights = self.hooks.final_weights()
        self.epoch.barrier()
        if self._coordinates():
            write_outputs(self.store, state.plan, state.plan.rounds, state.opts, self.epoch.members, weights,
                          streaming=state.kind.supports("fragments"))
        self.epoch.barrier()  # nobody leaves before the writer is done (gloo's pending work)

    def _coordinates(self) -> bool:
        """Whether this process is the epoch's coordinator: the first member's leader."""
        return self.state.index == self.epoch.members[0] and self.state.is_leader

    def _post_rows(self, rows: list[dict] | None = None) -> None:
        """Trace rows (default: all this node holds) and their rounds' fragment rows into the store, by
        the node's leader (which holds them)."""
        state = self.state
        if not state.is_leader:
            return
        fragments = state.kind.supports("fragments")  # a streaming round's fragment rows (syncs.csv) go too
        syncs: dict[int, list] = {}  # the fragment rows by round, grouped once
        for s in state.round.rows if fragments else ():
            syncs.setdefault(int(s["round"]), []).append([float(s[c]) for c in SYNC_NUMERIC])
        for row in state.trace if rows is None else rows:
            r = int(row["round"])
            self.store.set(f"geodt/row/{state.index}/{r}", json.dumps({k: row[k] for k in ROW_KEYS}))
            if fragments:
                self.store.set(f"geodt/syncs/{state.index}/{r}", json.dumps(syncs.get(r, [])))

    # --- epochs --------------------------------------------------------------------------
    def _enter(self, number: int) -> None:
        """Join epoch `number`, rebuild what depends on the group, agree on the state (module doc)."""
        state = self.state
        self.faults.at("epoch", number)
        adaptive = state.parts.steps.adaptive
        replicas = state.plan.round_kind.supports("replicated")  # sync-ddp's replicas keep one inner optimizer state
        shared: dict[str, torch.Tensor] = {}

        def share(epoch, latest: int, source: int) -> None:
            if self.in_flight is not None and state.rounds_done == latest and self.snapshot is not None:
                node_restore(state, self.snapshot)  # this round runs again, from its start
            self.hooks.bind(Groups(state.plan, epoch.rank, epoch.world, state.device, self.timeout_s,
                                   members=epoch.members))
            shared["clock"] = torch.tensor([state.time_offset_s], dtype=torch.float64)  # a resumed run's axis
            if adaptive is not None:
                shared["adaptive"] = adaptive.state()
            if replicas:
                shared["optimizer"] = optimizer_flat(state.optimizer, state.model)
            shared["outer"] = share_state(state.groups, state.layout, state.outer, list(shared.values()),
                                          epoch.members.index(source))

        epoch, latest = agree(self.store, number, state.plan, state.rank, state.rounds_done, share, self.timeout_s)
        self.epoch = epoch
        state.outer.global_flat.copy_(shared["outer"][0])
        state.outer.momentum.copy_(shared["outer"][1])
        state.time_offset_s = float(shared["clock"][0])
        if replicas:
            load_optimizer_flat(state.optimizer, state.model, shared["optimizer"])
        if state.rounds_done < latest:  # behind, or a joiner: the global weights of round `latest` on
            state.outer.load_into_model()
            if self.in_flight is None:  # a joiner: where its schedule and data would be, had it trained all along
                state.inner_step = latest * state.me.local_steps
                state.data_position = state.inner_step * state.parts.steps.node_batch
            elif self.snapshot is not None:  # its round's steps, had it run them all
                state.inner_step = self.snapshot["node.pt"]["inner_step"] + state.me.local_steps
                state.data_position = state.inner_step * state.parts.steps.node_batch
            state.rounds_done = latest
        if adaptive is not None:
            adaptive.entered(shared["adaptive"], epoch.members, replan=number > 0)

    def _enter_first(self, number: int) -> None:
        """Enter the first epoch this process takes part in, or the next ones if a member is lost meanwhile."""
        try:
            self._enter(number)
        except PeerLost as exc:
            enter_next_epoch(self._enter, number, self.timeout_s, exc)

    def _recover(self, exc: PeerLost) -> None:
        """A member is gone: leave its epoch, enter the launcher's next ones until one forms (or PeerLost)."""
        self.hooks.unbind()
        leave()
        enter_next_epoch(self._enter, self.epoch.number, self.timeout_s, exc)


def node_restore(state: NodeState, held: dict) -> None:
    """Back to `held` (checkpoint.snapshot's), the run's time axis and trace kept; the node is between
    epochs (Node.unbind), so its round's state is held for the next (NodeState.take_round_state)."""
    offset, trace = state.time_offset_s, state.trace
    saved = {**held["node.pt"], "outer": held["global.pt"]["outer"]}
    state.load_state_dict(saved)
    state.time_offset_s, state.trace = offset, trace


def share_state(groups: Groups, layout, outer, small: list[torch.Tensor], source: int) -> list[torch.Tensor]:
    """Every process of the epoch takes the state of the leader of member `source` (its position): `small`
    in place (the clock, an adaptive plan's estimates, sync-ddp's inner optimizer state), and θ_g and the
    outer momentum, returned as this process holds them (a sharded node's processes: their shards). The
    leaders broadcast, then each leader passes the state to its node's processes: a sharded node's
    leader gathers its shards first and scatters the result, so no process but a leader holds the
    whole state (real/core/sharding.py)."""
    # copies, so that an epoch failing meanwhile leaves the node's own state as it was
    state = [layout.gather(value) if layout is not None else value.clone()  # a sharded node's: on its leader
             for value in (outer.global_flat, outer.momentum)]
    if groups.is_leader:
        for tensor in [*small, *state]:
            run_collective(torch.distributed.broadcast, tensor, group_src=source, group=groups.leaders)
    for tensor in small:
        groups.broadcast_in_node(tensor)
    if layout is None:
        for tensor in state:
            groups.broadcast_in_node(tensor)
        return state
    mine = [torch.empty_like(outer.global_flat), torch.empty_like(outer.momentum)]
    for whole, local in zip(state, mine):
        layout.scatter(whole, local)
    return mine


def lost_round_row(state: NodeState, r: int, origin: Origin, progress, failed_at: float) -> dict:
    """The trace row of a round that completed elsewhere while this node's sync failed: its syncing
    ends when it learned so (its own progress says where its compute and barrier ended)."""
    now = time.perf_counter()
    compute_end = progress.compute_end or failed_at
    sync_start = progress.sync_start or compute_end
    return round_row(state.parts, r, origin, state.parts.steps.loss_sum, progress.clock,
                     compute_s=compute_end - progress.start, idle_s=sync_start - compute_end,
                     comm_s=now - sync_start, start=progress.start, end=now, bytes_sent=0)


def optimizer_flat(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.Tensor:
    """The inner AdamW's per-parameter state (step, exp_avg, exp_avg_sq) as one float64 vector, in the
    model's parameter order; a parameter without state yet (a fresh optimizer) reads zeros."""
    parts = []
    for param in model.parameters():
        state = optimizer.state.get(param, {})
        parts.append(torch.as_tensor(state.get("step", 0.0), dtype=torch.float64).reshape(1))
        for key in ("exp_avg", "exp_avg_sq"):
            value = state.get(key)
            parts.append(value.detach().reshape(-1).double() if value is not None
                         else torch.zeros(param.numel(), dtype=torch.float64))
    return torch.cat(parts)


def load_optimizer_flat(optimizer: torch.optim.Optimizer, model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Take optimizer_flat's vector back into the optimizer (creating its state where it has none)."""
    offset = 0
    for param in model.parameters():
        step = float(flat[offset])
        offset += 1
        state = optimizer.state[param]
        state["step"] = torch.tensor(step, dtype=torch.float32)
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = flat[offset:offset + param.numel()].to(param.dtype).view_as(param).clone()
            offset += param.numel()


def stored_rows(store, index: int, rounds: int) -> list[dict]:
    """Node `index`'s trace rows in the store, of rounds before `rounds`."""
    keys = [f"geodt/row/{index}/{r}" for r in range(rounds)]
    return [json.loads(store.get(key).decode()) for key in keys if store.check([key])]


def stored_syncs(store, state: NodeState, rounds: int) -> list[dict]:
    """The node's Streaming DiLoCo fragment rows in the store, of rounds before `rounds`."""
    rows = []
    for key in [f"geodt/syncs/{state.index}/{r}" for r in range(rounds)]:
        if store.check([key]):
            rows += [{"strategy": state.plan.strategy, "node": state.me.node, **dict(zip(SYNC_NUMERIC, values))}
                     for values in json.loads(store.get(key).decode())]
    return rows


def rejoined(store, index: int, who: str, round_: int, ready: float, say: bool = True) -> Origin:
    """Say when a restarted node rejoined (and where its time went); the run's time axis for it."""
    t0_unix = float(store.get("geodt/t0").decode())
    restarted = float(store.get(f"geodt/restarted/{index}").decode())
    if say:
        print(f"real: {who} rejoined at round {round_}, {time.time() - restarted:.2f} s after the launcher "
              f"restarted it ({ready - restarted:.2f} s to start its process and build the model, "
              f"{time.time() - ready:.2f} s until the others admitted it)", file=sys.stderr, flush=True)
    return Origin(time.perf_counter() - (time.time() - t0_unix))


def write_outputs(store, plan: Plan, rounds: int, opts: ExecOptions, members: list[int], weights: dict,
                  streaming: bool) -> None:
    """trace.csv (and syncs.csv) from every node's rows in the store (those of nodes that died too),
    the final weights, and the summary: who left and rejoined when, and whether the members' global
    weights agree (their digests)."""
    rows, syncs = [], []
    for i, node in enumerate(plan.nodes):
        mine = []
        for r in range(rounds):
            key = f"geodt/row/{i}/{r}"
            if store.check([key]):
                rows.append({"strategy": plan.strategy, "node": node.node, **json.loads(store.get(key).decode())})
            if streaming and store.check([f"geodt/syncs/{i}/{r}"]):
                mine += json.loads(store.get(f"geodt/syncs/{i}/{r}").decode())
        syncs.append(mine)
    names = [node.node for node in plan.nodes]
    frame = write_trace(rows, names, os.path.join(opts.out_dir, "trace.csv"), run_columns(opts),
                        extra=["members"])
    if streaming:
        write_syncs(plan, syncs, os.path.join(opts.out_dir, "syncs.csv"))
    save_whole(weights, os.path.join(opts.out_dir, "final_weights.pt"))
    digests = {plan.nodes[i].node: store.get(f"geodt/digest/{i}").decode()[:16] for i in members}
    if opts.summary:
        print(summary(frame), flush=True)
        for line in membership_lines(frame, names):
            print(line, flush=True)
        same = "identical" if len(set(digests.values())) == 1 else "DIFFERENT"
        print(f"final global weights (sha256) {same} on the members: "
              + ", ".join(f"{k}={v}" for k, v in digests.items()), flush=True)
