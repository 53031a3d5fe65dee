"""The local launcher under --on-node-loss continue: watch the node processes, tell the others
when one is lost, restart it when asked (real/membership/membership.py has the store keys and the protocol,
real/membership/members.py the rounds).

A node's process killed by a signal (SIGKILL, the out-of-memory killer) is lost: the launcher
allocates the next membership epoch with the members still alive (geodt/epochs, geodt/members/<e>)
and says so in one line; the others enter that epoch and go on. With --rejoin-after-s S the
node's process is started again S seconds after it died, once per node; it asks to join and is
admitted at the next round boundary. A restarted process that dies before it is a member: the
launcher claims it (real/membership/membership.py geodt/claim/<i>); if the coordinator had claimed it first
(admitted it to an epoch that is forming) the launcher allocates the next epoch without it, as
for a member. Any other way a process ends is handled as under stop
(real/process/supervise.py): bad input (2) or a named failure (3) stops the run, a lost contact (1: a
hung peer, no new epoch within --timeout-s) too; Ctrl-C and SIGTERM as always. The run succeeds
when every member left has finished (0) with the same final global weights: members whose
weights differ (their sha256, geodt/digest/<i>) end it with 1 and one line naming them. A
restarted process still waiting to be admitted when the run ends is stopped and named.
"""
from __future__ import annotations

import multiprocessing.connection
import sys
import time

from real.membership.membership import claim
from real.process.supervise import INTERRUPTED, signal_name, stop


class Respawner:
    """The node processes of a continue run and the membership the launcher decides. Nodes leave and
    join as wholes: membership, joins and restarts are by node (plan index), processes by plan rank."""

    def __init__(self, start, plan, store, rejoin_after_s: float | None):
        """start(rank, joining) -> a started process."""
        self.start, self.plan, self.store, self.rejoin_after_s = start, plan, store, rejoin_after_s
        self.procs = {rank: start(rank, False) for rank in range(plan.world_size)}
        self.members = set(range(len(plan.nodes)))  # nodes whose current processes are (or were last) members
        self.joiners: set[int] = set()  # restarted, not admitted yet
        self.restart_at: dict[int, float] = {}
        self.restarted: set[int] = set()
        self.finished: set[int] = set()  # ranks whose process ended with 0
        self.seen: set[int] = set()  # pids whose exit was handled
        store.set("geodt/members/0", ",".join(map(str, sorted(self.members))))

    @property
    def processes(self) -> list:
        return list(self.procs.values())

    def _name(self, rank: int) -> str:
        return f"node {self.plan.nodes[self.plan.node_of_rank(rank)].node} (rank {rank})"

    def _finished_nodes(self) -> set[int]:
        return {i for i in range(len(self.plan.nodes)) if all(r in self.finished for r in self.plan.ranks(i))}

    def run(self) -> int:
        while True:
            self._refresh_joiners()
            running = {p.sentinel: r for r, p in self.procs.items() if p.exitcode is None}
            if not running and not self.restart_at:
                return self._end() if self.finished else 1  # all ended at once: the weights still checked
            if self.finished and not (self.members - self._finished_nodes() - self._dead()):
                return self._end()
            wait_s = max(0.0, min(self.restart_at.values()) - time.monotonic()) if self.restart_at else 0.5
            for sentinel in multiprocessing.connection.wait(list(running), timeout=min(wait_s, 0.5)):
                self.procs[running[sentinel]].join()
            status = self._exits()
            if status is not None:
                return status
            self._restarts()

    def _dead(self) -> set[int]:
        return {self.plan.node_of_rank(r) for r, p in self.procs.items() if p.exitcode not in (None, 0)}

    def _refresh_joiners(self) -> None:
        for index in list(self.joiners):
            if self.store.check([f"geodt/admitted/{index}"]):
                self.joiners.discard(index)
                self.members.add(index)

    def _exits(self) -> int | None:
        """Handle processes that ended since the last look; an exit status ends the run."""
        for rank, proc in self.procs.items():
            code = proc.exitcode
            if code is None or proc.pid in self.seen:
                continue
            self.seen.add(proc.pid)
            self._refresh_joiners()
            index = self.plan.node_of_rank(rank)
            if code == 0:
                self.finished.add(rank)
            elif code < 0:
                self._lost(rank, code)
            elif index in self.joiners and code != 130:  # a restarted process that failed before it was admitted
                self._stop_node(index)
                self.joiners.discard(index)
                print(f"real: {self._name(rank)}'s restarted process exited with status {code} before it rejoined; "
                      f"the others go on without it", file=sys.stderr, flush=True)
            else:
                stop(self.procs.values())
                if code == 130:
                    print(INTERRUPTED, file=sys.stderr)
                    return 130
                if code not in (2, 3):
                    print(f"real: {self._name(rank)} exited with status {code}; the other processes were stopped",
                          file=sys.stderr)
                return 2 if code == 2 else 1
        return None

    def _stop_node(self, index: int) -> None:
        """The node's other processes go with the one lost (a node leaves as a whole); their exits (those
        that died of the same cause too) are this loss's."""
        procs = [self.procs[r] for r in self.plan.ranks(index)]
        stop(procs)
        self.seen.update(p.pid for p in procs)

    def _lost(self, rank: int, code: int) -> None:
        """A node's process died of a signal: the node's others are stopped, a new epoch without the node (if
        it was a member), a restart if asked."""
        index = self.plan.node_of_rank(rank)
        self._stop_node(index)
        was_member = index in self.members
        if index in self.joiners:
            if claim(self.store, index):  # never admitted: its request goes, the members stop seeing it
                self.store.delete_key(f"geodt/join/{index}")
            else:
                was_member = True  # the coordinator admitted it first: an epoch with it is forming
        self.members.discard(index)
        self.joiners.discard(index)
        alive = sorted(i for i in self.members if all(self.procs[r].exitcode is None for r in self.plan.ranks(i)))
        if was_member and alive:
            number = self.store.add("geodt/epochs", 1)
            self.store.set(f"geodt/members/{number}", ",".join(map(str, alive)))
        again = self.rejoin_after_s is not None and index not in self.restarted and bool(alive)
        print(f"real: {self._name(rank)} was killed by {signal_name(-code)}; "
              + ("no node is left" if not alive else
                 "the others continue without it (--on-node-loss continue)"
                 + (f"; it restarts in {self.rejoin_after_s:g} s" if again else "")),
              file=sys.stderr, flush=True)
        if again:
            self.restart_at[index] = time.monotonic() + self.rejoin_after_s

    def _restarts(self) -> None:
        now = time.monotonic()
        for index, when in list(self.restart_at.items()):
            if when > now:
                continue
            del self.restart_at[index]
            if self.finished:  # the run has ended meanwhile
                continue
            for key in ("admitted", "admit", "join", "joining", "claim"):
                self.store.delete_key(f"geodt/{key}/{index}")
            self.restarted.add(index)
            self.joiners.add(index)
            self.store.set(f"geodt/restarted/{index}", repr(time.time()))  # the joiner reports its rejoin time
            for rank in self.plan.ranks(index):
                self.procs[rank] = self.start(rank, True)
            print(f"real: {self._name(self.plan.first_rank(index))} restarted; it rejoins at the next round boundary",
                  file=sys.stderr, flush=True)

    def _end(self) -> int:
        """Every member has finished: stop restarted processes that were never admitted."""
        waiting = [i for i in self.joiners if any(self.procs[r].exitcode is None for r in self.plan.ranks(i))]
        for index in waiting:
            print(f"real: {self._name(self.plan.first_rank(index))} restarted but the run ended before it could "
                  f"rejoin; stopped", file=sys.stderr)
        stop(self.procs.values())
        differ = differing_weights(self.store, self.plan, sorted(self._finished_nodes()))
        if differ is not None:
            print(f"real: {differ}", file=sys.stderr, flush=True)
            return 1
        return 0


def differing_weights(store, plan, nodes: list[int]) -> str | None:
    """One line naming the members (plan indices) whose final global weights differ (by their digests), or None."""
    groups: dict[str, list[str]] = {}
    for index in nodes:
        key = f"geodt/digest/{index}"
        digest = store.get(key).decode() if store.check([key]) else "none"
        groups.setdefault(digest, []).append(plan.nodes[index].node)
    if len(groups) <= 1:
        return None
    return ("the members' final global weights differ (--on-node-loss continue): "
            + "; ".join(f"{', '.join(names)} sha256 {digest[:16]}" for digest, names in groups.items()))
