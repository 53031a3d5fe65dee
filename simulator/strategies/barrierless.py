"""`async` and `quorum`: rounds without DiLoCo's barrier (issue 40).

Both keep the baseline batch b and take H_i from each node's speed, Liu et al. 2024's dynamic
local updates (docs/PAPERS.md): H_i = max(1, ⌊T / t_i(b)⌋) at the least round time T whose
rounds hold the baseline's samples (formats/adaptive.py rebalance_steps, the rule `rebalance`
plans round 0 with), so every node's round takes about T and the run trains on the baseline's
tokens. What differs is how a round ends (simulator/engines/engine_async.py):

- `async`: a parameter server applies each node's pseudo-gradient when it arrives (one outer step
  per arrival; the paper's server uses delayed Nesterov momentum, which costs the simulator one
  outer step per arrival too) and the node pulls the new weights and goes on. comm_s is the
  slowest node's push, outer step and pull with the server otherwise free.
- `quorum`: a round closes once QUORUM_SHARE of the nodes have their pseudo-gradients in, after a
  grace window of GRACE_SHARE of the slowest node's planned round compute; those all-reduce (the
  scenario's sync); a late node does not wait: it pulls the latest model and computes on, its
  pseudo-gradient merged by the next close. QUORUM_SHARE and GRACE_SHARE are geodt's choices, not
  figures from a paper (Decoupled DiLoCo's grace window is adaptive).

Not in STRATEGIES (registry.py BARRIERLESS): the sweep and `geodt paper` time strategies with the
barrier's arithmetic. The executor runs both (real/rounds/round_async.py, real/rounds/round_quorum.py).
"""
from __future__ import annotations

import numpy as np

from formats.adaptive import rebalance_steps
from formats.errors import FieldError
from formats.plan import quorum_need
from formats.rounds import is_streaming, round_kind
from simulator.engines.engine_async import WEIGHT_BYTES_PER_PARAM, push_pull_raw
from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables

QUORUM_SHARE = 0.5  # half the nodes still training close a round
GRACE_SHARE = 0.05  # the round stays open 5% of the slowest node's planned compute after its quorum


def speed_steps(name: str, tables: NodeTables, net: NetTables) -> tuple[np.ndarray, np.ndarray]:
    """(batch, steps) (S, n): the baseline b, H_i from the node's speed at the baseline's samples per round;
    refused where the scenario syncs in fragments, which the strategy's kind of round does not (formats/rounds.py)."""
    if is_streaming(net.fragments, net.sync_delay_steps) and not round_kind(name, True).supports("fragments"):
        raise FieldError("diloco.fragments", f"strategy {name} runs whole rounds without a barrier; expected classic "
                         f"DiLoCo (fragments 1, sync_delay_steps 0), got {net.fragments} and {net.sync_delay_steps}")
    batch = np.full(tables.gpus.shape, tables.batch_size, dtype=np.int64)
    steps = rebalance_steps(tables.step_at(batch), batch * tables.gpus, tables.baseline_samples())
    return batch, steps


@register("async",
          "no barrier: a server applies each node's pseudo-gradient on arrival (stale merges priced)",
          note=lambda d, tables: (
    f"no barrier: a server applies each node's pseudo-gradient on arrival; server load {d['load'][0]:.2f} (its "
    "syncs over the slowest round's compute: above 1 the nodes queue); H_i from each node's speed at "
    f"{tables.baseline_samples()[0]} samples per round"), sync="async")
def strategy_async(tables: NodeTables, net: NetTables) -> dict:
    """b; H_i by speed; each node syncs with a parameter server when its steps end."""
    batch, steps = speed_steps("async", tables, net)
    service = push_pull_raw(net.links_gbps, net.latency_ms, net.payload_bytes(net.payload_dtype),
                            WEIGHT_BYTES_PER_PARAM * net.params, net.outer_step_s[:, None])
    load = service.sum(axis=1) / (steps * tables.step_at(batch)).max(axis=1)
    return {"batch": batch, "steps": steps, "sync": "async", "comm_s": service.max(axis=1), "load": load}


@register("quorum",
          "no barrier: a round closes when half the nodes wait plus a grace window; late work merges next round",
          note=lambda d, tables: (
    f"a round closes when {quorum_need(QUORUM_SHARE, tables.gpus.shape[1])} of {tables.gpus.shape[1]} nodes wait, "
    f"{d['grace_s'][0]:.2f} s later (grace); a late node pulls and computes on, its work merged next round; "
    "H_i from each node's speed"),
    sync="quorum")
def strategy_quorum(tables: NodeTables, net: NetTables) -> dict:
    """b; H_i by speed; a round closes on a quorum of nodes plus a grace window."""
    batch, steps = speed_steps("quorum", tables, net)
    compute = (steps * tables.step_at(batch)).max(axis=1)
    return {"batch": batch, "steps": steps, "sync": "quorum", "quorum": QUORUM_SHARE, "grace_s": GRACE_SHARE * compute}
