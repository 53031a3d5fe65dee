"""`hybrid`: choose b_i and H_i together, within memory, at the baseline's token budget per round.

The paper's first item of future work. Rule, for a budget of K samples per round (the
baseline's, Σ_i gpus_i × b × H) and the window K ≤ Σ_i gpus_i·b_i·H_i ≤ K + ⌊TOLERANCE·K⌋
(so a hybrid round never does less work than the baseline's, and at most 1% more):

1. Round time first. Node i can do at most cap_i(T) = max_b gpus_i·b·⌊T / t_i(b)⌋ samples
   in T seconds (b over the batches that fit, up to 16× the baseline's: `tables`). T* is the
   least T with Σ_i cap_i(T) ≥ K, found by bisection (capacity only grows with T); no plan
   inside the window has a shorter compute phase.
2. Then idle. At T*, pick (b_i, H_i) with H_i·t_i(b_i) ≤ T* and the total in the window,
   maximising Σ_i H_i·t_i(b_i) (the time the GPUs work; idle is T_max − that, per node).
   Coordinate ascent: start every node at its largest capacity, then COORDINATE_PASSES
   times for each node in turn choose, over all its batches, the most compute that keeps the
   total in the window (or, while the total is outside it, the option that moves it towards
   the window the most). Each step can only raise the total compute once in the window.
3. If no plan lands in the window at T* (possible when only coarse steps are left),
   T grows by 1% and step 2 repeats (up to RETRIES times); failing that, the baseline plan,
   which is always in the window.

Filling the slack with smaller batches (more steps, same samples) is deliberate: at the
least round time the work is fixed, and spending leftover time on more, smaller steps keeps
the GPUs busy instead of waiting. The residual idle is below one step per node per round
(the one-step bound of `geodt sweep --table`) and usually far below, since each node may pick
any fitting batch.
"""
from __future__ import annotations

import numpy as np

from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables

TOLERANCE = 0.01
COORDINATE_PASSES = 3
BISECTION_STEPS = 48
RETRIES = 30


def window(budget: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The accepted samples per round: [K, K + ⌊TOLERANCE·K⌋]."""
    budget = np.asarray(budget, dtype=np.int64)
    return budget, budget + np.floor(TOLERANCE * budget).astype(np.int64)


def _steps_within(step: np.ndarray, time_s: np.ndarray) -> np.ndarray:
    """⌊T / t_i(b)⌋ for every node and batch (0 where b does not fit: t = inf)."""
    return np.floor(time_s[:, None, None] / step).astype(np.int64)


def capacity(tables: NodeTables, time_s: np.ndarray) -> np.ndarray:
    """Σ_i max_b gpus_i·b·⌊T/t_i(b)⌋: the most samples the nodes can do within T, per scenario."""
    units = tables.gpus[:, :, None] * tables.batches
    return (units * _steps_within(tables.step_s, time_s)).max(axis=2).sum(axis=1)


def least_round_s(tables: NodeTables, budget: np.ndarray) -> np.ndarray:
    """T*, the least compute time per round whose capacity reaches the budget (inf if none)."""
    units = tables.gpus[:, :, None] * tables.batches
    rate = (units / tables.step_s).max(axis=2)  # samples per second at each node's best batch
    best = np.take_along_axis(units, (units / tables.step_s).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    total_rate = rate.sum(axis=1)
    with np.errstate(divide="ignore"):
        lo = budget / total_rate  # the fluid bound: no integer plan beats it
        hi = (budget + best.sum(axis=1)) / total_rate * (1 + 1e-9)  # at most one step short per node
    for _ in range(8):  # guard the rounding of the bound
        short = np.isfinite(hi) & (capacity(tables, hi) < budget)
        if not short.any():
            break
        hi = np.where(short, hi * 2, hi)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        enough = capacity(tables, np.where(np.isfinite(mid), mid, 0.0)) >= budget
        hi, lo = np.where(enough, mid, hi), np.where(enough, lo, mid)
    return hi


def _node_update(i, units, steps_max, step, chosen_j, chosen_h, samples, lo, hi) -> None:
    """Coordinate step for node i over all rows at once (arrays updated in place)."""
    others = samples.sum(axis=1) - samples[:, i]
    need_lo, need_hi = (lo - others)[:, None], (hi - others)[:, None]
    u, h_max, t = units[:, i, :], steps_max[:, i, :], step[:, i, :]
    h_hi = np.minimum(h_max, need_hi // u)
    h_lo = np.maximum(1, -((-need_lo) // u))
    ok = h_lo <= h_hi
    compute = np.where(ok, h_hi * np.where(ok, t, 0.0), -1.0)
    j_ok = compute.argmax(axis=1)
    # Outside the window whatever this node does: move the total towards it.
    full = u * h_max
    j_full = full.argmax(axis=1)
    reachable = h_lo <= h_max
    j_least = np.where(reachable, u * h_lo, np.iinfo(np.int64).max).argmin(axis=1)
    short = need_lo[:, 0] > full.max(axis=1)
    rows = np.arange(len(samples))
    j = np.where(ok.any(axis=1), j_ok, np.where(short, j_full, j_least))
    h = np.where(ok.any(axis=1), h_hi[rows, j], np.where(short, h_max[rows, j], h_lo[rows, j]))
    chosen_j[:, i], chosen_h[:, i] = j, h
    samples[:, i] = u[rows, j] * h


def fill(tables: NodeTables, time_s: np.ndarray, budget: np.ndarray):
    """Step 2 at compute time T per row: (batch, steps, in_window), arrays (S, n), (S, n), (S,)."""
    lo, hi = window(budget)
    units = tables.gpus[:, :, None] * tables.batches
    steps_max = _steps_within(tables.step_s, time_s)
    full = units * steps_max
    chosen_j = full.argmax(axis=2)
    chosen_h = np.take_along_axis(steps_max, chosen_j[:, :, None], axis=2)[:, :, 0]
    samples = np.take_along_axis(full, chosen_j[:, :, None], axis=2)[:, :, 0]
    for _ in range(COORDINATE_PASSES):
        for i in range(tables.gpus.shape[1]):
            _node_update(i, units, steps_max, tables.step_s, chosen_j, chosen_h, samples, lo, hi)
    total = samples.sum(axis=1)
    ok = (total >= lo) & (total <= hi) & (chosen_h >= 1).all(axis=1)
    return chosen_j + 1, chosen_h, ok


def hybrid_decide(tables: NodeTables, budget: np.ndarray | None = None):
    """(batch, steps) arrays (S, n) of the hybrid rule at `budget` samples per round (default: baseline's)."""
    budget = tables.baseline_samples() if budget is None else np.asarray(budget, dtype=np.int64)
    time_s = least_round_s(tables, budget)
    time_s = np.where(np.isfinite(time_s), time_s, 0.0)
    batch, steps, ok = fill(tables, time_s, budget)
    for _ in range(RETRIES):
        if ok.all():
            break
        redo = np.flatnonzero(~ok)
        time_s[redo] *= 1.01
        b2, h2, ok2 = fill(tables.rows(redo), time_s[redo], budget[redo])
        batch[redo], steps[redo], ok[redo] = b2, h2, ok2
    # Fallback: the baseline plan (always in the window).
    batch = np.where(ok[:, None], batch, tables.batch_size)
    steps = np.where(ok[:, None], steps, tables.local_steps)
    return batch, steps


def _note(d: dict, tables: NodeTables) -> str:
    return f"{tables.baseline_samples()[0]} samples per round budget, +{TOLERANCE:.0%} at most"


@register("hybrid",
          "each node's batch and local steps together, within memory: the shortest round at the same samples",
          note=_note)
def strategy_hybrid(tables: NodeTables, net: NetTables) -> dict:
    """(b_i, H_i) together, within memory, minimising round time at the baseline's samples per round (+0..1%)."""
    batch, steps = hybrid_decide(tables)
    return {"batch": batch, "steps": steps}
