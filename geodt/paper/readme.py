"""The generated results/paper/README.md, rendered from the CSV files alone.

`render(frames, names)` takes the output CSVs as parsed back from their text (name -> DataFrame),
so every number in the README is one a reader finds in a CSV: the tables are the CSVs in
markdown, and the prose is the hand-written TEMPLATE (geodt/paper/template.py) whose few numbers `numbers(frames)` reads
off those same tables. tests/test_paper.py re-renders the committed README from the committed
CSVs and compares byte for byte.
"""
from __future__ import annotations

import pandas as pd

from geodt.paper.fmt import markdown
from geodt.paper.template import TEMPLATE

PAPER_STRATEGIES = ("baseline", "A", "B", "C")


def _one(frame: pd.DataFrame, **where) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for key, value in where.items():
        mask &= frame[key] == value
    rows = frame[mask]
    if len(rows) != 1:
        raise ValueError(f"expected one row where {where}, found {len(rows)}")
    return rows.iloc[0]


def best_strategy(totals: pd.DataFrame, source: str = "inferred", tolerance: float = 0.05) -> str:
    """geodt.paper.tables.best_geodt_strategy's rule, on the CSV: least idle within ±5% of the baseline's tokens."""
    part = totals[totals["source"] == source]
    base = _one(part, strategy="baseline")
    own = part[~part["strategy"].isin([*PAPER_STRATEGIES, "B-geodt"])]
    equal = own[(own["tokens_per_round"] / base["tokens_per_round"] - 1).abs() <= tolerance]
    return str(equal.sort_values(["total_idle_s", "strategy"]).iloc[0]["strategy"])


def numbers(f: dict[str, pd.DataFrame]) -> dict[str, object]:
    """The prose's numbers, each read off one of the CSVs."""
    return {**_cluster_numbers(f), **_dtype_numbers(f), **_strategy_numbers(f), **_related_numbers(f)}


def _cluster_numbers(f: dict[str, pd.DataFrame]) -> dict[str, object]:
    """Table 1, Table 2's memory, the step times and row C."""
    c = f["c_row_checks.csv"].set_index("node")
    st = f["inferred_step_times.csv"].set_index("node")
    mem = f["memory_b.csv"].set_index("node")
    totals = f["table3_strategies.csv"]
    t3 = f["table3_idle.csv"]
    slowest = st["baseline_idle_s"].idxmin()
    a = t3[t3["strategy"] == "A"].set_index("node")
    t1 = f["table1_cluster.csv"].set_index("gpu")
    return {
        # Table 1
        "rtx_fp16": t1.loc["rtx-3090", "dense_fp16_peak_tflops"],
        "v100_fp16": t1.loc["v100-pcie", "dense_fp16_peak_tflops"],
        "v100_bf16": t1.loc["v100-pcie", "dense_bf16_peak_tflops"],
        "node4_bf16": st.loc["node4", "catalog_bf16_step_s"], "node2_bf16": st.loc["node2", "catalog_bf16_step_s"],
        # Table 2 / memory
        "mem_need_32": mem.loc["node3", "need_gib_at_paper_B_nominal"],
        "mem_need_32_lo": mem.loc["node3", "need_gib_at_paper_B_low"],
        "mem_need_32_hi": mem.loc["node3", "need_gib_at_paper_B_high"],
        "mem_a30": mem.loc["node3", "memory_gib"],
        "mem_margin_16": mem.loc["node3", "margin_gib_nominal"],
        "mem_margin_16_lo": mem.loc["node3", "margin_gib_high"],
        "mem_margin_16_hi": mem.loc["node3", "margin_gib_low"],
        "mem_margin_8": mem.loc["node1", "margin_gib_nominal"],
        "mem_margin_8_lo": mem.loc["node1", "margin_gib_high"],
        "mem_margin_8_hi": mem.loc["node1", "margin_gib_low"],
        # step times and row C
        "slowest": slowest,
        "t_max_ms": c["in_sample_t_max_ms"].iloc[0],
        "c_sse": float(((c["in_sample_idle_s"] - c["paper_C_idle_s"]) ** 2).sum()),
        "lono_worst": float((c["lono_idle_s"] - c["paper_C_idle_s"]).abs().max()),
        "lono_worst_node": (c["lono_idle_s"] - c["paper_C_idle_s"]).abs().idxmax(),
        "lono_t_lo": c["lono_t_max_ms"].min(), "lono_t_hi": c["lono_t_max_ms"].max(),
        "anchor_ms": c["anchored_t_max_ms"].iloc[0],
        "anchor_total": c["anchored_idle_s"].sum(),
        "anchor_slowest": c["anchored_idle_s"].idxmin(),
        "implied_tflops": st.loc["node1", "implied_tflops_per_gpu"],
        "inferred_ms_node1": st.loc["node1", "inferred_step_s"] * 1e3,
        "ratio_lo": (st["catalog_step_s"] / st["inferred_step_s"]).min(),
        "ratio_hi": (st["catalog_step_s"] / st["inferred_step_s"]).max(),
        "a_worst": float(a["inferred_minus_paper_s"].abs().max()),
        "a_worst_node": a["inferred_minus_paper_s"].abs().idxmax(),
        "b_inferred_total": _one(totals, source="inferred", strategy="B")["total_idle_s"],
    }


def _dtype_numbers(f: dict[str, pd.DataFrame]) -> dict[str, object]:
    """Training dtype and payload dtype variants."""
    v = f["variants.csv"]
    base = _one(f["table3_strategies.csv"], source="inferred", strategy="baseline")

    def var(steps, dtype, payload, strategy, col):
        return _one(v, steps=steps, dtype=dtype, payload_dtype=payload, strategy=strategy)[col]

    return {
        # dtype and payload
        "c_cat_fp16": (1 - var("catalog", "fp16", "fp16", "C", "idle_vs_baseline")) * 100,
        "c_cat_bf16": (var("catalog", "bf16", "fp16", "C", "idle_vs_baseline") - 1) * 100,
        "cs_cat_fp16": (1 - var("catalog", "fp16", "fp16", "C-slowest", "idle_vs_baseline")) * 100,
        "cs_cat_bf16": (var("catalog", "bf16", "fp16", "C-slowest", "idle_vs_baseline") - 1) * 100,
        "a_cat_fp16": (1 - var("catalog", "fp16", "fp16", "A", "idle_vs_baseline")) * 100,
        "a_cat_bf16": (var("catalog", "bf16", "fp16", "A", "idle_vs_baseline") - 1) * 100,
        "base_cat_fp16": var("catalog", "fp16", "fp16", "baseline", "total_idle_s"),
        "base_cat_bf16": var("catalog", "bf16", "fp16", "baseline", "total_idle_s"),
        "sync16": var("inferred", "fp16", "fp16", "baseline", "sync_s_per_round"),
        "sync32": var("inferred", "fp16", "fp32", "baseline", "sync_s_per_round"),
        "share16": var("inferred", "fp16", "fp16", "baseline", "sync_share_of_round") * 100,
        "share32": var("inferred", "fp16", "fp32", "baseline", "sync_share_of_round") * 100,
        "cat_share16": var("catalog", "fp16", "fp16", "baseline", "sync_share_of_round") * 100,
        "cat_share32": var("catalog", "fp16", "fp32", "baseline", "sync_share_of_round") * 100,
        "sync_idle_10": base["sync_s_per_round"] * 10,
    }


def _strategy_numbers(f: dict[str, pd.DataFrame]) -> dict[str, object]:
    """geodt's best strategy against the baseline, and the timeline."""
    totals = f["table3_strategies.csv"]
    best = best_strategy(totals)
    base = _one(totals, source="inferred", strategy="baseline")
    brow = _one(totals, source="inferred", strategy=best)
    return {
        # best strategy and timeline
        "best": best, "best_idle": brow["total_idle_s"],
        "best_tokens_pct": brow["tokens_per_round"] / base["tokens_per_round"] * 100,
        "best_speedup": brow["tokens_per_s"] / base["tokens_per_s"],
        "best_b": brow["batch_sizes"], "best_h": brow["local_steps"],
        "idle_round_base": base["total_idle_s"] / 10,
        "idle_round_c": _one(totals, source="inferred", strategy="C")["total_idle_s"] / 10,
        "idle_round_best": brow["total_idle_s"] / 10,
    }


def _related_numbers(f: dict[str, pd.DataFrame]) -> dict[str, object]:
    """Papers 002 (batch-time fit) and 001 (data share)."""
    fit = f["fit_002_params.csv"].set_index("name")["value"]
    share = f["model_001_share.csv"]
    return {
        # papers 002 and 001
        "alpha": fit["alpha_s_samples"], "beta": fit["beta_s"], "break_even": fit["break_even_batch"],
        "fit_worst": f["fit_002_batch_time.csv"]["error_pct"].abs().max(),
        "c_ms": fit["catalog_c_s"] * 1e3, "epochs": fit["implied_epochs"],
        "fixed_ms": fit["implied_fixed_cost_s"] * 1e3, "allreduce_ms": fit["allreduce_s"] * 1e3,
        "ddp_best_pct": share.loc[share["ddp_epoch_s"].idxmin(), "share_node_a"] * 100,
        "ddp_best_min": share["ddp_epoch_s"].min() / 60,
        "sep_best_pct": share.loc[share["separate_epoch_s"].idxmin(), "share_node_a"] * 100,
        "sep_best_min": share["separate_epoch_s"].min() / 60,
        "b_over_a": _one(share, share_node_a=0.5)["node_b_s"] / _one(share, share_node_a=0.5)["node_a_s"],
    }


def _variant_tables(v: pd.DataFrame) -> tuple[str, str]:
    """Idle against the baseline's per dtype (fp16 payload), and the sync per payload (fp16 training)."""
    part = v[v["payload_dtype"] == "fp16"].copy()
    part["column"] = part["steps"] + " " + part["dtype"]
    idle = part.pivot_table(index="strategy", columns="column", values="idle_vs_baseline", sort=False) * 100
    idle = idle[["inferred fp16", "inferred bf16", "catalog fp16", "catalog bf16"]].reset_index()
    idle.columns = ["strategy", *[f"idle % of baseline, {c}" for c in idle.columns[1:]]]
    sync = v[(v["dtype"] == "fp16") & (v["strategy"].isin(["baseline", "hybrid", "network-aware"]))]
    sync = sync[["steps", "payload_dtype", "strategy", "payload_dtype_used", "sync_s_per_round", "round_s",
                 "sync_share_of_round", "speedup"]]
    return (markdown(idle, default_digits=1),
            markdown(sync, {"sync_s_per_round": 2, "round_s": 2, "sync_share_of_round": 3, "speedup": 2}))


def tables(f: dict[str, pd.DataFrame]) -> dict[str, str]:
    t3 = f["table3_idle.csv"]
    t3 = t3[t3["strategy"].isin(PAPER_STRATEGIES)]
    totals = f["table3_strategies.csv"]
    cols = ["strategy", "batch_sizes", "local_steps", "paper_total_idle_s", "total_idle_s", "sync_s_per_round",
            "round_s", "tokens_per_round", "tokens_per_s", "utilization"]
    tot = {s: markdown(totals.loc[totals["source"] == s, cols], {"paper_total_idle_s": 1, "total_idle_s": 1,
                                                                  "tokens_per_s": 0, "utilization": 3})
           for s in ("inferred", "catalog")}
    idle_md, sync_md = _variant_tables(f["variants.csv"])
    t2 = f["table2_allocations.csv"]
    return {
        "table1": markdown(f["table1_cluster.csv"], {"paper_tflops": 1, "memory_gib": 0, "memory_bandwidth_gbs": 0}
                           , default_digits=1),
        "table2": markdown(t2[["node", "paper_avg_tflops", "geodt_avg_tflops", "paper_normalized", "geodt_normalized",
                               "paper_A_batch", "geodt_A_batch", "A_match", "paper_B_batch", "geodt_B_batch",
                               "B_match", "paper_C_local_steps", "geodt_C_local_steps", "C_match"]],
                           {"paper_avg_tflops": 1, "geodt_avg_tflops": 2, "paper_normalized": 3,
                            "geodt_normalized": 4}),
        "memory": markdown(f["memory_b.csv"], default_digits=2),
        "step_times": markdown(f["inferred_step_times.csv"], {"baseline_idle_s": 1, "gap_to_slowest_s": 4,
                                                              "inferred_step_s": 4, "catalog_step_s": 3,
                                                              "catalog_bf16_step_s": 3, "implied_tflops_per_gpu": 0},
                               default_digits=1),
        "c_checks": markdown(f["c_row_checks.csv"], default_digits=2),
        "table3": markdown(t3[["strategy", "node", "paper_idle_s", "inferred_is", "inferred_idle_s",
                               "inferred_minus_paper_s", "catalog_idle_s", "catalog_bf16_idle_s"]],
                           {"catalog_idle_s": 1, "catalog_bf16_idle_s": 1}),
        "variants_idle": idle_md, "variants_sync": sync_md,
        "totals_inferred": tot["inferred"], "totals_catalog": tot["catalog"],
        "fit002": markdown(f["fit_002_batch_time.csv"], {"paper_time_s": 0, "fitted_time_s": 0, "error_pct": 1,
                                                          "paper_accuracy": 4, "paper_loss": 4}),
    }


def render(frames: dict[str, pd.DataFrame], names: list[str]) -> str:
    values = {**numbers(frames), **tables(frames), "files": "\n".join(f"- `{n}`" for n in names)}
    return TEMPLATE.format(**values)
