"""The loss model: a run's loss as a function of the tokens each node trained on and how they were merged.

Loss after D tokens (all nodes together) is a curve L(D) = floor + scale·D^(−exponent) for
identical replicas; a strategy that changes the optimisation trains on
tokens worth η·D of the baseline's, with

    ln η = −Σ_k c_k·x_k(plan, rounds),

x_k the run's features (FEATURES below, 0 for the baseline) and c_k fitted from a convergence
profile's runs (formats/convergence.py; `geodt calibrate convergence`): each run's η is the
token multiplier that best lays its measured loss curve on the baseline's, and c solves
ln η = −X·c by least squares. A feature no profile run varied has no coefficient (η
unaffected, and the model says so).

The curve is the profile's baseline run fitted (where the profile trained the scenario's model
at its sequence length; another node count is the feature replicas_log2 where a profile run
measured it, else the prior's replica factor moves the curve), else the literature prior of
simulator/models/convergence_prior.py (Chinchilla's data term × DiLoCo's replica factor) at the
scenario's parameters. A round's loss is the curve at the middle of its
tokens (what the executor logs: the mean of the round's inner-step losses); the loss that decides
the time to a target is its trailing mean over SMOOTH_ROUNDS rounds (measured losses are noisy
round to round; predicted and measured go through the same rule, `time_to_target`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from formats.rounds import is_streaming
from simulator.models.convergence_prior import diloco_factor, prior_loss

FEATURES: dict[str, str] = {
    "work_cv2_plain": "unequal work per node, plainly averaged (squared CV of tokens over nodes)",
    "work_cv2_weighted": "unequal work per node, averaged by tokens (squared CV of tokens over nodes)",
    "batch_log2": "batch against the baseline's (token-weighted mean log2 ratio)",
    "steps_log2": "local steps against the baseline's (token-weighted mean log2 ratio)",
    "staleness": "fragments merged late: tau over a fragment's inner steps (Streaming DiLoCo)",
    "payload_bits": "pseudo-gradient precision lost (log2 of fp32 bytes over the payload's)",
    "missed": "node-rounds missed by nodes that left (share)",
    "replicas_log2": "nodes against the profile baseline's (log2 ratio): DiLoCo's replicas M",
    "update_staleness": "merged without a barrier (async, quorum): others' pseudo-gradients merged between a "
                        "node's pull and its merge, over the nodes (mean)",
}
PAYLOAD_BITS = {"fp32": 0.0, "fp16": 1.0, "bf16": 1.0, "int8": 2.0}
SMOOTH_ROUNDS = 3
RIDGE = 1e-3  # keeps c finite where two runs vary the same features alike; small against ln η's noise


@dataclass(frozen=True)
class LossCurve:
    """L(D) = floor + scale·D^(−exponent), D in tokens of all nodes; `source` says where it came from."""

    floor: float
    scale: float
    exponent: float
    source: str
    ceiling: float = float("inf")  # the loss of the untrained model: the power law is no curve before it

    def loss(self, tokens) -> np.ndarray:
        power = self.floor + self.scale * np.maximum(np.asarray(tokens, dtype=float), 1.0) ** -self.exponent
        return np.minimum(power, self.ceiling)

    def scaled(self, factor: float, source: str) -> LossCurve:
        return LossCurve(self.floor * factor, self.scale * factor, self.exponent, source, self.ceiling * factor)


def fit_curve(tokens: np.ndarray, loss: np.ndarray, source: str) -> LossCurve:
    """Least squares over the exponent (a grid), floor and scale linear at each: a closed form per exponent."""
    best = None
    for exponent in np.geomspace(0.02, 3.0, 400):
        x = tokens ** -exponent
        design = np.column_stack([np.ones_like(x), x])
        (floor, scale), *_ = np.linalg.lstsq(design, loss, rcond=None)
        if scale <= 0 or floor <= 0:
            continue
        sse = float(((floor + scale * x - loss) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, floor, scale, exponent)
    if best is None:
        raise ValueError(f"{source}: the loss does not fall with tokens; expected a learning run")
    return LossCurve(float(best[1]), float(best[2]), float(best[3]), source)


def prior_curve(params: float, replicas: int) -> LossCurve:
    """The literature prior at this model and node count, as a LossCurve (its floor: infinite data)."""
    factor = float(diloco_factor(params, replicas))
    at = np.array([1e6, 1e9])
    full = prior_loss(params, at, replicas)
    floor = float(prior_loss(params, 1e30, replicas))
    exponent = float(np.log((full[0] - floor) / (full[1] - floor)) / np.log(at[1] / at[0]))
    scale = float((full[0] - floor) * at[0] ** exponent)
    return LossCurve(floor, scale, exponent, f"prior: Chinchilla data term (Besiroglu et al. 2024) x DiLoCo "
                                            f"M={replicas} factor {factor:.3f} (Charles et al. 2025)")


def round_frame(timeline: pd.DataFrame, batch: dict, gpus: dict, seq_len: int) -> pd.DataFrame:
    """Per round of a timeline or trace: tokens, end, and the per-round parts of the features
    (`batch` and `gpus` per plan node: a node away for a round has no row, or one without tokens; the
    stale work of a merge without a barrier: _stale_work)."""
    t = timeline[["node", "round", "tokens", "round_end_s"] + (["loss"] if "loss" in timeline else [])].copy()
    # .astype(float): a categorical node column maps to a categorical when every value differs
    t["batch"] = t["node"].map(batch).astype(float)
    t["steps"] = t["tokens"] / (t["batch"] * t["node"].map(gpus).astype(float) * seq_len)
    t["present"] = t["tokens"] > 0
    t["log2_batch_w"] = np.log2(t["batch"]) * t["tokens"]
    t["log2_steps_w"] = np.log2(t["steps"].where(t["present"], 1.0)) * t["tokens"]
    t["stale_work"] = _stale_work(timeline)
    if "loss" in t:
        t["loss_w"] = t["loss"].where(t["present"], 0.0) * t["tokens"]
    g = t.groupby("round", sort=True)
    out = pd.DataFrame({"tokens": g["tokens"].sum(), "end_s": g["round_end_s"].max(),
                        "nodes": len(batch), "present": g["present"].sum(),
                        "log2_batch_w": g["log2_batch_w"].sum(), "log2_steps_w": g["log2_steps_w"].sum(),
                        "stale_work": g["stale_work"].sum()})
    live = t[t["present"]].groupby("round")["tokens"]
    out["cv2"] = ((live.std(ddof=0) / live.mean()) ** 2).reindex(out.index).fillna(0.0)
    if "loss" in t:
        out["loss"] = g["loss_w"].sum() / out["tokens"].where(out["tokens"] > 0)
    return out.reset_index()


def _stale_work(timeline: pd.DataFrame):
    """Per node-round, the others' pseudo-gradients merged between its pull and its merge: the simulator's
    `stale_work`; else a trace's or profile's `staleness` (async, the executor's only run without a
    barrier: one pseudo-gradient per global update, so the two are one number); else 0 (a barrier)."""
    for column in ("stale_work", "staleness"):
        if column in timeline:
            return timeline[column].to_numpy(float)
    return 0.0


def features(rounds: pd.DataFrame, *, base_batch: float, base_steps: float, averaging: str, fragments: int,
             sync_delay_steps: int, payload_dtype: str, ref_nodes: int) -> dict[str, float]:
    """x_k of FEATURES for a run, from its round_frame (ref_nodes: the profile baseline's node count)."""
    tokens = rounds["tokens"].sum()
    x = feature_values(cv2=rounds["cv2"].mean(), log2_batch=rounds["log2_batch_w"].sum() / tokens,
                       log2_steps=rounds["log2_steps_w"].sum() / tokens,
                       missed=1.0 - rounds["present"].sum() / rounds["nodes"].sum(), base_batch=base_batch,
                       base_steps=base_steps, averaging=averaging, fragments=fragments,
                       sync_delay_steps=sync_delay_steps, payload_dtype=payload_dtype,
                       nodes=rounds["nodes"].iloc[0], ref_nodes=ref_nodes,
                       stale_work=rounds["stale_work"].sum() / max(1, rounds["present"].sum()))
    return {k: float(v) for k, v in x.items()}


def feature_values(*, cv2, log2_batch, log2_steps, missed, base_batch: float, base_steps: float, averaging: str,
                   fragments, sync_delay_steps, payload_dtype, nodes, ref_nodes, stale_work=0.0) -> dict:
    """FEATURES from a run's aggregates (scalars, or numpy arrays of runs: the sweep's): cv2 the mean over
    rounds of the nodes' squared CV of tokens, log2_batch and log2_steps token-weighted means, missed
    the share of node-rounds without training, nodes the run's node count, stale_work the mean over merged
    pseudo-gradients of the others merged between the node's pull and its merge (0 with a barrier)."""
    weighted = averaging != "uniform"
    fragments, delay = np.asarray(fragments), np.asarray(sync_delay_steps)
    streaming = is_streaming(fragments, delay)
    bits = np.vectorize(lambda d: PAYLOAD_BITS.get(d, 0.0), otypes=[float])(np.asarray(payload_dtype))
    return {
        "work_cv2_plain": 0.0 * cv2 if weighted else cv2,
        "work_cv2_weighted": cv2 if weighted else 0.0 * cv2,
        "batch_log2": log2_batch - np.log2(base_batch),
        "steps_log2": log2_steps - np.log2(base_steps),
        "staleness": np.where(streaming, delay / (base_steps / np.maximum(1, fragments)), 0.0),
        "payload_bits": bits,
        "missed": missed,
        "replicas_log2": np.log2(nodes / ref_nodes) + 0.0 * cv2,
        "update_staleness": stale_work / nodes + 0.0 * cv2,
    }


def token_middles(rounds: pd.DataFrame) -> np.ndarray:
    """The run's tokens at the middle of each round (what a round's mean inner-step loss sees)."""
    tokens = rounds["tokens"].to_numpy(dtype=float)
    return np.cumsum(tokens) - tokens / 2


def curve_losses(curve: LossCurve, rounds: pd.DataFrame, efficiency: float) -> np.ndarray:
    """Each round's loss: the curve at the middle of its tokens, the tokens worth `efficiency` of the baseline's."""
    return curve.loss(efficiency * token_middles(rounds))


def smoothed(loss: np.ndarray) -> np.ndarray:
    """The trailing mean over SMOOTH_ROUNDS rounds (fewer at the start)."""
    return smoothed_rows(np.asarray(loss, dtype=float)[None])[0]


def smoothed_rows(loss: np.ndarray) -> np.ndarray:
    """smoothed for each row of a (runs, rounds) array."""
    csum = np.cumsum(loss, axis=1)
    lagged = np.concatenate([np.zeros((len(loss), SMOOTH_ROUNDS)), csum[:, :-SMOOTH_ROUNDS]], axis=1)[:, :loss.shape[1]]
    return (csum - lagged) / np.minimum(np.arange(1, loss.shape[1] + 1), SMOOTH_ROUNDS)


def time_to_target(end_s: np.ndarray, loss: np.ndarray, target: float) -> float:
    """When the smoothed loss first reaches `target`: interpolated between round ends; inf if never."""
    return float(times_to_target(np.asarray(end_s, float)[None], np.asarray(loss, float)[None], target)[0])


def times_to_target(end_s: np.ndarray, loss: np.ndarray, target: float) -> np.ndarray:
    """time_to_target for each row of (runs, rounds) arrays."""
    s = smoothed_rows(loss)
    below = s <= target
    r = np.argmax(below, axis=1)
    rows = np.arange(len(s))
    prev = np.maximum(r - 1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(r > 0, (s[rows, prev] - target) / (s[rows, prev] - s[rows, r]), 1.0)
    at = np.where(r > 0, end_s[rows, prev] + share * (end_s[rows, r] - end_s[rows, prev]), end_s[rows, 0])
    return np.where(below.any(axis=1), at, np.inf)


@dataclass(frozen=True)
class ConvergenceModel:
    """The curve and the fitted effects; `runs` holds each profile run's measured η and features."""

    curve: LossCurve
    coefficients: dict[str, float] = field(default_factory=dict)  # c_k of the calibrated features
    runs: pd.DataFrame | None = field(default=None, compare=False)
    ref_nodes: int = 1  # the node count of the profile's baseline run (replicas_log2's reference)

    def efficiency(self, x: dict[str, float]) -> float:
        return float(np.exp(-sum(c * x.get(k, 0.0) for k, c in self.coefficients.items())))

    def uncalibrated(self, x: dict[str, float]) -> list[str]:
        """Features this run has that no profile run measured (assumed no effect)."""
        return [k for k, v in x.items() if abs(v) > 1e-9 and k not in self.coefficients]

    def with_curve(self, curve: LossCurve) -> ConvergenceModel:
        return ConvergenceModel(curve, self.coefficients, self.runs, self.ref_nodes)


def run_efficiency(curve: LossCurve, rounds: pd.DataFrame) -> float:
    """The η whose curve best fits the run's measured round losses (rounds >= 1), by a log grid."""
    keep = rounds["round"].to_numpy() >= 1
    measured = rounds["loss"].to_numpy()[keep]
    grid = np.exp(np.linspace(-2.5, 2.5, 1001))
    middle = token_middles(rounds)[keep]
    sse = np.nansum((curve.loss(grid[:, None] * middle[None, :]) - measured[None, :]) ** 2, axis=1)
    return float(grid[int(np.argmin(sse))])


def fit_model(profile: pd.DataFrame, source: str) -> ConvergenceModel:
    """The curve from the baseline run, each run's η, and c from all runs (module docstring)."""
    runs, rows = [], {}
    named = profile[profile["run"] == "baseline"]  # calibrate convergence's; else the first baseline-strategy run
    ref_nodes = int((named if len(named) else profile[profile["strategy"] == "baseline"])["nodes"].iloc[0])
    for name, g in profile.groupby("run", sort=False):
        first = g.iloc[0]
        batch = dict(zip(g["node"], g["batch_size"]))
        gpus = dict(zip(g["node"], g["gpus"]))
        # a node's batch is constant over a run; its local steps come from its tokens
        frame = round_frame(g, batch, gpus, int(first["seq_len"]))
        rows[name] = frame
        runs.append({"run": name, "strategy": first["strategy"], **features(
            frame, base_batch=first["base_batch_size"], base_steps=first["base_local_steps"],
            averaging=first["averaging"], fragments=int(first["fragments"]),
            sync_delay_steps=int(first["sync_delay_steps"]), payload_dtype=first["payload_dtype"],
            ref_nodes=ref_nodes)})
    runs = pd.DataFrame(runs)
    base = runs[(runs["strategy"] == "baseline") & (runs["replicas_log2"] == 0)]["run"].iloc[0]
    b = rows[base]
    middle = token_middles(b)
    keep = b["round"].to_numpy() >= 1  # round 0 starts from the random init: not the curve's shape
    curve = fit_curve(middle[keep], b["loss"].to_numpy(float)[keep], f"fitted: {source}, run {base}")
    curve = replace(curve, ceiling=float(b["loss"].iloc[0]))
    runs["efficiency"] = [run_efficiency(curve, rows[r]) for r in runs["run"]]
    x = runs[list(FEATURES)].to_numpy(float)
    varied = [k for j, k in enumerate(FEATURES) if np.abs(x[:, j]).max() > 1e-9]
    coefficients = {}
    if varied:
        xv = runs[varied].to_numpy(float)
        y = -np.log(runs["efficiency"].to_numpy(float))
        lhs = np.vstack([xv, np.sqrt(RIDGE) * np.eye(len(varied))])
        c, *_ = np.linalg.lstsq(lhs, np.concatenate([y, np.zeros(len(varied))]), rcond=None)
        coefficients = dict(zip(varied, map(float, c)))
    model = ConvergenceModel(curve, coefficients, runs, ref_nodes)
    runs["efficiency_fitted"] = [model.efficiency(r) for r in runs[list(FEATURES)].to_dict("records")]
    return model


def replica_move(curve: LossCurve, params: float, from_nodes: int, to_nodes: int) -> LossCurve:
    """The fitted curve moved to another node count by the prior's replica factor (Charles et al. 2025)."""
    if from_nodes == to_nodes:
        return curve
    ratio = float(diloco_factor(params, to_nodes) / diloco_factor(params, from_nodes))
    return curve.scaled(ratio, f"{curve.source}, moved from {from_nodes} to {to_nodes} nodes (x{ratio:.4f}, "
                               "Charles et al. 2025)")
