"""The analytic path for synchronous rounds: the same arithmetic as the SimPy engine, vectorised.

Round r starts at s_r; node i finishes at s_r + c[r, i]; the barrier opens at the latest
finish; every node then syncs for comm_s; s_{r+1} = barrier_r + comm_s. Where nodes' syncs end
at different times (comm_s per node, measured per node on a shaped WAN), node i starts round
r + 1 at barrier_r + comm_i and the barrier opens at max_i(s_{r,i} + c[r, i]). Additions happen
in the same order as SimPy's clock, so both paths agree to rounding. A checkpoint after a
round's sync (ckpt_s: one number for every round, or one per round, 0 where none is due; the
same on every node: each writes the same state; simulator/models/checkpoints.py) delays the next round.

Streaming DiLoCo (`run_streaming_analytic`): the same idea one level down, a recurrence over
the fragment syncs in which the all-reduces overlap compute, exact for every plan. It reduces to
closed forms where nodes are alike (tests/test_simulator_engines.py checks them on both engines):
a fragment costs pre_p + max(τ·t, A) + O (its compute to the sync point, the longer of its τ
window and its all-reduce, the outer step), so a round is T + P·O when every all-reduce fits in
its window (hidden) and T + P·(A + O) with τ = 0 (fully exposed).
"""
from __future__ import annotations

import numpy as np


def per_round(ckpt_s, rounds: int) -> np.ndarray:
    """ckpt_s, one number or one per round, as one per round."""
    return np.broadcast_to(np.asarray(ckpt_s, dtype=float), (rounds,))


def run_analytic(compute: np.ndarray, comm_s, ckpt_s=0.0, start_s=0.0) -> dict[str, np.ndarray]:
    """Arrays (rounds × nodes) of compute_s, idle_s, comm_s, round_start_s, round_end_s; comm_s
    one number, or one per node (nodes whose sync ends at different times, simulator/models/network.py
    node_sync_offsets_s): a node that ends its sync early starts its next round early. start_s:
    when the first round starts (one number, or one per node with comm_s per node): the rounds
    before them run as chunks, each from next_start_s of the previous (the same additions)."""
    rounds, n = compute.shape
    comm = np.asarray(comm_s, dtype=float)
    ckpt = per_round(ckpt_s, rounds).tolist()
    if comm.ndim == 0:
        return _run_aligned(compute, float(comm), ckpt, float(np.max(start_s)))
    start = np.empty((rounds, n))
    barrier = np.empty(rounds)
    now = np.broadcast_to(np.asarray(start_s, dtype=float), (n,))
    for r in range(rounds):  # rounds is small next to nodes
        start[r] = now
        barrier[r] = (now + compute[r]).max()
        now = barrier[r] + comm
        if ckpt[r]:
            now = now + ckpt[r]
    finish = start + compute
    end = barrier[:, None] + comm
    return {"compute_s": compute, "idle_s": barrier[:, None] - finish, "comm_s": np.broadcast_to(comm, compute.shape),
            "round_start_s": start, "round_end_s": end}


def next_start_s(out: dict[str, np.ndarray], ckpt_s: float = 0.0):
    """When the round after a chunk of run_analytic's (or run_simpy's) rounds starts: each node's
    end of the last sync, then the checkpoint after it, ckpt_s (the additions the unchunked loop makes)."""
    end = np.asarray(out["round_end_s"])[-1]
    return end + ckpt_s if ckpt_s else end


def _run_aligned(compute: np.ndarray, comm_s: float, ckpt: list, start_s: float = 0.0) -> dict[str, np.ndarray]:
    """run_analytic when every node syncs for comm_s: every round starts at one time for all."""
    rounds, _n = compute.shape
    start = np.empty(rounds)
    now = start_s
    slowest = compute.max(axis=1)
    for r in range(rounds):  # a scalar recurrence: rounds is small next to nodes
        start[r] = now
        now = (now + slowest[r]) + comm_s
        if ckpt[r]:
            now = now + ckpt[r]
    finish = start[:, None] + compute
    barrier = start + slowest
    idle = barrier[:, None] - finish
    end = np.broadcast_to((barrier + comm_s)[:, None], compute.shape)
    return {"compute_s": compute, "idle_s": idle, "comm_s": np.full(compute.shape, comm_s),
            "round_start_s": np.broadcast_to(start[:, None], compute.shape), "round_end_s": end}


# --- Streaming DiLoCo -------------------------------------------------------------------

STREAM_FIELDS = ("compute_start_s", "sync_point_s", "merge_point_s", "resume_s")


def wait_split(merge_point, start, end, outer_s=0.0):
    """A node's wait at a merge point for its end of the all-reduce: (waited, idle, exposed,
    resume): idle is the part before the all-reduce started (the wait for the node that reached
    its sync point last), exposed the rest (the all-reduce ran and no compute hid it), resume
    the end of the outer step after it (docs/DESIGN.md, "Time accounting")."""
    waited = np.maximum(merge_point, end)
    wait = waited - merge_point
    idle = np.minimum(wait, np.maximum(start - merge_point, 0.0))
    return waited, idle, wait - idle, waited + outer_s


def run_streaming_analytic(pre: np.ndarray, delay: np.ndarray, allreduce_s, outer_s, fragments: int,
                           ckpt_s=0.0, record: bool = True, syncs: int | None = None,
                           node_offsets_s=None, state=None) -> dict[str, np.ndarray]:
    """Streaming DiLoCo's fragment syncs as a max-plus recurrence over them, vectorised over nodes
    (and over scenarios: a leading axis S, as the `streaming` strategy and the sweep use it).

    pre, delay: (K, [S,] n) compute before each fragment sync's sync point and between it and the
    merge point (K = rounds × P syncs in order); allreduce_s, outer_s: one fragment's all-reduce
    and outer step (scalars or (S,)). Per sync k, with c_i the node's clock:

        sync point  x_i = c_i + pre_i;      all-reduce start  s = max(max_i x_i, e_{k−1})
        merge point m_i = x_i + delay_i;    all-reduce end    e = s + allreduce_s
        c_i ← max(m_i, e) + outer_s   (then + the round's ckpt_s after its last fragment)

    (e_{k−1}: one process group runs its all-reduces in issue order.) node_offsets_s (n,), ≤ 0:
    each node's own end of the all-reduce, e_i = e + offset_i, measured per node on unequal links
    (simulator/models/network.py node_sync_offsets_s); the node waits for its own end, the group's next
    all-reduce for the last. The same operations in the same order as the SimPy engine's clock.
    syncs: K, when pre and delay hold fewer rows that repeat (row k % their length: one round's P
    rows of a deterministic plan); with one round's rows and record False, the rounds after the
    first that repeats the one before are added in closed form (PERIODIC_TOL). state: (clock,
    link_free) after the rounds before these (whole rounds), from stream_state of the previous
    chunk; None: the start of the run. record: per sync the arrays of STREAM_FIELDS and node_end_s
    (K, [S,] n), start_s and end_s (K, [S]); else only the totals compute_s, idle_s, comm_s ([S,] n)
    and wall_s. The wait at a merge point splits as wait_split says (comm = exposed + outer step).
    """
    pre, delay = np.asarray(pre, dtype=float), np.asarray(delay, dtype=float)
    k_total = pre.shape[0] if syncs is None else syncs
    period, shape = pre.shape[0], pre.shape[1:]
    a, o = np.asarray(allreduce_s, dtype=float), np.asarray(outer_s, dtype=float)
    o_col = o[..., None] if o.ndim else o
    offsets = None if node_offsets_s is None else np.asarray(node_offsets_s, dtype=float)
    clock, link_free = _stream_start(shape, state)
    totals = {name: np.zeros(shape) for name in ("compute_s", "idle_s", "comm_s")}
    rec = ({**{name: np.empty((k_total, *shape)) for name in (*STREAM_FIELDS, "node_end_s")},
            **{name: np.empty((k_total, *shape[:-1])) for name in ("start_s", "end_s")}} if record else None)
    ckpt = per_round(ckpt_s, -(-k_total // fragments))
    periodic = not record and period == fragments and k_total > period and bool(np.all(ckpt == ckpt[0]))
    resume = clock  # each node's clock after the latest fragment's sync (none yet)
    seen = None  # at the end of the previous round: (normalised state, totals, latest clock)
    for k in range(k_total):
        if periodic and k % period == 0 and k:
            seen, repeated = _round_seen(seen, clock, link_free, resume, totals, (k_total - k) // period)
            if repeated is not None:
                return repeated
        sync_point, merge_point, start, end, start_c, end_c = _fragment_sync(
            clock, pre[k % period], delay[k % period], link_free, a, offsets)
        link_free = end
        waited, idle, exposed, resume = wait_split(merge_point, start_c, end_c, o_col)
        totals["compute_s"] += merge_point - clock
        totals["idle_s"] += idle
        totals["comm_s"] += exposed + (resume - waited)
        if record:
            for name, value in zip(rec, (clock, sync_point, merge_point, resume, end_c, start, end)):
                rec[name][k] = value
        due = ckpt[k // fragments] if (k + 1) % fragments == 0 else 0.0
        clock = resume + due if due else resume
    return rec if record else {**totals, "wall_s": resume.max(axis=-1)}


def _stream_start(shape, state) -> tuple[np.ndarray, np.ndarray]:
    """(each node's clock, when the group's link is next free) at the start of the run or after
    the previous chunk's state (stream_state)."""
    if state is None:
        return np.zeros(shape), np.full(shape[:-1], -np.inf)
    return np.asarray(state[0], dtype=float), np.asarray(state[1], dtype=float)


def _fragment_sync(clock, pre, delay, link_free, allreduce, offsets):
    """One fragment sync of the recurrence: (sync points, merge points, the all-reduce's start and
    end, both again as each node sees them: with a nodes axis where there are scenarios, the end
    plus the node's offset, not before the start)."""
    sync_point = clock + pre
    start = np.maximum(sync_point.max(axis=-1), link_free)
    end = start + allreduce
    start_c, end_c = (start[..., None], end[..., None]) if end.ndim else (start, end)
    if offsets is not None:
        end_c = np.maximum(end_c + offsets, start_c)
    return sync_point, sync_point + delay, start, end, start_c, end_c


# With one round's rows and record False, the rounds are run until the schedule repeats (every
# clock and the link's, less the latest clock, within PERIODIC_TOL of the round before, in seconds
# of the run so far): the rounds after it repeat that round (a max-plus recurrence moves by the
# same amount from states that differ by a shift, and no further apart than they started), so
# they are added in closed form and the cost no longer grows with the rounds.
PERIODIC_TOL = 1e-12  # relative to the run's time so far: well above float64's rounding of the clocks


def _round_seen(seen, clock, link_free, resume, totals, rounds_left: int):
    """At a round's end: (what to compare the next round's end with, and the run's totals in
    closed form if this round repeated the one before, else None)."""
    latest = clock.max(axis=-1)
    state = (clock - latest[..., None], link_free - latest)
    now = ({name: v.copy() for name, v in totals.items()}, latest, resume.max(axis=-1))
    if seen is not None and _same_state(seen[0], state, latest):
        return seen, _repeat_rounds(seen[1:], now, totals, rounds_left)
    return (state, *now), None


def _same_state(before, after, latest) -> bool:
    scale = PERIODIC_TOL * np.maximum(np.abs(latest), 1.0)
    return all(np.all(np.abs(a - b) <= (scale[..., None] if a.ndim > scale.ndim else scale))
               for a, b in zip(before, after))


def _repeat_rounds(before, now, totals: dict, remaining: int) -> dict[str, np.ndarray]:
    """The totals and wall_s after `remaining` more rounds like the last one (before -> now)."""
    (totals_before, _, wall_before), (totals_now, _, wall_now) = before, now
    out = {name: totals_now[name] + remaining * (totals_now[name] - totals_before[name]) for name in totals}
    return {**out, "wall_s": wall_now + remaining * (wall_now - wall_before)}


def stream_state(rec: dict[str, np.ndarray], ckpt_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(clock, link_free) after a chunk of whole rounds of recorded fragment syncs: the state the
    next chunk starts from (run_streaming_analytic's state), the additions of the unchunked loop."""
    resume = np.asarray(rec["resume_s"])[-1]
    return (resume + ckpt_s if ckpt_s else resume), np.asarray(rec["end_s"])[-1]
