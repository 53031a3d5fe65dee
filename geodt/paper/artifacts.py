"""Everything `geodt paper` computes, gathered in one object: tables, predictions, fits, timelines.

The figures and the README are drawn from this object only, so what they say is what the CSVs hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pandas as pd

from facts.catalog import get_gpu, peak_tflops
from geodt.paper import facts
from geodt.paper.fmt import csv_text
from geodt.paper.infer import c_row_checks
from geodt.paper.related import BatchFit, ShareCurves, fit_batch_time, share_curves
from geodt.paper.tables import (
    DTYPES,
    Predictions,
    best_geodt_strategy,
    predict,
    strategy_totals,
    table1,
    table2,
    table3,
)
from geodt.paper.variants import memory_band, variants
from simulator.engines.engine import simulate
from simulator.models.timing import node_timings
from simulator.scenario import Scenario

ROUND_DIGITS = 9  # strip float noise (1e-15) from derived columns so the CSVs read cleanly


@dataclass
class Artifacts:
    catalog: Scenario
    pred: Predictions
    table1: pd.DataFrame
    table2: pd.DataFrame
    table3: pd.DataFrame
    totals: pd.DataFrame
    best: str | None
    timelines: dict[str, pd.DataFrame]   # display name -> timeline (inferred step times)
    fit: BatchFit
    curves: ShareCurves
    c_checks: pd.DataFrame               # row C: in-sample, leave-one-node-out, anchored on the catalog
    variants: pd.DataFrame               # dtype × payload
    memory: pd.DataFrame                 # strategy B's memory margin (GiB, ±10% band)

    @property
    def inferred(self) -> Scenario:
        return self.pred.scenarios["inferred"]

    @cached_property
    def step_times(self) -> pd.DataFrame:
        """Per node: the inferred step time, the catalog's (fp16 and bf16), and the throughput the
        inferred one implies."""
        inf = self.pred.inference
        scenario = self.catalog
        b = scenario.training.batch_size
        flops_per_step = scenario.model.train_flops_per_token * scenario.model.seq_len * b
        bf16 = node_timings(self.pred.scenarios["catalog_bf16"])
        rows = []
        for timing, timing_bf16, gap, step in zip(node_timings(scenario), bf16, inf.gaps_s, inf.step_s):
            node = timing.node
            rows.append({
                "node": node.name, "baseline_idle_s": facts.TABLE3_IDLE_S["baseline"][node.name],
                "gap_to_slowest_s": gap, "inferred_step_s": step, "catalog_step_s": timing.step_s(b),
                "catalog_bf16_step_s": timing_bf16.step_s(b),
                "implied_tflops_per_gpu": flops_per_step / step / 1e12,
                **{f"slowest_gpu_dense_{d}_peak_tflops": min(peak_tflops(get_gpu(k), d) for k in node.gpus)
                   for d in DTYPES},
            })
        return pd.DataFrame(rows)

    def fit_params(self) -> pd.DataFrame:
        f = self.fit
        values = {"alpha_s_samples": f.alpha_s, "beta_s": f.beta_s, "break_even_batch": f.break_even_batch,
                  "catalog_c_s": f.catalog_c_s, "allreduce_s": f.allreduce_s, "implied_epochs": f.implied_epochs,
                  "implied_fixed_cost_s": f.implied_t0_s + f.allreduce_s}
        return pd.DataFrame({"name": list(values), "value": list(values.values())})

    def timeline_subtitles(self) -> dict[str, str]:
        """Per timeline panel: the plan and what a round of it costs and yields."""
        out = {}
        for label in self.timelines:
            name = label.split(" ")[0]
            row = self.totals[(self.totals["source"] == "inferred") & (self.totals["strategy"] == name)].iloc[0]
            out[label] = (f"b = {row['batch_sizes']}, H = {row['local_steps']}; "
                          f"{row['tokens_per_round'] / 1e6:.2f} M tokens/round, "
                          f"idle {row['total_idle_s'] / self.catalog.training.rounds:.2f} s/round (all nodes), "
                          f"{row['tokens_per_s'] / 1e3:.0f} k tokens/s")
        return out

    def fit_table(self) -> pd.DataFrame:
        return pd.DataFrame({"batch_size": facts.P002_BATCH, "paper_time_s": facts.P002_TIME_S,
                             "fitted_time_s": self.fit.fitted_s, "error_pct": self.fit.error_pct,
                             "paper_accuracy": facts.P002_ACCURACY, "paper_loss": facts.P002_LOSS})

    def share_table(self) -> pd.DataFrame:
        c = self.curves
        return pd.DataFrame({"share_node_a": c.share, "ddp_epoch_s": c.ddp_s, "separate_epoch_s": c.separate_s,
                             "node_a_s": c.node_a_s, "node_b_s": c.node_b_s})

    def csv_files(self) -> dict[str, str]:
        timeline = pd.concat(self.timelines.values(), ignore_index=True)
        frames = {
            "table1_cluster.csv": self.table1, "table2_allocations.csv": self.table2,
            "table3_idle.csv": self.table3, "table3_strategies.csv": self.totals,
            "inferred_step_times.csv": self.step_times, "predictions.csv": self.pred.per_node,
            "timeline.csv": timeline, "fit_002_batch_time.csv": self.fit_table(),
            "fit_002_params.csv": self.fit_params(), "model_001_share.csv": self.share_table(),
            "c_row_checks.csv": self.c_checks, "variants.csv": self.variants, "memory_b.csv": self.memory,
        }
        return {name: csv_text(frame.round(ROUND_DIGITS)) for name, frame in frames.items()}

    def scenario_files(self) -> dict[str, str]:
        """The resolved scenarios, with a header that names no local path (outputs must not vary by clone)."""
        out = {}
        for source, scenario in self.pred.scenarios.items():
            body = scenario.to_toml().split("\n", 1)[1]
            how = "the built-in scenario `paper`"
            if source.startswith("inferred"):
                how += " with each node's step_time_s inferred by geodt.paper.infer"
            if source.endswith("bf16"):
                how += ", trained in bf16"
            out[f"scenario_{source}.toml"] = f"# resolved from {how}\n{body}"
        return out


def compute() -> Artifacts:
    pred = predict()
    catalog = pred.scenarios["catalog"]
    rounds = catalog.training.rounds
    totals = strategy_totals(pred, rounds)
    best = best_geodt_strategy(totals)
    inferred = pred.scenarios["inferred"]
    timelines = {}
    for name in ("baseline", "C", best):
        if name is None:
            continue
        label = name if name in facts.PAPER_STRATEGIES else f"{name} (best geodt strategy)"
        timelines[label] = simulate(inferred, pred.plans[("inferred", name)], "analytic")
    slowest = catalog.nodes[[n.name for n in catalog.nodes].index(pred.inference.slowest)]
    anchor_s = node_timings(catalog)[catalog.nodes.index(slowest)].step_s(catalog.training.batch_size)
    return Artifacts(catalog=catalog, pred=pred, table1=table1(catalog), table2=table2(catalog),
                     table3=table3(pred), totals=totals, best=best, timelines=timelines,
                     fit=fit_batch_time(), curves=share_curves(),
                     c_checks=pd.DataFrame(c_row_checks(catalog, anchor_s)), variants=variants(),
                     memory=memory_band(catalog))
