"""`streaming`: Streaming DiLoCo on hybrid's allocation, its fragments P and delay τ chosen to hide the sync.

Rule (arXiv 2501.18512, torchft's semantics: formats/plan.py's docstring):

1. b_i and H_i as `hybrid` decides them (within memory, the baseline's samples per round, +1%
   at most), so the work per round is the baseline's.
2. P from FRAGMENT_CHOICES (at most the model's layers, a fragment being a group of them, and
   at most every node's H_i), τ from 0 to ⌊min_i H_i / P⌋ − 1 and at most MAX_OVERLAP·min_i H_i.
   Each (P, τ) is timed by the analytic engine's fragment-sync recurrence
   (engine_analytic.run_streaming_analytic) over the scenario's rounds, deterministic steps: each
   fragment's all-reduce is 1/P of the payload (its full latency), its outer step 1/P of the outer
   step.
3. The least round time over every (P, τ) is the target; of the pairs within TIE of it, the
   least τ, then the least P. Least τ because the τ steps a fragment computes after its
   pseudo-gradient was taken are dropped at the merge (α = 0, torchft's default) or only partly
   kept: τ changes the optimisation, so only as much of it as hiding the all-reduce needs. Round
   time is non-increasing in τ (a max-plus recurrence whose only τ-dependent term, the
   all-reduce's start, comes earlier), so the least τ of each P is found by bisection.
   MAX_OVERLAP = 1/4 keeps at least three quarters of every node's steps in each fragment's
   pseudo-gradient (our bound; it only binds for P ≤ 3, since τ < H/P): without it one fragment
   with τ = H − 1 would "hide" the sync by averaging one step's progress.

The note prints the round beside its bound, max(the slowest node's compute, the classic sync
(whole all-reduce plus outer step)): overlap can hide the sync behind compute but no more. The
outer step is applied at each merge point, on the node (as torchft does), so it never overlaps:
the round stays at least compute + the outer steps.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.engines.engine_analytic import run_streaming_analytic
from simulator.strategies.hybrid import hybrid_decide
from simulator.strategies.registry import register
from simulator.strategies.tables import NetTables, NodeTables

FRAGMENT_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)
TIE = 0.01
MAX_OVERLAP = 0.25


def segments(steps: np.ndarray, step_s: np.ndarray, fragments: int, delay: np.ndarray):
    """(pre_s, delay_s), (P, S, n): one round's compute before each fragment's sync point and in its τ window."""
    p = np.arange(1, fragments + 1)[:, None, None]
    merges = steps[None] * p // fragments  # formats.plan.merge_steps, every node and row at once
    pre_steps = np.diff(merges, axis=0, prepend=0) - delay[None, :, None]
    return pre_steps * step_s[None], np.broadcast_to(delay[None, :, None] * step_s[None], pre_steps.shape)


def round_time(tables: NodeTables, net: NetTables, steps, step_s, fragments: int, delay: np.ndarray) -> np.ndarray:
    """Wall time / rounds per row of the plan with P = fragments and τ = delay (S,)."""
    pre, window = segments(steps, step_s, fragments, delay)
    out = run_streaming_analytic(pre, window, net.allreduce_s(fragments=fragments), net.outer_step_s / fragments,
                                 fragments, record=False, syncs=tables.rounds * fragments)
    return out["wall_s"] / tables.rounds


def least_delay(tables, net, steps, step_s, fragments: int, hi: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per row the least τ in [0, hi] whose round is within target (rows where hi's is not: hi)."""
    lo = np.zeros_like(hi)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        ok = round_time(tables, net, steps, step_s, fragments, mid) <= target
        hi, lo = np.where(ok, mid, hi), np.where(ok | (lo >= hi), lo, mid + 1)
    return hi


def streaming_decide(tables: NodeTables, net: NetTables) -> dict:
    batch, steps = hybrid_decide(tables)
    step_s = np.take_along_axis(tables.step_s, (batch - 1)[:, :, None], axis=2)[:, :, 0]
    shortest = steps.min(axis=1)
    choices = [p for p in FRAGMENT_CHOICES if p <= net.max_fragments]
    best = {}
    for p in choices:
        top = np.maximum(np.minimum(shortest // p - 1, np.floor(MAX_OVERLAP * shortest).astype(np.int64)), 0)
        rounds = round_time(tables, net, steps, step_s, p, top)
        best[p] = (np.where(shortest >= p, rounds, np.inf), top)
    target = np.min([r for r, _ in best.values()], axis=0) * (1 + TIE)
    rows = len(steps)
    fragments, delay = np.ones(rows, dtype=np.int64), np.full(rows, np.iinfo(np.int64).max)
    for p in choices:  # ascending: a tie in τ keeps the fewer fragments
        rounds, top = best[p]
        tau = least_delay(tables, net, steps, step_s, p, top, target)
        better = (rounds <= target) & (tau < delay)
        fragments, delay = np.where(better, p, fragments), np.where(better, tau, delay)
    round_s = np.empty(rows)
    for p in choices:
        idx = np.flatnonzero(fragments == p)
        if len(idx):
            round_s[idx] = round_time(tables, _rows(net, idx), steps[idx], step_s[idx], p, delay[idx])
    bound = np.maximum((steps * step_s).max(axis=1), net.sync_s(fragments=1))
    return {"batch": batch, "steps": steps, "fragments": fragments, "delay": delay,
            "comm_s": net.sync_s(fragments=fragments), "bound_s": bound, "round_s": round_s}


def _rows(net: NetTables, index: np.ndarray) -> NetTables:
    return replace(net, links_gbps=net.links_gbps[index], outer_step_s=net.outer_step_s[index])


def _note(d: dict, tables: NodeTables) -> str:
    p, tau, bound, round_s = int(d["fragments"][0]), int(d["delay"][0]), float(d["bound_s"][0]), float(d["round_s"][0])
    # round_s: the deterministic round of the plan (no jitter, no checkpoint), the strategy's own estimate
    return (f"round {round_s:.2f} s against its bound max(slowest compute, sync) = {bound:.2f} s "
            f"({100 * (round_s / bound - 1):+.1f}%); {p} fragment{'s' if p > 1 else ''}, τ = {tau}; hybrid's b and H "
            f"({tables.baseline_samples()[0]} samples per round budget)")


@register("streaming",
          "hybrid's compute, synced as Streaming DiLoCo fragments that overlap the next steps", note=_note)
def strategy_streaming(tables: NodeTables, net: NetTables) -> dict:
    """Hybrid's b_i and H_i; Streaming DiLoCo's P and τ chosen to bring the round to max(compute, sync)."""
    return streaming_decide(tables, net)
