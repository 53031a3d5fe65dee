"""Tables 1-3 of paper 000, computed by geodt and set beside the paper's own values.

- Table 1: the cluster, GPU by GPU: the paper's TFLOPS, the catalog's memory (GiB) and the
  dense peaks a training step can reach in fp16 and in bf16.
- Table 2: per node mean spec TFLOPS, normalised, and the A, B and C allocations.
- Table 3: idle per node and strategy, predicted from (i) step times inferred from the paper's
  baseline row (geodt.paper.infer) and (ii) the catalog estimate, each in fp16 (the scenario's
  default, OpenDiLoCo's) and bf16, beside the paper's.
  Strategies baseline, A, B, C are simulated with THE PAPER'S allocations (A and C are
  geodt's own; for B geodt's memory model differs, so geodt's B is a separate row `B-geodt`),
  then every other strategy in simulator.strategies.STRATEGIES with geodt's own plans.
- Variants: sync, round and throughput per training dtype × payload dtype.
- Memory: strategy B's margin per node in GiB, with a ±10% band on activations and reserve.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from facts.catalog import get_gpu, peak_tflops
from formats.errors import FieldError, InputError
from formats.plan import Plan
from geodt.paper import facts
from geodt.paper.fmt import round_as_printed
from geodt.paper.infer import Inference, inferred_scenario
from simulator.engines.engine import simulate, summary
from simulator.models.timing import node_timings
from simulator.scenario import Scenario, load_scenario
from simulator.strategies import STRATEGIES, make_plan, node_plan, uniform_plan
from simulator.strategies.paper import mean_spec_tflops, normalized_speed

DTYPES = ("fp16", "bf16")      # fp16 first: the scenario's default (OpenDiLoCo's)
PAYLOADS = ("fp16", "fp32")    # fp16 first: the scenario's default (OpenDiLoCo's)
# source name -> (step times, training dtype)
SOURCES = {"inferred": ("inferred", "fp16"), "inferred_bf16": ("inferred", "bf16"),
           "catalog": ("catalog", "fp16"), "catalog_bf16": ("catalog", "bf16")}


def table1(scenario: Scenario) -> pd.DataFrame:
    """One row per (node, GPU type): the paper's TFLOPS, the catalog's memory and dense peaks.

    The paper's TFLOPS are also the catalog's `paper_tflops` (kept so that A and C reproduce),
    so there is nothing to compare them with; the dense peaks are what geodt's estimates use."""
    rows = []
    for node in scenario.nodes:
        paper_gpus = {key: (count, tflops) for key, count, tflops, _ in facts.TABLE1[node.name]}
        for key, count in node.gpus.items():
            spec = get_gpu(key)
            rows.append({
                "node": node.name, "gpu": key, "count": count, "paper_tflops": paper_gpus[key][1],
                "memory_gib": spec.memory_bytes / 2**30, "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
                **{f"dense_{d}_peak_tflops": peak_tflops(spec, d) for d in DTYPES},
            })
    return pd.DataFrame(rows)


def table2(scenario: Scenario) -> pd.DataFrame:
    """Per node: paper vs geodt average TFLOPS, normalised, A batch, B batch, C local steps."""
    norm = normalized_speed(scenario, mean_spec_tflops)
    plans = {name: make_plan(scenario, name) for name in ("A", "B", "C")}
    rows = []
    for i, node in enumerate(scenario.nodes):
        n = node.name
        avg = mean_spec_tflops(scenario, node)
        row = {"node": n,
               "paper_avg_tflops": facts.TABLE2_AVG_TFLOPS[n], "geodt_avg_tflops": avg,
               "avg_match": round_as_printed(avg, 1) == facts.TABLE2_AVG_TFLOPS[n],
               "paper_normalized": facts.TABLE2_NORMALIZED[n], "geodt_normalized": norm[i],
               "normalized_match": round_as_printed(norm[i], 3) == facts.TABLE2_NORMALIZED[n]}
        for name in ("A", "B"):
            ours = plans[name].nodes[i].batch_size
            row.update({f"paper_{name}_batch": facts.TABLE2_BATCH[name][n], f"geodt_{name}_batch": ours,
                        f"{name}_match": ours == facts.TABLE2_BATCH[name][n]})
        ours = plans["C"].nodes[i].local_steps
        row.update({"paper_C_local_steps": facts.TABLE2_LOCAL_STEPS["C"][n], "geodt_C_local_steps": ours,
                    "C_match": ours == facts.TABLE2_LOCAL_STEPS["C"][n]})
        rows.append(row)
    return pd.DataFrame(rows)


def paper_b_plan(scenario: Scenario) -> Plan:
    """Strategy B with the batches the paper measured (8, 8, 32, 16), H unchanged."""
    h = scenario.training.local_steps
    return uniform_plan("B", scenario, [node_plan(t, facts.TABLE2_BATCH["B"][t.node.name], h)
                                        for t in node_timings(scenario)])


@dataclass(frozen=True)
class Predictions:
    """Simulated plans and per-node results for both step-time sources."""

    scenarios: dict[str, Scenario]     # source -> scenario
    inference: Inference
    plans: dict[tuple[str, str], Plan]  # (source, strategy) -> plan
    per_node: pd.DataFrame              # source, strategy, allocation, node, plan and summary columns
    skipped: dict[str, str]             # strategy -> why it could not be planned


def strategy_names() -> list[str]:
    """The rows of Table 3: the paper's four, geodt's own B, then every other registered strategy."""
    others = [s for s in STRATEGIES if s not in facts.PAPER_STRATEGIES]
    return [*facts.PAPER_STRATEGIES, "B-geodt", *others]


def plan_for(scenario: Scenario, name: str) -> Plan:
    if name == "B":
        return paper_b_plan(scenario)
    if name == "B-geodt":
        plan = make_plan(scenario, "B")
        return Plan(strategy="B-geodt", nodes=plan.nodes, comm_s=plan.comm_s, seq_len=plan.seq_len, note=plan.note)
    return make_plan(scenario, name)


def paper_scenarios(extra: list[str] | None = None) -> tuple[dict[str, Scenario], Inference]:
    """Every source of SOURCES as a scenario (`extra`: more overrides, e.g. the payload dtype)."""
    extra = extra or []
    _inferred, inference = inferred_scenario(extra)
    scenarios = {}
    for source, (steps, dtype) in SOURCES.items():
        base = [*extra, f"model.dtype={dtype}"]
        scenarios[source] = load_scenario("paper", [*base, *inference.overrides()] if steps == "inferred" else base)
    return scenarios, inference


def predict() -> Predictions:
    """Simulate every strategy on the paper cluster under every source (analytic engine)."""
    scenarios, inference = paper_scenarios()
    plans, frames, skipped = {}, [], {}
    for source, scenario in scenarios.items():
        for name in strategy_names():
            try:
                plan = plan_for(scenario, name)
            except (InputError, FieldError) as exc:
                skipped[name] = str(exc)
                continue
            plans[(source, name)] = plan
            totals = summary(simulate(scenario, plan, "analytic"), plan)
            frame = plan.to_frame()[["node", "batch_size", "local_steps", "step_s", "tokens_per_round"]]
            frame = frame.merge(totals.drop(columns="strategy"), on="node")
            frame.insert(0, "allocation", "paper" if name in facts.PAPER_STRATEGIES else "geodt")
            frame.insert(0, "strategy", name)
            frame.insert(0, "source", source)
            frames.append(frame)
    return Predictions(scenarios, inference, plans, pd.concat(frames, ignore_index=True), skipped)


def table3(pred: Predictions) -> pd.DataFrame:
    """Idle per node and strategy: paper, catalog estimate, inferred step times, and differences."""
    wide = pred.per_node.pivot_table(index=["strategy", "node"], columns="source", values="idle_s", sort=False)
    wide = wide.reset_index()
    wide.insert(2, "paper_idle_s", [facts.TABLE3_IDLE_S.get(s, {}).get(n, float("nan"))
                                    for s, n in zip(wide["strategy"], wide["node"])])
    wide = wide.rename(columns={s: f"{s}_idle_s" for s in SOURCES})
    wide["inferred_minus_paper_s"] = wide["inferred_idle_s"] - wide["paper_idle_s"]
    wide["catalog_minus_paper_s"] = wide["catalog_idle_s"] - wide["paper_idle_s"]
    fitted = {"baseline": "in-sample (defines the step times)", "C": "in-sample (fits t_max)"}
    wide.insert(2, "inferred_is", [fitted.get(s, "predicted") for s in wide["strategy"]])
    wide.columns.name = None
    return wide


def strategy_totals(pred: Predictions, scenario_rounds: int) -> pd.DataFrame:
    """Per source and strategy: total idle, sync, tokens, round time, throughput, idle per token."""
    rows = []
    for (source, name), plan in pred.plans.items():
        part = pred.per_node[(pred.per_node["source"] == source) & (pred.per_node["strategy"] == name)]
        idle = float(part["idle_s"].sum())
        tokens = int(plan.tokens_per_round)
        # Streaming DiLoCo's fragments overlap its syncs: its round is the simulated one (the longest node's),
        # not compute + syncs (plan.round_s, exact for every other kind of round)
        round_s = (float((part["compute_s"] + part["idle_s"] + part["comm_s"]).max()) / scenario_rounds
                   if plan.round_kind.supports("fragments") else plan.round_s)
        rows.append({
            "source": source, "strategy": name,
            "batch_sizes": " ".join(str(n.batch_size) for n in plan.nodes),
            "local_steps": " ".join(str(n.local_steps) for n in plan.nodes),
            "paper_total_idle_s": facts.TABLE3_TOTAL_S.get(name, float("nan")),
            "total_idle_s": idle, "sync_s_per_round": plan.fragments * plan.comm_s,
            "compute_s_per_round_slowest": max(n.compute_s for n in plan.nodes),
            "round_s": round_s, "tokens_per_round": tokens,
            "tokens_per_s": tokens / round_s,
            "idle_s_per_mtoken": idle / (tokens * scenario_rounds / 1e6),
            "utilization": float(part["compute_s"].sum() / (part["compute_s"] + part["idle_s"] + part["comm_s"]).sum()),
        })
    return pd.DataFrame(rows)


EQUAL_TOKENS_TOLERANCE = 0.05


def best_geodt_strategy(totals: pd.DataFrame, source: str = "inferred") -> str | None:
    """The best of geodt's own strategies (not the paper's four), judged by idle at equal tokens.

    Strategies whose tokens per round are within EQUAL_TOKENS_TOLERANCE of the baseline's compete
    on total idle (more tokens per round amortise the sync and would win for that reason alone).
    If none keeps the baseline's tokens, the least idle per token among those at least as fast as
    the baseline in tokens per second wins."""
    part = totals[totals["source"] == source]
    base = part[part["strategy"] == "baseline"].iloc[0]
    own = part[~part["strategy"].isin([*facts.PAPER_STRATEGIES, "B-geodt"])]
    equal = own[(own["tokens_per_round"] / base["tokens_per_round"] - 1).abs() <= EQUAL_TOKENS_TOLERANCE]
    if not equal.empty:
        return str(equal.sort_values(["total_idle_s", "strategy"]).iloc[0]["strategy"])
    faster = own[own["tokens_per_s"] >= base["tokens_per_s"]]
    if faster.empty:
        return None
    return str(faster.sort_values(["idle_s_per_mtoken", "strategy"]).iloc[0]["strategy"])
