"""`rebalance` and `deadline`: plans whose rounds re-plan themselves while they run.

Both keep the baseline batch b on every node (it fits: the baseline needs it) and take round 0's
H_i from formats/adaptive.py's rule on the planned step times, so the plan file is round 0
exactly. Why not hybrid's batches: an adaptive round balances by whole steps, so it needs many
of them; hybrid trades steps for batch (on CPU nodes with a large fixed cost per step down to
one step a round), which leaves a round nothing to re-plan. b_i is not re-planned while running:
the executor would have to measure a new batch's step time before it could plan with it.
Later rounds follow the plan's `adapt` (formats/adaptive.py): rebalance re-plans H_i before each
round from the step times measured so far; deadline runs every node until a shared deadline. Without
drift or jitter every round is round 0 (the sweep's closed form holds); simulator/models/adaptive.py
simulates them under drift and jitter. Classic DiLoCo only: a round that changes length would move
Streaming DiLoCo's fragment schedule. """
from __future__ import annotations

import numpy as np

from formats.adaptive import rebalance_steps
from formats.errors import FieldError
from formats.rounds import is_streaming, round_kind
from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables


def _adaptive(name: str, tables: NodeTables, net: NetTables) -> dict:
    if not round_kind("diloco", is_streaming(net.fragments, net.sync_delay_steps)).supports("adapt"):
        raise FieldError("diloco.fragments", f"strategy {name} re-plans whole rounds; expected classic DiLoCo "
                         f"(fragments 1, sync_delay_steps 0), got {net.fragments} and {net.sync_delay_steps}")
    batch = np.full(tables.gpus.shape, tables.batch_size, dtype=np.int64)
    units = batch * tables.gpus
    steps = rebalance_steps(tables.step_at(batch), units, tables.baseline_samples())
    return {"batch": batch, "steps": steps, "adapt": name}


def _note(d: dict, tables: NodeTables) -> str:
    rule = ("H_i re-planned before each round from the last round's measured step times"
            if d["adapt"] == "rebalance" else "each node steps until a shared deadline per round")
    return f"{rule}, at {tables.baseline_samples()[0]} samples per round"


@register("rebalance",
          "re-plans every round: local steps from the step times measured so far (follows drift)", note=_note)
def strategy_rebalance(tables: NodeTables, net: NetTables) -> dict:
    """b; H_i = ⌊T / t̂_i⌋ before every round, t̂ measured (formats/adaptive.py)."""
    return _adaptive("rebalance", tables, net)


@register("deadline",
          "re-plans every round: every node steps until a shared deadline, then syncs (follows drift)", note=_note)
def strategy_deadline(tables: NodeTables, net: NetTables) -> dict:
    """b; every node steps until the round's deadline T(t̂), then syncs."""
    return _adaptive("deadline", tables, net)
