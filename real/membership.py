"""The membership protocol of `--on-node-loss continue` runs: epochs, joins and admissions,
kept in the launcher's TCPStore (real/elastic.py runs the rounds that use it).

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
  is a member again; geodt/restarted/<i>: when the launcher restarted it (unix seconds);
- geodt/row/<i>/<r>: node i's trace row of round r (JSON, not pickles), so that rows of a node
  that died are still written; geodt/t0: the run's start (unix seconds), for a joiner's clock;
  geodt/digest/<i>: sha256 of the final global weights on node i.
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from real.options import PeerLost

FAILURES = (RuntimeError, dist.DistError)  # how gloo and the store report a lost peer or a timeout
# A joiner waits for its admission as long as the run may take (the others admit it at a round's end).
ADMISSION_WAIT_S = 86400.0


def connect_store(store_spec: tuple, timeout_s: float):
    """A client of the launcher's TCPStore (continue runs always serve one, real/launch.py)."""
    _, host, port = store_spec
    return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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

    def barrier(self) -> None:
        """Every member reaches this point (PeerLost if one is gone)."""
        try:
            self.all_reduce(torch.zeros(1))
        except FAILURES as exc:
            raise PeerLost(first_line(exc)) from exc


def agree(store, number: int, me: int, n: int, rounds_done: int, state: torch.Tensor,
          timeout_s: float, extra: torch.Tensor | None = None) -> tuple[Epoch, int]:
    """Enter epoch `number`: every member's completed rounds (all-reduce MAX), and `state` (θ_g and
    the outer momentum, stacked) broadcast in place from the first member holding the most, and
    `extra` after it when given (an adaptive plan's estimates and round plan, real/adaptive.py).
    Returns the epoch and that round count; PeerLost if the epoch does not form."""
    try:
        epoch = Epoch(store, number, me, timeout_s)
        done = torch.full((n,), -1.0, dtype=torch.float64)
        done[me] = rounds_done
        epoch.all_reduce(done, dist.ReduceOp.MAX)
        latest = int(done.max().item())
        source = next(i for i in epoch.members if int(done[i].item()) == latest)
        epoch.broadcast(state, source)
        if extra is not None:
            epoch.broadcast(extra, source)
    except FAILURES as exc:
        raise PeerLost(first_line(exc)) from exc
    return epoch, latest


def enter_next_epoch(enter, number: int, timeout_s: float, lost: PeerLost) -> None:
    """After `lost` in epoch `number`: enter(e) for the launcher's next epochs e until one forms;
    PeerLost when none has within timeout_s (a member that died while an epoch formed: the next follows)."""
    deadline = time.monotonic() + timeout_s
    while True:
        number += 1
        try:
            enter(number)
            return
        except PeerLost as again:
            if time.monotonic() > deadline:
                raise PeerLost(f"{lost}; no new membership formed within --timeout-s ({again})") from again


def join_requests(store, n: int, members: list[int], rounds_done: int) -> torch.Tensor:
    """One flag per node: 1 where a node outside the epoch asked to join (geodt/join/<i>, its value
    the first round it may take part in) and may join after round `rounds_done`."""
    flags = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        key = f"geodt/join/{i}"
        if i not in members and store.check([key]):
            flags[i] = float(rounds_done + 1 >= int(store.get(key).decode()))
    return flags


def open_next_epoch(store, members: list[int], joiners: list[int]) -> int:
    """The coordinator's part of admitting `joiners`: allocate the next epoch with them in it."""
    number = store.add("geodt/epochs", 1)
    store.set(f"geodt/members/{number}", ",".join(map(str, sorted(members + joiners))))
    for j in joiners:
        store.delete_key(f"geodt/join/{j}")
        store.set(f"geodt/admitted/{j}", "1")
        store.set(f"geodt/admit/{j}", str(number))
    return number


def wait_for_admission(store, me: int, from_round: int, timeout_s: float) -> int:
    """A restarted node asks to join (from round `from_round`; 0: the next) and waits: its epoch."""
    store.set(f"geodt/join/{me}", str(from_round))
    store.wait([f"geodt/admit/{me}"], timedelta(seconds=max(timeout_s, ADMISSION_WAIT_S)))
    return int(store.get(f"geodt/admit/{me}").decode())
