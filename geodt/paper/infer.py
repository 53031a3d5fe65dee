"""Per-node step times inferred from the paper's own measurements (docs/PAPERS.md 000, Table 3).

In a synchronous round every node waits for the slowest, so with the baseline's equal H and b

    idle_i = rounds × H × (t_max − t_i)        ⇒   t_i = t_max − idle_i / (rounds × H)

The baseline row pins every difference t_max − t_i but not t_max itself: one free parameter.
We choose t_max by least squares against the paper's strategy-C row. C changes only H_i and
keeps every node at the baseline batch, so its idle depends on exactly the t_i above and on
t_max, and on nothing else (no assumption about how t grows with b):

    idle_i^C(t_max) = rounds × (max_j H_j t_j − H_i t_i)

which is piecewise linear in t_max; the fit minimises Σ_i (idle_i^C − paper_i^C)². Rows A and
B (which change b) are then out-of-sample predictions, made with the catalog estimate's shape
of t(b) scaled to the inferred t_i (simulator.models.timing: step_time_s · est(b) / est(b_base)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from geodt.paper import facts
from simulator.scenario import Scenario, load_scenario
from simulator.strategies import make_plan


@dataclass(frozen=True)
class Inference:
    """The inferred step times and how they were obtained."""

    nodes: tuple[str, ...]
    slowest: str                       # the baseline's slowest node (paper idle 0)
    gaps_s: tuple[float, ...]          # t_max − t_i per node, from the baseline row
    t_max_s: float                     # the fitted free parameter
    c_local_steps: tuple[int, ...]     # H_i of strategy C (from geodt's plan)
    c_sse_s2: float                    # residual sum of squares of the fit against paper's C row
    c_fitted_idle_s: tuple[float, ...]

    @property
    def step_s(self) -> tuple[float, ...]:
        return tuple(self.t_max_s - g for g in self.gaps_s)

    def overrides(self) -> list[str]:
        """`--set` overrides that give each node of the paper scenario its inferred step time."""
        return [f"nodes.{n}.step_time_s={t!r}" for n, t in zip(self.nodes, self.step_s)]


def c_idle_s(t_max: np.ndarray, gaps: np.ndarray, local_steps: np.ndarray, rounds: int) -> np.ndarray:
    """Strategy C's idle per node (columns) for each candidate t_max (rows)."""
    compute = local_steps * (t_max[:, None] - gaps[None, :])
    return rounds * (compute.max(axis=1, keepdims=True) - compute)


def fit_t_max(gaps: np.ndarray, local_steps: np.ndarray, target: np.ndarray, rounds: int,
              use: np.ndarray | None = None) -> float:
    """The t_max minimising Σ over the nodes in `use` of (idle_i^C(t_max) − target_i)² (module docstring)."""
    use = np.ones(len(gaps), bool) if use is None else np.asarray(use, bool)
    # A coarse log grid finds which node is slowest under C at the optimum; within that piece
    # the residuals are linear in t_max and the least-squares optimum has a closed form.
    lo = gaps.max() * (1 + 1e-6) + 1e-9
    grid = np.geomspace(lo, 100.0, 200_001)
    sse = ((c_idle_s(grid, gaps, local_steps, rounds) - target)[:, use] ** 2).sum(axis=1)
    best = grid[int(np.argmin(sse))]
    k = int(np.argmax(local_steps * (best - gaps)))
    slope = (rounds * (local_steps[k] - local_steps))[use]
    offset = (rounds * (local_steps * gaps - local_steps[k] * gaps[k]) - target)[use]
    t_max = float(-(slope @ offset) / (slope @ slope)) if slope @ slope > 0 else float(best)
    if not (t_max > lo and int(np.argmax(local_steps * (t_max - gaps))) == k):
        t_max = float(best)  # the closed form left its piece: keep the grid's answer
    return t_max


def _c_inputs(scenario: Scenario):
    rounds, h = scenario.training.rounds, scenario.training.local_steps
    nodes = tuple(n.name for n in scenario.nodes)
    base = facts.TABLE3_IDLE_S["baseline"]
    gaps = np.array([base[n] / (rounds * h) for n in nodes])
    local_steps = np.array([p.local_steps for p in make_plan(scenario, "C").nodes], dtype=float)
    target = np.array([facts.TABLE3_IDLE_S["C"][n] for n in nodes])
    return rounds, nodes, gaps, local_steps, target


def infer(scenario: Scenario) -> Inference:
    """Fit t_max to the paper's C row, given the gaps from its baseline row (module docstring)."""
    rounds, nodes, gaps, local_steps, target = _c_inputs(scenario)
    slowest = nodes[int(np.argmin(gaps))]
    t_max = fit_t_max(gaps, local_steps, target, rounds)
    fitted = c_idle_s(np.array([t_max]), gaps, local_steps, rounds)[0]
    return Inference(nodes=nodes, slowest=slowest, gaps_s=tuple(float(g) for g in gaps), t_max_s=t_max,
                     c_local_steps=tuple(int(x) for x in local_steps),
                     c_sse_s2=float(((fitted - target) ** 2).sum()),
                     c_fitted_idle_s=tuple(float(x) for x in fitted))


def c_row_checks(scenario: Scenario, anchor_t_max_s: float) -> list[dict]:
    """Row C three ways, per node: fitted on all four nodes (in-sample), fitted on the other three
    (leave-one-node-out: a prediction of the node left out), and with t_max set outside the paper
    (`anchor_t_max_s`, the catalog estimate of the baseline's slowest node) with no fit at all."""
    rounds, nodes, gaps, local_steps, target = _c_inputs(scenario)
    t_all = fit_t_max(gaps, local_steps, target, rounds)
    idle = lambda t: c_idle_s(np.array([t]), gaps, local_steps, rounds)[0]
    in_sample, anchored = idle(t_all), idle(anchor_t_max_s)
    rows = []
    for k, node in enumerate(nodes):
        t_k = fit_t_max(gaps, local_steps, target, rounds, use=np.arange(len(nodes)) != k)
        rows.append({"node": node, "paper_C_idle_s": float(target[k]),
                     "in_sample_t_max_ms": t_all * 1e3, "in_sample_idle_s": float(in_sample[k]),
                     "lono_t_max_ms": t_k * 1e3, "lono_idle_s": float(idle(t_k)[k]),
                     "anchored_t_max_ms": anchor_t_max_s * 1e3, "anchored_idle_s": float(anchored[k])})
    return rows


def inferred_scenario(base_overrides: list[str] | None = None) -> tuple[Scenario, Inference]:
    """The paper scenario with every node's step_time_s set to the inferred value."""
    catalog = load_scenario("paper", base_overrides or [])
    inference = infer(catalog)
    return load_scenario("paper", [*(base_overrides or []), *inference.overrides()]), inference
