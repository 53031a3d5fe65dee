"""A node that leaves and comes back: `[[nodes]] outage`, under `[simulation] on_node_loss`.

    outage = { round = 5, rounds = 3 }   the node is lost at round 5's start, gone for 3 rounds

With on_node_loss = "continue" the others notice at round 5's barrier (after detect_s), average
among themselves for rounds 5..7 (the node's rows: no compute, idle, sync or tokens), and the
node rejoins at round 8's boundary, first fetching the global weights and outer momentum from a
live peer (2 × 4 bytes per parameter over its link: that round's comm_s carries it, the others
wait for it at the barrier). A node whose restart takes longer (restart_s: the executor restarts
a lost node's process at once, and it must start and build its model) rejoins at the first
boundary after it is ready: round 5 + max(3, ⌈restart_s / the others' round⌉). With "stop" (the
executor's behaviour before this issue) the whole run stops at round 5's barrier: after detect_s,
the node's downtime (as long as `rounds` of the rounds before) and restart_s (relaunch and reload),
every node re-runs round 5 from the checkpoint of round 4: its first pass is lost work, and all of
it is the round's idle_s.

Both are made from the compute matrix the engines run (so both engines agree exactly) and a
settlement of their arrays afterwards: `prepare` returns the matrix with the outage's time in
it, `settle` moves that time where it belongs. Classic DiLoCo plans (not streaming, not sync-ddp:
their rounds do not stand still for a lost node here), and adaptive plans (rebalance, deadline)
under continue: simulator/models/adaptive.py plans each round over the nodes
present, at the plan's samples per round, so the others take on the lost node's share from the
round after its loss (the round in flight was planned with it); `settle` then blanks its rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formats.errors import FieldError, InputError
from formats.sections import NODE_LOSS_POLICIES as POLICIES  # [simulation] on_node_loss
from formats.wire import node_link_gbps

FETCH_BYTES_PER_PARAM = 8  # global weights and outer momentum, fp32


@dataclass(frozen=True)
class Outage:
    """A node's loss: at the start of `round`, for `rounds` rounds (module docstring)."""

    round: int
    rounds: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.round <= 10**9:
            raise FieldError("round", f"expected a round index from 0 to 1e9, got {self.round!r}")
        if not 1 <= self.rounds <= 10**9:
            raise FieldError("rounds", f"expected at least 1 round, got {self.rounds!r}")


@dataclass(frozen=True)
class Fixups:
    """What `settle` moves: per (round, node) time out of compute into idle or comm, and rows to blank."""

    to_idle: np.ndarray
    to_comm: np.ndarray
    gone: np.ndarray  # bool: the node took no part in that round


def outages(scenario, plan) -> list[tuple[int, Outage]]:
    by_name = {n.name: n for n in scenario.nodes}
    return [(i, by_name[p.node].outage) for i, p in enumerate(plan.nodes) if by_name[p.node].outage is not None]


def prepare(scenario, plan, compute: np.ndarray, comm_s) -> tuple[np.ndarray, Fixups | None]:
    """(compute with the outages' time in it, the fixups for settle), or (compute, None) without outages."""
    lost = outages(scenario, plan)
    if not lost:
        return compute, None
    check_modelled(scenario, plan)
    rounds, n = compute.shape
    sim = scenario.simulation
    compute = compute.copy()
    fix = Fixups(np.zeros((rounds, n)), np.zeros((rounds, n)), np.zeros((rounds, n), dtype=bool))
    comm = np.broadcast_to(np.asarray(comm_s, dtype=float), (n,))
    for i, outage in lost:
        f = outage.round
        if f >= rounds:
            continue
        if sim.on_node_loss == "continue":
            others = np.delete(compute[f], i).max() if n > 1 else 0.0
            back = rejoin_round(sim, outage, np.delete(compute[f], i), comm)
            gone = slice(f, min(back, rounds))
            compute[gone, i] = 0.0
            compute[f, i] = others + sim.detect_s  # the others' barrier opens once they notice (row blanked)
            fix.gone[gone, i] = True
            if back < rounds:
                fetch = fetch_s(scenario, plan, i)
                compute[back, i] += fetch
                fix.to_comm[back, i] += fetch
        else:
            before = compute[max(f - 1, 0)].max() + comm.max()  # one round's length before the loss
            pause = compute[f].max() + sim.detect_s + outage.rounds * before + sim.restart_s
            compute[f] += pause  # the lost first pass, the wait, the downtime, the relaunch
            fix.to_idle[f] += pause
    return compute, fix


def check_modelled(scenario, plan) -> None:
    """InputError unless the plan's rounds stand still for a lost node here: the kinds of round that
    support an outage (formats/rounds.py: classic DiLoCo rounds), and adaptive ones (rebalance, deadline)
    under continue (simulator/models/adaptive.py plans them over the nodes present)."""
    if (not plan.round_kind.supports("outage")
            or (plan.adaptive and scenario.simulation.on_node_loss != "continue")):
        raise InputError(f"strategy {plan.strategy}: nodes[].outage is modelled for classic DiLoCo plans (and "
                         "rebalance and deadline under on_node_loss = \"continue\"); expected another strategy "
                         "or policy (or no outage)")


def rejoin_round(sim, outage: Outage, others_compute: np.ndarray, comm: np.ndarray) -> int:
    """Under continue, the first round a node lost at outage.round takes part in again (module doc)."""
    return outage.round + max(outage.rounds, restart_rounds(sim.restart_s, others_compute, comm))


def restart_rounds(restart_s: float, others_compute: np.ndarray, comm: np.ndarray) -> int:
    """Rounds the others run before a node restarted at its loss is ready to rejoin: restart_s
    (its process start and model build) over their round's length (their slowest compute, the sync)."""
    if restart_s <= 0:
        return 0
    round_s = (others_compute.max() if others_compute.size else 0.0) + comm.max()
    return int(np.ceil(restart_s / round_s)) if round_s > 0 else 1


def fetch_s(scenario, plan, i: int) -> float:
    """A rejoining node's download of the global weights and outer momentum from a live peer, over
    its link: the plan's link_gbps, else the network's bandwidth or the node's own uplink where slower."""
    uplink_gbps = next(n.uplink_gbps for n in scenario.nodes if n.name == plan.nodes[i].node)
    link = plan.nodes[i].link_gbps or node_link_gbps(scenario.network.bandwidth_gbps, uplink_gbps)
    return FETCH_BYTES_PER_PARAM * scenario.model.param_count * 8 / (link * 1e9) + scenario.network.latency_ms / 1e3


def settle(arrays: dict, fix: Fixups | None, tokens: np.ndarray) -> tuple[dict, np.ndarray]:
    """The engines' arrays with the outages' time moved out of compute; the gone rows blanked."""
    if fix is None:
        return arrays, tokens
    out = {k: np.array(np.broadcast_to(v, fix.gone.shape), dtype=float) for k, v in arrays.items()}
    out["compute_s"] -= fix.to_idle + fix.to_comm
    out["idle_s"] += fix.to_idle
    out["comm_s"] += fix.to_comm
    for column in ("compute_s", "idle_s", "comm_s"):
        out[column][fix.gone] = 0.0
    tokens = np.where(fix.gone, 0, np.broadcast_to(tokens, fix.gone.shape))
    return out, tokens


def check_policy(sim) -> None:
    if sim.on_node_loss not in POLICIES:
        raise FieldError("on_node_loss", f"expected one of {', '.join(POLICIES)}, got {sim.on_node_loss!r}")
