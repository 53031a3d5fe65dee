"""`--on-node-loss continue`: DiLoCo rounds whose membership changes while the run goes on.

Scope (real/launch.py refuses the rest in one line): local runs spawned by `python -m real` /
`geodt run`, on the loopback, gloo, one process per node, classic DiLoCo rounds (no streaming or
sync-ddp; static or adaptive plans) with collective ring and payload fp32; no checkpoints, --resume
or --stop-after (a run that stops cannot be resumed exactly once nodes came and went).

Membership moves through epochs, each a fresh gloo group; the protocol and its store keys are
real/membership.py's.

A round: the node's H_i inner steps (no collective), then the barrier, an all-reduce MAX of one
flag per node (1: that node asked to join) that every member reads from the store, then the
pseudo-gradient all-reduce (SUM; divided by the members' averaging divisor, real/diloco.py, over
the members' tokens only) and the outer step. An adaptive plan's barrier carries each member's step
time and steps too, and plans the next round over the members at the plan's K (real/adaptive.py);
the round is averaged by the tokens each member did. A member that died makes its neighbours'
barrier or all-reduce fail at once (gloo: connection closed by peer); each survivor then drops its
group of the failed epoch (closing its connections, so that the members that were not the dead
node's neighbours in gloo's ring fail at once too rather than after --timeout-s), waits for the
launcher's next epoch and enters it. Entering an epoch (also how a joiner comes in): build its
group, all-reduce MAX every member's completed rounds R_i, and broadcast θ_g and the outer momentum
from the first member holding max R_i. A member behind (its all-reduce failed while another's
completed) takes them: its pseudo-gradient was in that average, so nothing is lost. A member at max
R_i keeps its inner steps and retries the sync of round R_i among the survivors: only the dead
node's round is lost (an adaptive round in flight ran as planned, with the lost node in it; the
retry's barrier plans the next one over the survivors). A joiner (rejoining node) takes θ_g, the
momentum and the round, sets its learning-rate schedule and data position to where they would be,
and trains on with fresh inner AdamW state. The others are not restarted. A member lost while an
epoch forms (before round 0 too: epoch 0 is formed as any other) makes the members abandon that
epoch for the launcher's next one (real/membership.py form_epoch), within a store poll of the
launcher's noticing, not after --timeout-s. Faults for tests are injected by real/inject.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from facts.presets import load_arch
from formats.plan import Plan
from real.adaptive import AdaptiveRounds
from real.checkpoint import save_whole
from real.config import RunSpec
from real.diloco import averaging_weights
from real.inject import Faults
from real.membership import (
    FAILURES,
    Epoch,
    agree,
    ask_to_join,
    enter_next_epoch,
    first_line,
    join_requests,
    open_next_epoch,
    wait_for_admission,
)
from real.options import ExecOptions, PeerLost, sleep_until
from real.rounds import Origin, RoundClock, round_row
from real.sharding import ShardingSpec, peak_memory_reset
from real.trace import NUMERIC_COLUMNS, membership_lines, run_columns, summary, write_trace
from real.worker import build_parts, progress_bar, warm_up


class SoloGroups:
    """real/groups.py's Groups for a node of one process with no run-wide group: what the inner
    steps and the trace row ask of it (the cross-node collectives go through the epoch's group)."""

    def __init__(self, plan: Plan, rank: int):
        self.plan, self.rank, self.world, self.device = plan, rank, plan.world_size, torch.device("cpu")
        self.index = rank  # one process per node: rank i is node i
        self.me = plan.nodes[rank]
        self.leader_rank, self.local, self.is_leader = rank, 0, True
        self.node = self.leaders = None

    def sync_device(self) -> None:
        pass

    def node_mean(self, tensor: torch.Tensor) -> None:
        pass

    def node_sum(self, tensor: torch.Tensor) -> None:
        pass

    def node_max(self, value: int) -> int:
        return value


class ElasticNode:
    """The one process of a node under --on-node-loss continue (the module doc)."""

    def __init__(self, rank: int, spec: RunSpec, plan: Plan, opts: ExecOptions, store, joining: bool):
        self.rank, self.spec, self.plan, self.opts, self.store, self.joining = rank, spec, plan, opts, store, joining
        self.groups, self.index, self.me, self.n = SoloGroups(plan, rank), rank, plan.nodes[rank], len(plan.nodes)
        self.timeout_s = opts.collective_timeout_s()
        arch = load_arch(spec.model.preset)
        self.vocab_size = arch.vocab_size
        self.parts = build_parts(spec, plan, opts, self.groups, arch, ShardingSpec.of(plan, self.me),
                                 torch.device("cpu"))
        self.outer, self.steps = self.parts.outer, self.parts.steps
        scale = opts.time_scale if opts.emulate else 1.0  # an adaptive plan's deadline, as real/worker.py sets it
        self.adaptive = self.steps.adaptive = AdaptiveRounds(plan, rank, scale) if plan.adaptive else None
        self.rounds_done = 0
        self.stepped = False  # the inner steps of round rounds_done are done, its sync is not
        self.epoch: Epoch | None = None
        self.coef = self.divisor = 1.0
        self.origin: Origin | None = None  # the run's time axis, once started
        self.round_state: dict = {}
        # an injected outage of this node (ExecOptions.outage): (round it is lost at, round it rejoins at)
        self.outage = next(((r, r + k) for i, r, k in opts.outage or () if i == rank), None)
        self.faults = Faults(self.me.node, joining)

    def enter(self, number: int) -> None:
        """Join epoch `number` and agree on the state (module doc); raises PeerLost on failure."""
        self.faults.at("epoch", number)
        state = torch.stack([self.outer.global_flat, self.outer.momentum])
        extra = self.adaptive.state() if self.adaptive is not None else None
        epoch, latest = agree(self.store, number, self.index, self.n, self.rounds_done, state, self.timeout_s, extra)
        behind = self.rounds_done < latest
        if behind and self.stepped and "sync_start" in self.round_state:
            # its pseudo-gradient is in the average that completed elsewhere: the round is its too
            self.round_state["sync_end"] = time.perf_counter()
            self._record(self.origin)
        self.epoch = epoch
        self.outer.global_flat.copy_(state[0])
        self.outer.momentum.copy_(state[1])
        if behind:  # (or a joiner): the global weights of round `latest` on
            if self.joining:  # where its schedule and data would be, had it trained all along
                self.steps.inner_step = latest * self.me.local_steps
                self.steps.data_position = self.steps.inner_step * self.steps.node_batch
            self.rounds_done, self.stepped = latest, False
            self.outer.load_into_model()
        self.coef, self.divisor = member_weights(self.plan, self.spec, epoch)  # an adaptive round's: at its sync
        if self.adaptive is not None:
            self.adaptive.entered(extra, epoch.members, replan=number > 0)

    def recover(self, exc: PeerLost) -> None:
        """A member is gone: enter the launcher's next epochs until one forms (or give up: PeerLost)."""
        self.epoch.group = None  # closes its connections: the dead node's non-neighbours fail now (module doc)
        enter_next_epoch(self.enter, self.epoch.number, self.timeout_s, exc)

    def enter_first(self, number: int) -> None:
        """Enter the first epoch this process takes part in, or the next ones if a member is lost meanwhile."""
        try:
            self.enter(number)
        except PeerLost as exc:
            enter_next_epoch(self.enter, number, self.timeout_s, exc)

    def admit(self, asked: np.ndarray) -> None:
        """After a round's sync: nodes asked to join; the coordinator makes the next epoch, all enter it."""
        if self.index == self.epoch.members[0]:
            open_next_epoch(self.store, self.epoch.members,
                            [i for i in range(self.n) if asked[i] > 0 and i not in self.epoch.members])
        try:
            self.enter(self.epoch.number + 1)
        except PeerLost as exc:
            self.recover(exc)

    def start(self) -> Origin:
        """Enter the first epoch (0, or the one a joiner is admitted to); the run's time axis."""
        if not self.joining:
            self.enter_first(0)
            t0 = time.perf_counter()
            if self.index == self.epoch.members[0]:  # node 0 may be the one lost before round 0
                self.store.set("geodt/t0", repr(time.time()))
            return Origin(t0)
        ready = time.time()
        ask_to_join(self.store, self.index, self.outage[1] if self.outage else 0)
        self.faults.at("asked")
        number = wait_for_admission(self.store, self.index, self.timeout_s)
        self.faults.at("admitted")
        self.enter_first(number)
        return rejoined(self.store, self.index, f"node {self.me.node} (rank {self.rank})", self.rounds_done, ready)

    def run(self) -> None:
        warm_up(self.parts.model, self.me.batch_size, self.spec.model.seq_len, self.groups.device)
        origin = self.origin = self.start()
        bar = progress_bar(self.opts, self.spec, self.me) if self.rank == 0 and not self.joining else None
        try:
            while self.rounds_done < self.spec.rounds:
                if not self.stepped:
                    if self.outage is not None and not self.joining and self.rounds_done == self.outage[0]:
                        os.kill(os.getpid(), signal.SIGKILL)  # the injected loss: a real one, at the round's start
                    self.faults.at("round", self.rounds_done)
                    self._inner_steps(bar)
                try:
                    asked = self._sync()
                except PeerLost as exc:
                    self.recover(exc)
                    continue
                self._record(origin)
                if asked.any():
                    self.admit(asked)
        finally:
            if bar is not None:
                bar.close()
        self.finish()

    def _inner_steps(self, bar) -> None:
        peak_memory_reset(self.groups.device)
        start = time.perf_counter()
        clock = RoundClock(deadline=start)
        loss_sum = self.steps.run(clock, None, bar)
        self.round_state = {"start": start, "clock": clock, "loss_sum": loss_sum, "compute_end": time.perf_counter()}
        self.stepped = True

    def _sync(self) -> np.ndarray:
        """The barrier (carrying the join requests) and the outer sync; the agreed join flags."""
        try:
            asked = join_requests(self.store, self.n, self.epoch.members, self.rounds_done)
            if self.adaptive is None:
                self.epoch.all_reduce(asked, dist.ReduceOp.MAX)
            else:  # with each member's step time and steps: the next round, this one's weights (real/adaptive.py)
                self.coef, self.divisor, asked = self.adaptive.elastic_barrier(
                    self.epoch, asked, self.round_state, self.steps.round_steps, self.spec.diloco.averaging)
            self.round_state["sync_start"] = time.perf_counter()
            delta = self.outer.pseudo_gradient(self.coef)
            self.epoch.all_reduce(delta)
        except FAILURES as exc:
            raise PeerLost(first_line(exc)) from exc
        delta.div_(self.divisor)
        self.outer.outer_step(delta, self.spec.diloco.outer_lr, self.spec.diloco.outer_momentum)
        self.outer.load_into_model()
        if self.opts.emulate:
            sleep_until(self.round_state["sync_start"] + self.plan.comm_s * self.opts.time_scale)
        self.round_state["sync_end"] = time.perf_counter()
        return asked.numpy()

    def _record(self, origin: Origin) -> None:
        """The round's trace row, into the store at once (it outlives this process)."""
        s, members = self.round_state, self.epoch.members
        row = round_row(self.parts, self.rounds_done, origin, s["loss_sum"], s["clock"],
                        compute_s=s["compute_end"] - s["start"], idle_s=s["sync_start"] - s["compute_end"],
                        comm_s=s["sync_end"] - s["sync_start"], start=s["start"], end=s["sync_end"],
                        bytes_sent=2 * (len(members) - 1) * self.outer.global_flat.numel() * 4 // len(members))
        row["members"] = "+".join(self.plan.nodes[i].node for i in members)
        self.store.set(f"geodt/row/{self.index}/{self.rounds_done}",
                       json.dumps({k: row[k] for k in [*NUMERIC_COLUMNS, "members"]}))
        self.rounds_done += 1
        self.stepped = False

    def finish(self) -> None:
        """Every member leaves its weights' digest; the first writes the outputs (write_outputs)."""
        if self.faults.skew:  # injected (real/inject.py): the launcher must catch the mismatch
            self.outer.global_flat.add_(1e-3)
        digest = hashlib.sha256(self.outer.global_flat.numpy().tobytes()).hexdigest()
        self.store.set(f"geodt/digest/{self.index}", digest)
        self.epoch.barrier()
        if self.index == self.epoch.members[0]:
            weights = {name: p.detach().cpu() for name, p in self.parts.model.named_parameters()}
            write_outputs(self.store, self.plan, self.spec.rounds, self.opts, self.epoch.members, weights)
        self.epoch.barrier()  # nobody leaves before the writer is done (gloo's pending work)


def member_weights(plan: Plan, spec: RunSpec, epoch: Epoch) -> tuple[float, float]:
    """This member's averaging coefficient and the divisor, over the epoch's members only."""
    nodes = [plan.nodes[i] for i in epoch.members]
    coefs, divisor = averaging_weights(spec.diloco.averaging, [n.tokens_per_round(spec.model.seq_len) for n in nodes],
                                       [n.local_steps for n in nodes])
    return coefs[epoch.rank], divisor


def rejoined(store, index: int, who: str, round_: int, ready: float) -> Origin:
    """Say when a restarted node rejoined (and where its time went); the run's time axis for it."""
    t0_unix = float(store.get("geodt/t0").decode())
    restarted = float(store.get(f"geodt/restarted/{index}").decode())
    print(f"real: {who} rejoined at round {round_}, {time.time() - restarted:.2f} s after the launcher "
          f"restarted it ({ready - restarted:.2f} s to start its process and build the model, "
          f"{time.time() - ready:.2f} s until the others admitted it)", file=sys.stderr, flush=True)
    return Origin(time.perf_counter() - (time.time() - t0_unix))


def write_outputs(store, plan: Plan, rounds: int, opts: ExecOptions, members: list[int], weights: dict) -> None:
    """trace.csv from every node's rows in the store (those of nodes that died too), the final
    weights, and the summary: who left and rejoined when, and whether the members' global weights
    agree (their digests)."""
    rows = []
    for i, node in enumerate(plan.nodes):
        for r in range(rounds):
            key = f"geodt/row/{i}/{r}"
            if store.check([key]):
                rows.append({"strategy": plan.strategy, "node": node.node, **json.loads(store.get(key).decode())})
    names = [node.node for node in plan.nodes]
    frame = write_trace(rows, names, os.path.join(opts.out_dir, "trace.csv"), run_columns(opts),
                        extra=["members"])
    save_whole(weights, os.path.join(opts.out_dir, "final_weights.pt"))
    digests = {plan.nodes[i].node: store.get(f"geodt/digest/{i}").decode()[:16] for i in members}
    if opts.summary:
        print(summary(frame), flush=True)
        for line in membership_lines(frame, names):
            print(line, flush=True)
        same = "identical" if len(set(digests.values())) == 1 else "DIFFERENT"
        print(f"final global weights (sha256) {same} on the members: "
              + ", ".join(f"{k}={v}" for k, v in digests.items()), flush=True)
