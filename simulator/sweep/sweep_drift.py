"""`geodt sweep --drift`: every node of every swept scenario drifts (simulator/models/drift.py's events).

The drift is a TOML list of events, as a node's `drift` key, applied to each node of each
scenario; a walk draws its own path per scenario and node, from (sweep seed, DRIFT_STREAM,
scenario_id, node position), so the sweep samples drift as it samples node mixes. Under drift a
round no longer repeats, so the metrics are sums over rounds (the analytic engine's arithmetic,
vectorised over scenarios; tests/test_adaptive.py checks them against `simulate`):

    compute[r] = steps[r] × step_s × factor[r];  idle = Σ_r Σ_i (max_j compute_j[r] − compute_i[r])
    round_s = wall / R with wall = Σ_r (max_i compute_i[r] + comm_s)

Plans with adapt re-plan every round from the last round's step times (formats/adaptive.py;
deterministic steps: the measured step is step_s × factor). Streaming DiLoCo rows run the
fragment-sync recurrence on drifted segments.
"""
from __future__ import annotations

import numpy as np

from formats.adaptive import DEADLINE_SLACK, rebalance_steps, round_time_s
from formats.config import coerce
from formats.errors import FieldError, InputError
from formats.rounds import is_streaming
from formats.toml import tomllib
from simulator.engines.engine_analytic import run_streaming_analytic
from simulator.models.drift import DRIFT_STREAM, DriftEvent, event_factors
from simulator.strategies.streaming import segments


def parse_drift(text: str) -> tuple[DriftEvent, ...]:
    """--drift's TOML list of events; InputError naming --drift and the key."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--drift {text}: expected a TOML list of drift events like "
                         f"[{{kind = \"walk\", spread = 0.05}}] ({exc})") from None
    try:
        return coerce(value, tuple[DriftEvent, ...], "drift")
    except FieldError as exc:
        raise InputError(f"--drift: {exc.key}: {exc.expected}") from None


def sweep_factors(events, rounds: int, scenario_ids: np.ndarray, nodes: int, seed: int) -> np.ndarray:
    """(rounds, S, n) step-time multipliers of the events for each scenario and node."""
    out = np.empty((rounds, len(scenario_ids), nodes))
    for s, sid in enumerate(np.asarray(scenario_ids).tolist()):
        for i in range(nodes):
            out[:, s, i] = event_factors(events, rounds, (seed, DRIFT_STREAM, sid, i))
    return out


def _adaptive_steps(d: dict, factors: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """(R, S, n) steps of an adaptive plan's rounds under the factors (deterministic steps)."""
    units = d["batch"] * gpus
    samples = (d["steps"] * units).sum(axis=1)
    steps = np.empty(factors.shape, dtype=np.int64)
    estimate = d["step_s"]
    for r in range(len(factors)):
        if d["adapt"] == "rebalance":
            steps[r] = d["steps"] if r == 0 else rebalance_steps(estimate, units, samples)
        else:
            deadline = round_time_s(estimate, units, samples)
            # keep_stepping on equal steps t: k steps where (k + 1)·t passes the deadline (with its slack)
            step = d["step_s"] * factors[r]
            steps[r] = np.maximum(1, np.floor(deadline[:, None] * (1 + DEADLINE_SLACK) / step)).astype(np.int64)
        estimate = d["step_s"] * factors[r]
    return steps


def drifted_metrics(d: dict, gpus: np.ndarray, seq_len: int, factors: np.ndarray, outer_s=None) -> dict:
    """simulator.sweep.sweep.metrics' columns for one strategy's decisions under drift factors (R, S, n)."""
    rounds = len(factors)
    adapt = d.get("adapt")
    steps = _adaptive_steps(d, factors, gpus) if adapt else np.broadcast_to(d["steps"], factors.shape)
    compute = steps * d["step_s"] * factors
    slowest = compute.max(axis=2)
    comm = np.broadcast_to(np.asarray(d["comm_s"], dtype=float), slowest.shape[1:])
    wall = (slowest + comm).sum(axis=0)
    idle = (slowest[..., None] - compute).sum(axis=(0, 2))
    fragments = np.broadcast_to(np.asarray(d.get("fragments", 1)), slowest.shape[1:])
    delay = np.broadcast_to(np.asarray(d.get("delay", 0)), slowest.shape[1:])
    streaming = is_streaming(fragments, delay)
    for p in np.unique(fragments[streaming]).tolist():
        idx = np.flatnonzero(streaming & (fragments == p))
        wall[idx], idle[idx] = _streaming(d, idx, int(p), delay[idx], factors[:, idx], outer_s)
    tokens_round = (steps * d["batch"] * gpus).sum(axis=2) * seq_len  # (R, S)
    tokens = tokens_round.sum(axis=0)
    n = compute.shape[2]
    return {"round_s": wall / rounds, "wall_s": wall, "comm_s": comm + 0.0, "idle_s": idle,
            "idle_floor_s": (d["step_s"] * factors).sum(axis=(0, 2)),
            "utilization": compute.sum(axis=(0, 2)) / (n * wall),
            "tokens_per_round": tokens // rounds, "tokens": tokens, "tokens_per_s": tokens / wall}


def _streaming(d, idx, fragments, delay, factors, outer_s):
    """(wall_s, idle_s) of streaming rows idx under drift: the recurrence on drifted segments."""
    rows = len(d["steps"])
    outer = np.broadcast_to(np.asarray(outer_s, dtype=float), (rows,))[idx] / fragments
    allreduce = np.broadcast_to(np.asarray(d["comm_s"], dtype=float), (rows,))[idx] - outer
    pre, window = segments(d["steps"][idx], d["step_s"][idx], fragments, delay)  # (P, S', n)
    scale = np.repeat(factors, fragments, axis=0)  # (R·P, S', n)
    pre, window = np.tile(pre, (len(factors), 1, 1)) * scale, np.tile(window, (len(factors), 1, 1)) * scale
    out = run_streaming_analytic(pre, window, allreduce, outer, fragments, record=False)
    return out["wall_s"], out["idle_s"].sum(axis=1)
