"""`--on-node-loss continue`: DiLoCo rounds whose membership changes while the run goes on.

Scope (real/launch.py refuses the rest in one line): local runs spawned by `python -m real` /
`geodt run`, on the loopback, gloo, one process per node, classic DiLoCo rounds (no streaming,
sync-ddp or adaptive plans) with collective ring and payload fp32; no checkpoints, --resume or
--stop-after (a run that stops cannot be resumed exactly once nodes came and went).

A gloo process group does not survive a member's death, so the run moves through *epochs*: each
is a fresh gloo group (torch.distributed.ProcessGroupGloo under a PrefixStore "geodt/pg/<e>/")
over the launcher's TCPStore, which lives in the launcher and survives the workers. Store keys:
- geodt/epochs: the last epoch allocated (store.add, so two writers never take the same number);
- geodt/members/<e>: the plan indices of epoch e's nodes ("0,2"), written once by whoever
  allocated e: the launcher when a member's process died (the members still alive), a node's
  coordinator (the epoch's first member) when nodes asked to join;
- geodt/join/<i>: node i's restarted process is ready (its parts built) and asks to join, from the
  round given (0: the next; an injected outage's round + rounds, ExecOptions.outage);
  geodt/admit/<i>: the epoch it was admitted to; geodt/admitted/<i>: the launcher's sign that it
  is a member again;
- geodt/row/<i>/<r>: node i's trace row of round r (JSON, not pickles), so that rows of a node
  that died are still written; geodt/t0: the run's start (unix seconds), for a joiner's clock;
  geodt/digest/<i>: sha256 of the final global weights on node i.

A round: the node's H_i inner steps (no collective), then the barrier, an all-reduce MAX of one
flag per node (1: that node asked to join) that every member reads from the store, then the
pseudo-gradient all-reduce (SUM; divided by the members' averaging divisor, real/diloco.py, over
the members' tokens only) and the outer step. A member that died makes its neighbours' barrier or
all-reduce fail at once (gloo: connection closed by peer); each survivor then drops its group of
the failed epoch (closing its connections, so that the members that were not the dead node's
neighbours in gloo's ring fail at once too rather than after --timeout-s), waits for the launcher's
next epoch and enters it. Entering an epoch (also how a joiner comes in): build its
group, all-reduce MAX every member's completed rounds R_i, and broadcast θ_g and the outer
momentum from the first member holding max R_i. A member behind (its all-reduce failed while
another's completed) takes them: its pseudo-gradient was in that average, so nothing is lost. A
member at max R_i keeps its inner steps and retries the sync of round R_i among the survivors:
only the dead node's round is lost. A joiner (rejoining node) takes θ_g, the momentum and the
round, sets its learning-rate schedule and data position to where they would be, and trains on
with fresh inner AdamW state. The others are not restarted. A second membership change while an
epoch is forming costs up to --timeout-s (the group's rendezvous times out; the next epoch follows).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from facts.presets import load_arch
from formats.plan import Plan
from real.config import RunSpec
from real.diloco import averaging_weights
from real.options import ExecOptions, PeerLost
from real.rounds import Origin, RoundClock, round_row
from real.sharding import ShardingSpec, peak_memory_reset
from real.trace import NUMERIC_COLUMNS, write_trace

FAILURES = (RuntimeError, dist.DistError)  # how gloo and the store report a lost peer or a timeout


def connect_store(store_spec: tuple, timeout_s: float):
    """A client of the launcher's TCPStore (continue runs always serve one, real/launch.py)."""
    _, host, port = store_spec
    return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))


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


class Epoch:
    """One membership epoch: its number, members (plan indices, ascending) and gloo group."""

    def __init__(self, store, number: int, me: int, timeout_s: float):
        key = f"geodt/members/{number}"
        store.wait([key], timedelta(seconds=timeout_s))
        self.number = number
        self.members = [int(i) for i in store.get(key).decode().split(",")]
        if me not in self.members:
            raise PeerLost(f"epoch {number} does not include this node (members {self.members})")
        self.rank = self.members.index(me)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore(f"geodt/pg/{number}/", store), self.rank,
                                           len(self.members), timedelta(seconds=timeout_s))

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        self.group.allreduce([tensor], opts).wait()

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """`tensor` from member `root` (a plan index) to every member."""
        opts = dist.BroadcastOptions()
        opts.rootRank = self.members.index(root)
        self.group.broadcast([tensor], opts).wait()


class ElasticNode:
    """The one process of a node under --on-node-loss continue (the module doc)."""

    def __init__(self, rank: int, spec: RunSpec, plan: Plan, opts: ExecOptions, store, joining: bool):
        from real.worker import build_parts

        self.rank, self.spec, self.plan, self.opts, self.store, self.joining = rank, spec, plan, opts, store, joining
        self.groups = SoloGroups(plan, rank)
        self.index, self.me, self.is_leader = rank, plan.nodes[rank], True
        self.n = len(plan.nodes)
        self.timeout_s = opts.collective_timeout_s()
        arch = load_arch(spec.model.preset)
        self.vocab_size = arch.vocab_size
        self.parts = build_parts(spec, plan, opts, self.groups, arch, ShardingSpec.of(plan, self.me),
                                 torch.device("cpu"))
        self.outer, self.steps = self.parts.outer, self.parts.steps
        self.rounds_done = 0
        self.stepped = False  # the inner steps of round rounds_done are done, its sync is not
        self.epoch: Epoch | None = None
        self.coef = self.divisor = 1.0
        self.origin: Origin | None = None  # the run's time axis, once started
        self.round_state: dict = {}
        # an injected outage of this node (ExecOptions.outage): (round it is lost at, round it rejoins at)
        self.outage = next(((r, r + k) for i, r, k in opts.outage or () if i == rank), None)

    # --- membership ----------------------------------------------------------------------
    def enter(self, number: int) -> None:
        """Join epoch `number` and agree on the state (module doc); raises PeerLost on failure."""
        try:
            epoch = Epoch(self.store, number, self.index, self.timeout_s)
            done = torch.full((self.n,), -1.0, dtype=torch.float64)
            done[self.index] = self.rounds_done
            epoch.all_reduce(done, dist.ReduceOp.MAX)
            latest = int(done.max().item())
            source = next(i for i in epoch.members if int(done[i].item()) == latest)
            state = torch.stack([self.outer.global_flat, self.outer.momentum])
            epoch.broadcast(state, source)
        except FAILURES as exc:
            raise PeerLost(_first_line(exc)) from exc
        behind = self.rounds_done < latest
        if behind and self.stepped and "sync_start" in self.round_state:
            # its all-reduce failed here but completed on another member: its pseudo-gradient is in that
            # average, so the round is its too (its row, with the failed epoch's members)
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
        tokens = [self.plan.nodes[i].tokens_per_round(self.spec.model.seq_len) for i in epoch.members]
        coefs, self.divisor = averaging_weights(self.spec.diloco.averaging, tokens,
                                                [self.plan.nodes[i].local_steps for i in epoch.members])
        self.coef = coefs[epoch.rank]

    def recover(self, exc: PeerLost) -> None:
        """A member is gone: enter the launcher's next epochs until one forms (or give up: PeerLost)."""
        deadline = time.monotonic() + self.timeout_s
        number = self.epoch.number
        # Close this node's connections of the failed group at once: in a ring of 4 or more, members that
        # are not the dead node's neighbours would otherwise wait in their all-reduce for --timeout-s.
        self.epoch.group = None
        while True:
            number += 1
            try:
                self.enter(number)
                return
            except PeerLost as again:
                if time.monotonic() > deadline:
                    raise PeerLost(f"{exc}; no new membership formed within --timeout-s ({again})") from again

    def admit(self, asked: np.ndarray) -> None:
        """After a round's sync: nodes asked to join; the coordinator makes the next epoch, all enter it."""
        joiners = [i for i in range(self.n) if asked[i] > 0 and i not in self.epoch.members]
        if self.index == self.epoch.members[0]:
            number = self.store.add("geodt/epochs", 1)
            self.store.set(f"geodt/members/{number}", ",".join(map(str, sorted(self.epoch.members + joiners))))
            for j in joiners:
                self.store.delete_key(f"geodt/join/{j}")
                self.store.set(f"geodt/admitted/{j}", "1")
                self.store.set(f"geodt/admit/{j}", str(number))
        try:
            self.enter(self.epoch.number + 1)
        except PeerLost as exc:
            self.recover(exc)

    def join_requests(self) -> torch.Tensor:
        """One flag per node: 1 where a node outside the epoch asked to join (geodt/join/<i>, its value
        the first round it may take part in) and may join after this round."""
        flags = torch.zeros(self.n, dtype=torch.float64)
        for i in range(self.n):
            key = f"geodt/join/{i}"
            if i not in self.epoch.members and self.store.check([key]):
                flags[i] = float(self.rounds_done + 1 >= int(self.store.get(key).decode()))
        return flags

    # --- the run -------------------------------------------------------------------------
    def warm_up(self) -> None:
        batch = torch.zeros((self.me.batch_size, self.spec.model.seq_len), dtype=torch.long)
        self.parts.model(input_ids=batch, labels=batch).loss.backward()
        self.parts.model.zero_grad(set_to_none=True)

    def start(self) -> Origin:
        """Enter the first epoch (0, or the one a joiner is admitted to); the run's time axis."""
        if not self.joining:
            self.enter(0)
            t0 = time.perf_counter()
            if self.index == 0:
                self.store.set("geodt/t0", repr(time.time()))
            return Origin(t0)
        ready = time.time()
        self.store.set(f"geodt/join/{self.index}", str(self.outage[1] if self.outage else 0))
        self.store.wait([f"geodt/admit/{self.index}"], timedelta(seconds=max(self.timeout_s, 86400.0)))
        self.enter(int(self.store.get(f"geodt/admit/{self.index}").decode()))
        t0_unix = float(self.store.get("geodt/t0").decode())
        restarted = float(self.store.get(f"geodt/restarted/{self.index}").decode())
        print(f"real: node {self.me.node} (rank {self.rank}) rejoined at round {self.rounds_done}, "
              f"{time.time() - restarted:.2f} s after the launcher restarted it ({ready - restarted:.2f} s to start "
              f"its process and build the model, {time.time() - ready:.2f} s until the others admitted it)",
              file=sys.stderr, flush=True)
        return Origin(time.perf_counter() - (time.time() - t0_unix))

    def run(self) -> None:
        self.warm_up()
        origin = self.origin = self.start()
        bar = self._progress_bar()
        try:
            while self.rounds_done < self.spec.rounds:
                if not self.stepped:
                    if self.outage is not None and not self.joining and self.rounds_done == self.outage[0]:
                        os.kill(os.getpid(), signal.SIGKILL)  # the injected loss: a real one, at the round's start
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

    def _progress_bar(self):
        """The first process's bar over its inner steps (real/worker.py's), or None."""
        if self.rank != 0 or self.joining or not self.opts.progress:
            return None
        import threading

        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
        return tqdm(total=self.spec.rounds * self.me.local_steps, desc=f"DiLoCo ({self.me.node})", unit="step",
                    file=sys.stderr, dynamic_ncols=True)

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
            asked = self.join_requests()
            self.epoch.all_reduce(asked, dist.ReduceOp.MAX)
            self.round_state["sync_start"] = time.perf_counter()
            delta = self.outer.pseudo_gradient(self.coef)
            self.epoch.all_reduce(delta)
        except FAILURES as exc:
            raise PeerLost(_first_line(exc)) from exc
        delta.div_(self.divisor)
        self.outer.outer_step(delta, self.spec.diloco.outer_lr, self.spec.diloco.outer_momentum)
        self.outer.load_into_model()
        if self.opts.emulate:
            time.sleep(max(0.0, self.round_state["sync_start"] + self.plan.comm_s * self.opts.time_scale
                           - time.perf_counter()))
        self.round_state["sync_end"] = time.perf_counter()
        return asked.numpy()

    def _record(self, origin: Origin) -> None:
        """The round's trace row, into the store at once (it outlives this process)."""
        s = self.round_state
        row = round_row(self.parts, self.rounds_done, origin, s["loss_sum"], s["clock"],
                        compute_s=s["compute_end"] - s["start"], idle_s=s["sync_start"] - s["compute_end"],
                        comm_s=s["sync_end"] - s["sync_start"], start=s["start"], end=s["sync_end"],
                        bytes_sent=2 * (len(self.epoch.members) - 1) * self.outer.global_flat.numel() * 4
                        // len(self.epoch.members))
        row["members"] = "+".join(self.plan.nodes[i].node for i in self.epoch.members)
        self.store.set(f"geodt/row/{self.index}/{self.rounds_done}",
                       json.dumps({k: row[k] for k in [*NUMERIC_COLUMNS, "members"]}))
        self.rounds_done += 1
        self.stepped = False

    def finish(self) -> None:
        """Every member leaves its weights' digest; the first writes trace.csv, the final weights and
        the summary (who left and rejoined when, and whether the members' global weights agree)."""
        digest = hashlib.sha256(self.outer.global_flat.numpy().tobytes()).hexdigest()
        self.store.set(f"geodt/digest/{self.index}", digest)
        try:
            self.epoch.all_reduce(torch.zeros(1))
        except FAILURES as exc:
            raise PeerLost(_first_line(exc)) from exc
        if self.index == self.epoch.members[0]:
            self._write_outputs()
        try:  # nobody leaves before the writer is done (gloo's pending work)
            self.epoch.all_reduce(torch.zeros(1))
        except FAILURES as exc:
            raise PeerLost(_first_line(exc)) from exc

    def _write_outputs(self) -> None:
        from real.checkpoint import save_whole

        rows = []
        for i, node in enumerate(self.plan.nodes):
            for r in range(self.spec.rounds):
                key = f"geodt/row/{i}/{r}"
                if self.store.check([key]):
                    rows.append({"strategy": self.plan.strategy, "node": node.node,
                                 **json.loads(self.store.get(key).decode())})
        names = [node.node for node in self.plan.nodes]
        frame = write_trace(rows, names, os.path.join(self.opts.out_dir, "trace.csv"), extra=["members"])
        weights = {name: p.detach().cpu() for name, p in self.parts.model.named_parameters()}
        save_whole(weights, os.path.join(self.opts.out_dir, "final_weights.pt"))
        digests = {self.plan.nodes[i].node: self.store.get(f"geodt/digest/{i}").decode()[:16]
                   for i in self.epoch.members}
        if self.opts.summary:
            from real.trace import membership_lines, summary

            print(summary(frame), flush=True)
            for line in membership_lines(frame, names):
                print(line, flush=True)
            same = "identical" if len(set(digests.values())) == 1 else "DIFFERENT"
            print(f"final global weights (sha256) {same} on the members: "
                  + ", ".join(f"{k}={v}" for k, v in digests.items()), flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
