"""What the paper leaves unstated, varied: training dtype × payload dtype, and B's memory margin.

- `variants()`: every source of geodt.paper.tables.SOURCES (inferred or catalog step times, fp16
  or bf16 training) under both payload dtypes of the pseudo-gradient all-reduce (fp16, as
  OpenDiLoCo sends it, and fp32), for the paper's strategies and geodt's main ones: total idle,
  idle against the baseline's, sync, round, the sync's share of a round, throughput.
- `memory_band()`: strategy B per node in GiB: what a batch needs by simulator.models.memory, against
  the GPU's memory, with activations and the reserve scaled by ±MEMORY_BAND (the model's two
  uncertain parts; the static 18 B/param is exact for fp32 AdamW with a 16-bit autocast copy).
"""
from __future__ import annotations

import pandas as pd

from facts.catalog import get_gpu
from geodt.paper import facts
from geodt.paper.tables import PAYLOADS, SOURCES, paper_scenarios, plan_for
from simulator.engines.engine import simulate, summary
from simulator.models.memory import activation_bytes_per_sample, reserve_bytes, static_memory_bytes
from simulator.scenario import Scenario

VARIANT_STRATEGIES = ("baseline", "A", "B", "C", "C-slowest", "measured-steps", "hybrid", "network-aware")
MEMORY_BAND = 0.10
GIB = 2**30


def variants() -> pd.DataFrame:
    rows = []
    for payload in PAYLOADS:
        scenarios, _ = paper_scenarios([f"network.payload_dtype={payload}"])
        for source, scenario in scenarios.items():
            steps, dtype = SOURCES[source]
            base = None
            for name in VARIANT_STRATEGIES:
                plan = plan_for(scenario, name)
                per_node = summary(simulate(scenario, plan, "analytic"), plan)
                row = {"steps": steps, "dtype": dtype, "payload_dtype": payload, "strategy": name,
                       "batch_sizes": " ".join(str(n.batch_size) for n in plan.nodes),
                       "local_steps": " ".join(str(n.local_steps) for n in plan.nodes),
                       "total_idle_s": float(per_node["idle_s"].sum()), "sync_s_per_round": plan.comm_s,
                       "round_s": plan.round_s, "sync_share_of_round": plan.comm_s / plan.round_s,
                       "tokens_per_round": int(plan.tokens_per_round),
                       "tokens_per_s": plan.tokens_per_round / plan.round_s,
                       "payload_dtype_used": plan.settings_from(scenario).payload_dtype}
                base = base or row
                row["idle_vs_baseline"] = row["total_idle_s"] / base["total_idle_s"]
                row["tokens_vs_baseline"] = row["tokens_per_round"] / base["tokens_per_round"]
                row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
                rows.append(row)
    return pd.DataFrame(rows)


def _b_batch(need, capacity: float, start: int) -> int:
    """The paper's rule B: double from `start` while the doubled batch fits."""
    batch = start
    while need(batch * 2) <= capacity:
        batch *= 2
    return batch


def memory_band(scenario: Scenario) -> pd.DataFrame:
    """Per node (its smallest-memory GPU): B's batch and margin in GiB, nominal and ±MEMORY_BAND."""
    static = static_memory_bytes(scenario)
    per_sample = activation_bytes_per_sample(scenario)

    def need(scale: float):  # the reserve is the device's (it scales with its memory)
        return lambda b: static + scale * b * per_sample

    b0 = scenario.training.batch_size
    rows = []
    for node in scenario.nodes:
        key = min(node.gpus, key=lambda k: get_gpu(k).memory_bytes)
        cap = get_gpu(key).memory_bytes - reserve_bytes(get_gpu(key).memory_bytes)
        paper_b = facts.TABLE2_BATCH["B"][node.name]
        row = {"node": node.name, "gpu": key, "memory_gib": get_gpu(key).memory_bytes / GIB, "paper_B_batch": paper_b}
        for label, scale in (("low", 1 - MEMORY_BAND), ("nominal", 1.0), ("high", 1 + MEMORY_BAND)):
            b = _b_batch(need(scale), cap, b0)
            row[f"B_batch_{label}"] = b
            row[f"margin_gib_{label}"] = (cap - need(scale)(b)) / GIB
            row[f"need_gib_at_paper_B_{label}"] = need(scale)(paper_b) / GIB
        rows.append(row)
    return pd.DataFrame(rows)
