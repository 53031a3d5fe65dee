"""The membership protocol of `--on-node-loss continue` runs: epochs, joins and admissions,
kept in the launcher's store (real/membership/members.py is the policy the round loop consults).

What protects the store: it is a torch FileStore in the launcher's rendezvous folder
(real/process/outdir.py rendezvous_dir: created 0700 by tempfile.mkdtemp, so only this user's processes
can open it), not a TCPStore: a TCPStore on the loopback takes reads, writes and list_keys from
any local process, so another user's process could write an epoch or a join request. The store
file outlives the workers (the launcher holds it); the children get its path as an argument of
their spawn (pickled through a pipe, not on a command line). The gloo groups' own connections are
TCP on the loopback, with no authentication of their own (gloo has none).

A gloo process group does not survive a member's death, so the run moves through *epochs*: each
is a fresh run-wide (default) gloo process group over the members' processes, initialised under
a PrefixStore "geodt/pg/<e>/" of that store, so the rounds' own collectives (real/core/groups.py,
real/core/sync.py) run in it unchanged; a member leaving an epoch destroys its group. An epoch
*forms* before its group is built (form_epoch): every member's every process adds its plan rank to
geodt/form/<e> by compare-and-set; when all are in, the epoch is formed; while it is not, a member that
sees a newer epoch allocated (a member of e died meanwhile, so the launcher wrote e+1) or its
wait run out marks it abandoned ("x", also by compare-and-set), so the members agree on formed-
or-abandoned and no survivor waits --timeout-s in gloo's rendezvous for a dead member. A node of G
processes leaves and joins as one: when one of them dies the launcher stops the others
(real/process/respawn.py) and restarts all G; the keys below are a node's, written by its leader
(its first process) unless they say otherwise. Store keys:
- geodt/epochs: the last epoch allocated (store.add, so two writers never take the same number);
- geodt/members/<e>: the plan indices of epoch e's nodes ("0,2"), written once by whoever
  allocated e: the launcher when a member's process died (the members still alive), a node's
  coordinator (the epoch's first member) when nodes asked to join;
- geodt/form/<e>: the processes (plan ranks) that reached epoch e ("0,2"), or "x": abandoned (above);
- geodt/claim/<i>: store.add by the coordinator admitting a joiner and by the launcher when a
  restarted process dies before it is a member: whoever adds first decides (1: the coordinator
  admits it / the launcher drops its request; 2: the other one was first);
- geodt/joining/<i>: how many of node i's restarted processes are ready (their parts built); the
  last of them sets geodt/join/<i>:
- geodt/join/<i>: node i's restarted processes are ready and ask to join, from the
  round given (0: the next; an injected outage's round + rounds, ExecOptions.outage);
  geodt/admit/<i>: the epoch it was admitted to; geodt/admitted/<i>: the launcher's sign that it
  is a member again; geodt/restarted/<i>: when the launcher restarted it (unix seconds);
- geodt/row/<i>/<r>: node i's trace row of round r (JSON, not pickles), so that rows of a node
  that died are still written; geodt/t0: the run's start (unix seconds), for a joiner's clock;
  geodt/digest/<i>: sha256 of the final global weights on node i.
"""
from __future__ import annotations

import gc
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from real.core.options import PeerLost

FAILURES = (RuntimeError, dist.DistError)  # how gloo and the store report a lost peer or a timeout
# A joiner waits for its admission as long as the run may take (the others admit it at a round's end).
ADMISSION_WAIT_S = 86400.0
ABANDONED = "x"  # geodt/form/<e> of an epoch that will not form
FORM_POLL_S = 0.01  # a store read every 10 ms while an epoch forms (a file read each; a few per member)


class NoEpoch(PeerLost):
    """No further epoch was allocated within --timeout-s: nothing left to wait for."""


def open_store(path: str, timeout_s: float):
    """The membership store at `path`, a file in the launcher's private (0700) rendezvous folder.
    numWorkers -1: the file is never removed by a client (restarted processes open it later; the
    launcher's rendezvous folder goes with the run)."""
    if not Path(path).parent.is_dir():
        raise PeerLost(f"the membership store's folder {Path(path).parent} is gone (the launcher ended)")
    store = dist.FileStore(path, -1)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


def connect_store(store_spec: tuple, timeout_s: float):
    """A child's handle on the launcher's membership store (a FileStore, module doc; real/process/launch.py)."""
    kind, path = store_spec[0], store_spec[1]
    if kind != "file":
        raise ValueError(f"--on-node-loss continue: the membership store is a private file store, got {kind}")
    return open_store(path, timeout_s)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Epoch:
    """One membership epoch: its number, members (plan indices, ascending) and this process's rank
    in its run-wide process group: the members' processes, G_i consecutive ranks a node in plan
    order (as real/core/groups.py ranks them), so a node's leader is its first."""

    def __init__(self, store, number: int, plan, rank: int, timeout_s: float):
        """rank: this process's rank in the plan (formats.plan.Plan.first_rank)."""
        key = f"geodt/members/{number}"
        try:
            store.wait([key], timedelta(seconds=timeout_s))
        except FAILURES as exc:
            raise NoEpoch(f"no epoch {number} within --timeout-s ({first_line(exc)})") from exc
        self.number = number
        self.members = [int(i) for i in store.get(key).decode().split(",")]
        me = plan.node_of_rank(rank)
        if me not in self.members:
            raise PeerLost(f"epoch {number} does not include this node (members {self.members})")
        processes = [rank for i in self.members for rank in plan.ranks(i)]
        form_epoch(store, number, processes, rank, timeout_s)
        self.rank, self.world = processes.index(rank), len(processes)
        leave()
        dist.init_process_group("gloo", store=dist.PrefixStore(f"geodt/pg/{number}/", store), rank=self.rank,
                                world_size=self.world, timeout=timedelta(seconds=timeout_s))

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> None:
        dist.all_reduce(tensor, op=op)

    def barrier(self) -> None:
        """Every member's every process reaches this point (PeerLost if one is gone)."""
        try:
            self.all_reduce(torch.zeros(1))
        except FAILURES as exc:
            raise PeerLost(first_line(exc)) from exc


def leave() -> None:
    """Leave the current epoch's process group, if any. Its connections close once nothing refers to
    it any more (the caller drops its own references first, and any exception that held its frames),
    so that members that were not a dead node's neighbours in gloo's ring fail at once too rather
    than after --timeout-s (measured: 0.5 s against the timeout's 20 s with a reference kept)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    # A failed collective's exception and its frames form young cycles that may still hold the group:
    # collected here (the young generations only: a full collection of a torch process takes ~0.4 s).
    gc.collect(1)


def form_epoch(store, number: int, processes: list[int], me: int, timeout_s: float) -> None:
    """Add `me` (a plan rank) to epoch `number`'s formation and wait until every process of its
    members (`processes`, plan ranks) has (module doc); PeerLost when they agree it is abandoned."""
    key = f"geodt/form/{number}"
    current = ""
    while True:  # compare-and-set: my index added to whatever the others wrote
        if current == ABANDONED:
            raise PeerLost(f"epoch {number} was abandoned (a member was lost while it formed)")
        wanted = f"{current},{me}" if current else str(me)
        got = store.compare_set(key, current, wanted).decode()
        if got == wanted:
            break
        current = got
    deadline = time.monotonic() + timeout_s
    while True:
        current = store.get(key).decode()
        if current != ABANDONED and {int(i) for i in current.split(",")} == set(processes):
            return
        newer = store.add("geodt/epochs", 0) > number  # the launcher saw a member die
        if current == ABANDONED or newer or time.monotonic() > deadline:
            if store.compare_set(key, current, ABANDONED).decode() == ABANDONED:
                why = "a newer membership was allocated" if newer else "not every member came within --timeout-s"
                raise PeerLost(f"epoch {number} was abandoned ({why})")
            continue  # someone joined meanwhile: look again
        time.sleep(FORM_POLL_S)


def agree(store, number: int, plan, rank: int, rounds_done: int, share, timeout_s: float) -> tuple[Epoch, int]:
    """Enter epoch `number` as the plan's process `rank`: every member's completed rounds (all-reduce
    MAX), then share(epoch, latest, source): the state (θ_g and the outer momentum, and what else the run
    keeps alike) from `source`, the first member holding the most rounds (`latest`), to the others.
    Returns the epoch and that round count; PeerLost if it does not form."""
    try:
        epoch = Epoch(store, number, plan, rank, timeout_s)
        done = torch.full((len(plan.nodes),), -1.0, dtype=torch.float64)
        done[plan.node_of_rank(rank)] = rounds_done
        epoch.all_reduce(done, dist.ReduceOp.MAX)
        latest = int(done.max().item())
        share(epoch, latest, next(i for i in epoch.members if int(done[i].item()) == latest))
    except PeerLost:
        raise
    except FAILURES as exc:
        raise PeerLost(first_line(exc)) from exc
    return epoch, latest


def enter_next_epoch(enter, number: int, timeout_s: float, lost: PeerLost) -> None:
    """After `lost` in epoch `number`: enter(e) for the next epochs e until one forms (an epoch
    abandoned because a member died while it formed is followed by the launcher's next); PeerLost
    when no further epoch is allocated within timeout_s (Epoch's wait for its members: NoEpoch)."""
    while True:
        number += 1
        try:
            enter(number)
            return
        except NoEpoch as again:
            raise PeerLost(f"{lost}; no new membership formed within --timeout-s ({again})") from again
        except PeerLost:
            continue


def join_requests(store, n: int, members: list[int], rounds_done: int) -> torch.Tensor:
    """One flag per node: 1 where a node outside the epoch asked to join (geodt/join/<i>, its value
    the first round it may take part in) and may join after round `rounds_done`."""
    flags = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        key = f"geodt/join/{i}"
        if i not in members and store.check([key]):
            flags[i] = float(rounds_done + 1 >= int(store.get(key).decode()))
    return flags


def claim(store, index: int) -> bool:
    """Decide a restarted node's fate first (geodt/claim/<i>, module doc): True if this caller did."""
    return store.add(f"geodt/claim/{index}", 1) == 1


def open_next_epoch(store, members: list[int], joiners: list[int]) -> int:
    """The coordinator's part of admitting `joiners`: allocate the next epoch with those still
    alive in it (a joiner that died first was claimed by the launcher; the epoch goes without it)."""
    joiners = [j for j in joiners if claim(store, j)]
    number = store.add("geodt/epochs", 1)
    store.set(f"geodt/members/{number}", ",".join(map(str, sorted(members + joiners))))
    for j in joiners:
        store.delete_key(f"geodt/join/{j}")
        store.set(f"geodt/admitted/{j}", "1")
        store.set(f"geodt/admit/{j}", str(number))
    return number


def ask_to_join(store, me: int, from_round: int, processes: int = 1) -> None:
    """A restarted node's process is ready; the last of the node's `processes` to be so asks for the
    node to join (from round `from_round`; 0: the next)."""
    if store.add(f"geodt/joining/{me}", 1) == processes:
        store.set(f"geodt/join/{me}", str(from_round))


def wait_for_admission(store, me: int, timeout_s: float) -> int:
    """A restarted node that asked to join waits to be admitted: its epoch."""
    store.wait([f"geodt/admit/{me}"], timedelta(seconds=max(timeout_s, ADMISSION_WAIT_S)))
    return int(store.get(f"geodt/admit/{me}").decode())
