"""The generated results/paper/README.md: every table in markdown, two or three sentences on each
table and figure, and every difference from the papers explained. All numbers come from `art`."""
from __future__ import annotations

import pandas as pd

from calibrate.catalog import get_gpu
from geodt.paper import facts
from geodt.paper.fmt import markdown
from geodt.paper.tables import EQUAL_TOKENS_TOLERANCE
from simulator.memory import step_memory_bytes


def _md_table1(art) -> str:
    t = art.table1.copy()
    peak = [c for c in t.columns if c.endswith("_peak_tflops")][0]
    return markdown(t[["node", "gpu", "count", "paper_tflops", "geodt_spec_tflops", "tflops_match",
                       "paper_memory_gb", "catalog_memory_gb", "memory_match", peak]],
                    {"paper_tflops": 1, "geodt_spec_tflops": 1, "paper_memory_gb": 0, "catalog_memory_gb": 0, peak: 1})


def _md_table2(art) -> str:
    t = art.table2
    cols = ["node", "paper_avg_tflops", "geodt_avg_tflops", "paper_normalized", "geodt_normalized",
            "paper_A_batch", "geodt_A_batch", "A_match", "paper_B_batch", "geodt_B_batch", "B_match",
            "paper_C_local_steps", "geodt_C_local_steps", "C_match"]
    return markdown(t[cols], {"paper_avg_tflops": 1, "geodt_avg_tflops": 2, "paper_normalized": 3,
                              "geodt_normalized": 4})


def _sentence_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _table2_text(art) -> str:
    t, s = art.table2, art.catalog
    mismatched = {k: list(t.loc[~t[f"{k}_match"], "node"]) for k in ("A", "B", "C")}
    lines = []
    for k in ("A", "C"):
        lines.append(f"{k} equals the paper on every node." if not mismatched[k] else
                     f"**{k} differs from the paper on {_sentence_list(mismatched[k])}** (this should not happen).")
    if mismatched["B"]:
        parts = []
        for node in mismatched["B"]:
            row = t[t["node"] == node].iloc[0]
            ours, theirs = int(row["geodt_B_batch"]), int(row["paper_B_batch"])
            keys = list(s.node(node).gpus)
            mem = min(get_gpu(k).memory_gb for k in keys)
            parts.append(f"{node}: geodt {ours}, paper {theirs}; geodt's memory model needs "
                         f"{step_memory_bytes(s, theirs) / 1e9:.1f} GB at batch {theirs} against {mem:.0f} GB "
                         f"({', '.join(keys)})")
        lines.append("B differs: " + "; ".join(parts) + ". The memory model (simulator/memory.py) keeps "
                     "every activation for backward (no recomputation), fp32 AdamW state and a 1 GB reserve.")
        a30, rtx = get_gpu("a30"), get_gpu("rtx-3090")
        if a30.memory_gb == rtx.memory_gb:
            lines.append(f"No per-GPU memory model can give the paper's column: the A30 (node3, batch 32) and the "
                         f"RTX 3090 (node4, batch 16) both have {a30.memory_gb:.0f} GB and run the same model in "
                         "the same dtype, so batch 32 fits both or neither. Something outside the model "
                         "(memory taken by other processes or the display on the GeForce card, a different "
                         "stopping rule) must set the paper's node4 value.")
    else:
        lines.append("B equals the paper on every node.")
    avg = "the averages and normalised speeds agree with the paper's printed values at the paper's precision" \
        if t["avg_match"].all() and t["normalized_match"].all() else \
        "**the averages or normalised speeds differ from the paper's printed values**"
    return (f"geodt computes F_i (mean spec TFLOPS of the node's GPUs) with the paper's figures; {avg} "
            f"(node2's mean is {t.loc[t['node'] == 'node2', 'geodt_avg_tflops'].iloc[0]:.2f}, printed 117.9). "
            + " ".join(lines))


def _table3_md(art) -> str:
    t = art.table3[art.table3["strategy"].isin(facts.PAPER_STRATEGIES)]
    return markdown(t[["strategy", "node", "paper_idle_s", "inferred_idle_s", "inferred_minus_paper_s",
                       "catalog_idle_s"]], {"catalog_idle_s": 1})


def _row(art, source, name):
    t = art.totals
    return t[(t["source"] == source) & (t["strategy"] == name)].iloc[0]


def _table3_text(art) -> str:
    inf, t3 = art.pred.inference, art.table3
    st = art.step_times
    fitted = ", ".join(f"{n} {v:.2f} s (paper {facts.TABLE3_IDLE_S['C'][n]:.1f})"
                       for n, v in zip(inf.nodes, inf.c_fitted_idle_s))
    a = t3[t3["strategy"] == "A"].set_index("node")
    b = t3[t3["strategy"] == "B"].set_index("node")
    slow_b = b["inferred_idle_s"].idxmin()
    ratio = (st["catalog_step_s"] / st["inferred_step_s"])
    spread_cat = st["catalog_step_s"].min() / st["catalog_step_s"].max()
    spread_inf = st["inferred_step_s"].min() / st["inferred_step_s"].max()
    rounds, h = art.catalog.training.rounds, art.catalog.training.local_steps
    return "\n\n".join([
        f"**How the step times are inferred.** The baseline row gives t_max − t_i = idle_i / (rounds × H) = "
        f"idle_i / {rounds * h} for every node ({inf.slowest} is the slowest: idle 0). That leaves one free "
        f"parameter, t_max. It is fitted by least squares to the paper's row C, because C keeps every node at "
        f"the baseline batch and only changes H, so its idle depends on the same t_i and on t_max alone, with no "
        f"assumption about how t grows with the batch. The fit gives t_max = {inf.t_max_s * 1e3:.2f} ms and "
        f"C's idle {fitted}: residual sum of squares {inf.c_sse_s2:.3f} s² with three residuals and one "
        f"parameter, so the paper's rows baseline and C are consistent with each other. Rows A and B change the "
        f"batch and are out-of-sample predictions: they use the catalog estimate's shape of t(b), scaled to each "
        f"node's inferred t_i.",
        f"**Row A.** Node1 and node2 run the same plan in A as in the baseline (b = 4, H = 100), and node2 is the "
        f"slowest in both of the paper's rows, so node1's wait cannot change between them under any model in which "
        f"a node's step time depends on its own plan only. The paper reports 1.1 s and then 11.9 s: about 10 s of "
        f"run-to-run variation or of something outside the allocation; geodt's A errors are of the same size "
        f"(largest {a['inferred_minus_paper_s'].abs().max():.1f} s, on {a['inferred_minus_paper_s'].abs().idxmax()}). "
        f"geodt predicts that A's larger batches make {a['inferred_idle_s'].idxmin()} the slowest node, where the "
        f"paper measured {min(facts.TABLE3_IDLE_S['A'], key=facts.TABLE3_IDLE_S['A'].get)}.",
        f"**Row B.** With the paper's batches (8, 8, 32, 16), geodt predicts {slow_b} to be the slowest node, the "
        f"paper measured node3. In the paper, multiplying node3's batch by 8 left every node's wait below 15 s, "
        f"that is, the paper's step time hardly grows with the batch; the catalog's t(b) grows almost in "
        f"proportion (fixed cost small next to the per-sample FLOPs), so B's predicted idle is "
        f"{_row(art, 'inferred', 'B')['total_idle_s']:.0f} s against the paper's {facts.TABLE3_TOTAL_S['B']:.1f} s.",
        f"**The catalog estimate** puts the step at {ratio.min():.0f}-{ratio.max():.0f}× the inferred times and "
        f"spreads the nodes far more (fastest/slowest step {spread_cat:.2f} against {spread_inf:.2f} inferred). "
        f"In bf16, the 2080 Ti, Titan RTX and V100 have no BF16 tensor cores, so the catalog gives them their FP32 "
        f"rate ({st['slowest_gpu_dense_peak_tflops'].iloc[0]:.1f} TFLOPS for the 2080 Ti), while the A30 keeps 165. "
        f"The inferred times cannot be compute-bound at the paper's stated workload either: one step of "
        f"{art.catalog.training.batch_size} × {art.catalog.model.seq_len} tokens per GPU through the "
        f"{art.catalog.model.param_count / 1e6:.0f}M-parameter model in {st['inferred_step_s'].iloc[0] * 1e3:.1f} ms "
        f"means {st['implied_tflops_per_gpu'].iloc[0]:.0f} TFLOPS per 2080 Ti, above even its 113.8 FP16-accumulate "
        f"headline. So either the paper's idle is only part of the barrier wait, or its per-step work was smaller "
        f"than stated. We cannot tell which from the paper; geodt's calibration (`geodt calibrate`) measures t(b) "
        f"on real GPUs to settle it.",
    ])


def _totals_md(art, source: str) -> str:
    t = art.totals[art.totals["source"] == source]
    return markdown(t[["strategy", "batch_sizes", "local_steps", "paper_total_idle_s", "total_idle_s",
                       "sync_s_per_round", "round_s", "tokens_per_round", "tokens_per_s", "idle_s_per_mtoken",
                       "utilization"]],
                    {"paper_total_idle_s": 1, "total_idle_s": 1, "tokens_per_s": 0, "idle_s_per_mtoken": 3,
                     "utilization": 3})


def _totals_text(art) -> str:
    base = _row(art, "inferred", "baseline")
    sync_share = base["sync_s_per_round"] / base["round_s"]
    tps = {src: art.totals[(art.totals["source"] == src) & art.totals["strategy"].isin(facts.PAPER_STRATEGIES)]
           .set_index("strategy")["tokens_per_s"] for src in ("inferred", "catalog")}
    best_paper = {src: s.idxmax() for src, s in tps.items()}
    extra = ", ".join(f"{k} {(_row(art, 'inferred', k)['tokens_per_round'] / base['tokens_per_round'] - 1) * 100:+.0f}%"
                      for k in ("A", "B", "C"))
    same = best_paper["inferred"] == best_paper["catalog"]
    inf = art.totals[art.totals["source"] == "inferred"]
    other_sync = list(inf.loc[(inf["sync_s_per_round"] - base["sync_s_per_round"]).abs() > 1e-6, "strategy"])
    changed = (" (none of them changes the sync; geodt's " + _sentence_list([f"`{x}`" for x in other_sync])
               + " do, see the table)") if other_sync else ""
    text = (f"The paper reports neither the sync time nor the tokens per round, and both change its conclusion. "
            f"The network model (ring all-reduce of {art.catalog.model.param_count / 1e6:.0f}M fp32 pseudo-gradients "
            f"among 4 nodes at 1 Gbit/s, plus the outer step) predicts {base['sync_s_per_round']:.2f} s per sync for "
            f"each of the paper's strategies{changed}: {sync_share * 100:.0f}% of a baseline round with the inferred step times, so the GPUs "
            f"idle far more in the sync than at the barrier ({base['sync_s_per_round'] * art.catalog.training.rounds:.0f} s "
            f"per node over 10 rounds against the {facts.TABLE3_TOTAL_S['baseline']:.1f} s of barrier idle of all "
            f"nodes together). The strategies also do different work per round (tokens against the baseline: {extra}), "
            f"so idle alone ranks them unfairly: ")
    if same:
        text += (f"under both step-time sources, {best_paper['inferred']} has the highest throughput (tokens per "
                 f"second of wall time) of the paper's four strategies, although the paper ranks it by idle "
                 f"as {'worse' if facts.TABLE3_TOTAL_S[best_paper['inferred']] > facts.TABLE3_TOTAL_S['baseline'] else 'better'} "
                 f"than the baseline.")
    else:
        text += (f"the highest-throughput paper strategy is {best_paper['inferred']} with the inferred step times and "
                 f"{best_paper['catalog']} with the catalog estimate.")
    text += (" Throughput per token is not the whole story (larger batches and unequal local work change "
             "convergence per token, which the simulator does not model).")
    if art.best:
        r = _row(art, "inferred", art.best)
        text += (f" The best geodt strategy here is `{art.best}`, chosen by idle at equal tokens: among geodt's own "
                 f"strategies whose tokens per round are within ±{EQUAL_TOKENS_TOLERANCE * 100:.0f}% of the "
                 f"baseline's, the least total idle (more tokens per round amortise the sync and would win for that "
                 f"alone; if none kept the baseline's tokens, the least idle per token would be used). It idles "
                 f"{r['total_idle_s']:.2f} s over 10 rounds ({r['tokens_per_round'] / base['tokens_per_round'] * 100:.1f}% "
                 f"of the baseline's tokens per round, {r['tokens_per_s'] / base['tokens_per_s']:.2f}× its throughput).")
    if art.pred.skipped:
        text += " Strategies that could not plan this scenario: " + "; ".join(
            f"`{k}` ({v})" for k, v in sorted(art.pred.skipped.items())) + "."
    return text


def _fit_text(art) -> str:
    f = art.fit
    worst = max(range(len(f.error_pct)), key=lambda i: abs(f.error_pct[i]))
    return (f"A run of S samples per GPU at batch b takes S/b steps of t(b) = t0 + a + c·b (fixed compute cost, "
            f"per-step ring all-reduce, per-sample cost), so T(b) = α/b + β. The relative least-squares fit gives "
            f"α = {f.alpha_s:,.0f} s·samples and β = {f.beta_s:,.0f} s; its errors are within ±"
            f"{abs(f.error_pct[worst]):.1f}% (largest at b = {facts.P002_BATCH[worst]}), and the points scatter "
            f"on both sides of the curve, as run-to-run noise would. The fixed and per-sample costs are equal at "
            f"b = α/β = {f.break_even_batch:.0f}: below it, doubling the batch nearly halves the time; above it, "
            f"returns diminish, which is the paper's observation. The paper gives no epoch count, so t0, a and c are "
            f"not separately identified; taking the catalog's per-sample cost for a T4 in FP32 "
            f"(c = {f.catalog_c_s * 1e3:.2f} ms) implies {f.implied_epochs:.0f} epochs and a fixed cost of "
            f"{(f.implied_t0_s + f.allreduce_s) * 1e3:.0f} ms per step, of which the network model's all-reduce of "
            f"ResNet-18's gradients among 4 GPUs at 100 Gbit/s is {f.allreduce_s * 1e3:.1f} ms: most of the fixed "
            f"cost is per-step overhead, not communication (implied values, resting on the catalog's c).")


def _share_text(art) -> str:
    c = art.curves
    s_ddp, t_ddp = c.best(c.ddp_s)
    s_sep, t_sep = c.best(c.separate_s)
    i = int(abs(c.share - c.uniform_share).argmin())
    half = int(abs(c.share - 0.5).argmin())
    return (f"Model (from the catalog, stated in geodt/paper/related.py): minGPT `gpt-mini` as the chargpt demo "
            f"configures it (6 layers, width 192, context 128, batch 64 per process, fp32), t(b) from the catalog "
            f"estimate per GPU type plus the intra-node all-reduce, one epoch of TinyShakespeare. As one DDP job, "
            f"every step waits for the slower node and then all-reduces {c.allreduce_s * 1e3:.0f} ms of gradients "
            f"over an assumed 1 Gbit/s link: the best share for node A is {s_ddp * 100:.0f}% "
            f"({t_ddp / 60:.1f} min), close to the even split over 6 GPUs ({c.uniform_share * 100:.0f}%, "
            f"{c.ddp_s[i] / 60:.1f} min), and the all-reduce dominates. As two separate jobs, the best share is "
            f"{s_sep * 100:.0f}% ({t_sep / 60:.1f} min). The model disagrees with the paper's one timing statement "
            f"(node B took 2× node A's time): at equal data it has node B at {c.node_b_s[half] / c.node_a_s[half]:.2f}× "
            f"node A, because in FP32 a Titan Xp ({get_gpu('titan-xp').fp32_tflops:.1f} TFLOPS) is no slower than an "
            f"A30 ({get_gpu('a30').fp32_tflops:.1f}) and node B has twice the GPUs. The paper's 2× needs node A to "
            f"be about {2 / (c.node_b_s[half] / c.node_a_s[half]):.0f}× faster than this model says, e.g. its A30s "
            f"running matmuls on TF32 tensor cores (not in the catalog) or node B limited by something other than "
            f"its GPUs (PCIe, data loading); the paper also lists the Titan Xp as compute capability 8.0 with 24 GB, "
            f"which are the A30's figures (a Titan Xp is 6.1 with 12 GB).")


def _timeline_text(art) -> str:
    rounds = art.catalog.training.rounds
    per_round = {k: _row(art, "inferred", k)["total_idle_s"] / rounds for k in ("baseline", "C")}
    text = (f"The first rounds of the baseline, of C and of the best geodt strategy (`{art.best}`), with the inferred "
            f"step times (`timeline.csv` holds all {rounds} rounds; each panel's title gives the plan, tokens per "
            f"round and throughput). The outer sync over 1 Gbit/s (purple) is most of every round. Barrier idle "
            f"(orange) is the faster nodes' wait for {art.pred.inference.slowest}: "
            f"{per_round['baseline']:.2f} s per round summed over nodes in the baseline, {per_round['C']:.2f} s with C")
    if art.best:
        r = _row(art, "inferred", art.best)
        text += (f" and {r['total_idle_s'] / rounds:.2f} s with `{art.best}` (b = {r['batch_sizes']}, "
                 f"H = {r['local_steps']})")
    return text + "."


def _validation_text(art) -> str:
    return ("`geodt paper` does not run the real executor: measured times vary from run to run, and this directory "
            "must regenerate byte for byte. The measured rows live beside it, in `results/paper-validation/`: the "
            "paper cluster emulated on one CPU machine by the real DiLoCo executor, with the inferred step times "
            "(`scenario_inferred.toml`) and a tiny model (the emulation pads every inner step to the node's step "
            "time, so the model's size does not matter for idle), 3 rounds, every emulated time stretched 12× so "
            "that the CPU's real bf16 compute stays inside each padded step. Each strategy's row comes from:\n\n"
            "```\ngeodt validate results/paper/scenario_inferred.toml --strategy C --out runs/paper-C "
            "--set model.preset=tiny --set model.seq_len=8 --set training.rounds=3 --time-scale 12\n```")


def render(art, names: list[str]) -> str:
    inf = art.pred.inference
    parts = [
        "# Reproducing the papers: tables and figures",
        "Generated by `geodt paper` (geodt/paper/); do not edit by hand. Rerunning it rewrites this directory "
        "byte for byte. The papers' own numbers are those of PAPERS.md (geodt/paper/facts.py); everything else is "
        "computed by geodt's simulator, catalog and models. All idle, sync and round times are in seconds.",
        "## Table 1: the cluster (paper 000) — `table1_cluster.csv`",
        _md_table1(art),
        "Every GPU's TFLOPS and memory in geodt's catalog equal the paper's figures. The paper's figures are the "
        "datasheets' FP16-accumulate headlines (BF16 for the A30); the last column is the dense peak a bf16 "
        "training step can actually reach, which geodt's own estimates use: GeForce cards run FP16 with FP32 "
        "accumulate at half the headline, and the Turing and Volta GPUs have no BF16 tensor cores at all.",
        "## Table 2: per-node speed and the A, B, C allocations — `table2_allocations.csv`",
        _md_table2(art),
        _table2_text(art),
        "## Step times inferred from the paper's baseline — `inferred_step_times.csv`",
        markdown(art.step_times, {"baseline_idle_s": 1, "gap_to_slowest_s": 4, "inferred_step_s": 4,
                                  "catalog_step_s": 3, "implied_tflops_per_gpu": 0, "slowest_gpu_dense_peak_tflops": 1}),
        f"t_i = t_max − idle_i / (rounds × H), with t_max = {inf.t_max_s * 1e3:.2f} ms fitted to the paper's row C "
        f"(next section). `catalog_step_s` is geodt's catalog estimate for the same step; `implied_tflops_per_gpu` "
        f"is the training FLOPs of one step divided by the inferred time.",
        "## Table 3: GPU idle per node and strategy — `table3_idle.csv`",
        "Seconds over the 10 syncs. `inferred`: step times inferred from the paper's baseline row; `catalog`: the "
        "GPU-catalog estimate. Strategy B is simulated with the paper's batches (8, 8, 32, 16); geodt's own B "
        "(`B-geodt`) and geodt's other strategies are in the CSV and in the next table.",
        _table3_md(art),
        _table3_text(art),
        "## Sync time and tokens per round — `table3_strategies.csv`",
        "With the inferred step times:",
        _totals_md(art, "inferred"),
        "With the catalog estimate:",
        _totals_md(art, "catalog"),
        _totals_text(art),
        "## Figures",
        "### `idle_per_node.png`: idle per node, paper against geodt",
        "![idle per node](idle_per_node.png)",
        "Top row: the paper's measured idle beside geodt's prediction from the inferred step times (baseline exact "
        "by construction, C fitted with one parameter, A and B predicted). Bottom row: the catalog estimate, on its "
        "own scale, which over-predicts every wait because it spreads the nodes' speeds far more than the paper's "
        "measurements do (explained under Table 3).",
        "### `timeline.png`: a few rounds, compute, idle and sync per node",
        "![timeline](timeline.png)",
        _timeline_text(art),
        "### `batch_time_002.png`: paper 002, training time against batch size — `fit_002_batch_time.csv`",
        "![batch time](batch_time_002.png)",
        markdown(art.fit_table(), {"paper_time_s": 0, "fitted_time_s": 0, "error_pct": 1, "paper_accuracy": 4,
                                   "paper_loss": 4}),
        _fit_text(art),
        "### `share_001.png`: paper 001, time against the A30 node's share of the data — `model_001_share.csv`",
        "![share](share_001.png)",
        _share_text(art),
        "## Validation: the paper cluster emulated",
        _validation_text(art),
        "## Files",
        "\n".join(f"- `{n}`" for n in names),
        "The resolved scenarios (`scenario_catalog.toml`, `scenario_inferred.toml`) reproduce every simulation "
        "here with `geodt simulate`.",
    ]
    return "\n\n".join(parts) + "\n"
