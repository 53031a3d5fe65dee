"""Every published comparison in facts/loss_published.csv recomputed through the simulator's loss path.

Each row is a loss at equal tokens, published, of one setting against a reference (DiLoCo with M
replicas against data-parallel, H = 100 against H = 30, an overlapped or eager outer step against none,
...: facts/loss_published.csv). Each of its two runs (`dp M=m` or `diloco M=m H=h P=.. tau=.. alpha=..
dtype=..`) is built as a scenario of M identical nodes at the row's model size N (`geodt simulate`'s
loss_setup: the literature path, as for every model outside the built-in profile's span) and the run's
H, simulated (baseline or sync-ddp) and predicted by loss_prediction.predict with the run's fragments,
overlap τ, merge α and payload; the predicted Δloss % is the setting's loss over the reference's, each
at the row's tokens (the papers compare final losses at equal tokens). Printed and written to --out: the table (loss_published.csv), errors and sign agreement per
effect (summary.csv), a figure (predicted against published Δloss %), and a README with the machine and
command. Goals (issue 55): sign right in >= 90% of the comparisons whose published effect exceeds its
rounding (and the noise its paper states, where it states one: noise_pct), median |error| <= 0.3 points, worst <= 1.5.

    python benchmarks/bench_loss_published.py --out results/loss-published
"""
from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from formats.plan import Plan
from simulator.engines.engine import simulate
from simulator.models.loss_literature import published
from simulator.models.loss_prediction import loss_setup, plan_rounds, predict
from simulator.scenario import load_scenario
from simulator.strategies import make_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOALS = {"sign_share": 0.90, "median_abs_error": 0.3, "worst_abs_error": 1.5}
# Liu et al. 2024 footnote 5: with no heterogeneity DN+DyLU and DiLoCo "reduce to the same", and their 41.27
# against 41.35 perplexity is numerical error: the stricter of the two noise figures the paper states (the README
# prints the sign share under it as well as under noise_pct's Table 4 figure).
LIU_FOOTNOTE5_PCT = 100 * (1 - np.log(41.27) / np.log(41.35))


STRATEGY_OF = {"dp": "sync-ddp", "diloco": "baseline", "async": "async"}  # a run's kind: the strategy simulated
RUN_KEYS = {"M": int, "H": int, "P": int, "tau": int, "alpha": float, "dtype": str}


def parse_run(spec: str) -> dict:
    """`dp M=m`, `async M=m H=h` or `diloco M=m H=h [P=.. tau=.. alpha=.. dtype=..]` (facts/loss_published.csv)."""
    kind, *pairs = spec.split()
    if kind not in STRATEGY_OF:
        raise ValueError(f"facts/loss_published.csv: run {spec!r}: expected one of {', '.join(STRATEGY_OF)} first")
    run = {"kind": kind, "H": 30, "P": 1, "tau": 0, "alpha": 0.0, "dtype": "fp32"}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in RUN_KEYS:
            raise ValueError(f"facts/loss_published.csv: run {spec!r}: unknown key {key!r}")
        run[key] = RUN_KEYS[key](value)
    return run


@dataclass(frozen=True)
class LossPlan:
    """The plan fields loss_prediction.predict reads. A plan file cannot carry the papers' fp4 payload
    (formats/plan.py: fp32, fp16, int8) nor an overlap of a whole outer step (τ < H/P), which the
    published rows need; the loss path itself takes them."""

    strategy: str
    nodes: tuple
    fragments: int
    sync_delay_steps: int
    fragment_alpha: float
    payload_dtype: str
    rounds: int | None = None  # the scenario's
    collective: str | None = None  # the scenario's
    # how its rounds sync, by a plan's one rule (formats/plan.py): its own payload, the scenario's rest
    settings = Plan.settings
    settings_from = Plan.settings_from


def scenario_for(params: float, tokens: float, replicas: int, sync_steps: int) -> object:
    """A scenario of `replicas` identical one-GPU nodes training N parameters for `tokens` at H."""
    seq_len, batch, gpus = 2048, 8, 4  # gpus: the paper scenario's node1, copied M times (identical_nodes)
    rounds = max(1, round(tokens / (replicas * sync_steps * batch * gpus * seq_len)))
    scenario = load_scenario("paper", [f"model.params={params:.0f}", f"model.seq_len={seq_len}",
                                       f"training.batch_size={batch}", f"training.local_steps={int(sync_steps)}",
                                       f"training.rounds={rounds}"])
    return identical_nodes(scenario, replicas)


def run_loss(row, spec: str) -> float:
    """One run's loss at its last token through loss_prediction.predict: data-parallel (sync-ddp), async, or
    DiLoCo (the baseline's plan with the run's fragments P, overlap τ, merge α and payload). The rounds are the
    plain baseline's (or sync-ddp's) simulated timeline: P, τ, α and the payload change the loss effects,
    not the tokens each round trains, so the streaming engine's timing is not needed here. The loss is
    predict's at the last token (factor·L(η·D)) taken at the row's D."""
    run = parse_run(spec)
    scenario = scenario_for(row.params, row.tokens, run["M"], run["H"])
    plan = make_plan(scenario, STRATEGY_OF[run["kind"]])
    rounds = plan_rounds(plan, simulate(scenario, plan, "auto"))
    if run["kind"] == "diloco":
        plan = LossPlan(plan.strategy, plan.nodes, run["P"], run["tau"], run["alpha"], run["dtype"])
    setup = loss_setup(scenario)
    pred = predict(setup, scenario, plan, rounds)
    # at the row's tokens exactly (equal tokens): whole rounds of M·H steps round D by up to half a round
    return pred["factor"] * float(setup.model.curve.loss(pred["efficiency"] * float(row.tokens)))


def predicted_delta_pct(row) -> float:
    """The setting's loss over the reference's, in %, each run through the loss path (run_loss)."""
    return 100.0 * (run_loss(row, row.setting_run) / run_loss(row, row.reference_run) - 1.0)


def identical_nodes(scenario, replicas: int):
    """The scenario with `replicas` copies of its first node (identical replicas: the papers' setting)."""
    first = scenario.nodes[0]
    return replace(scenario, nodes=tuple(replace(first, name=f"node{i + 1}") for i in range(replicas)))


def noise_floor(table: pd.DataFrame) -> pd.Series:
    """Per row, the size a published effect must exceed for its sign to count: its printed rounding, or the noise
    its paper itself states (noise_pct: facts/loss_published.csv, Liu et al.'s footnote 5 and Table 4), the larger."""
    noise = table["noise_pct"] if "noise_pct" in table else pd.Series(np.nan, index=table.index)
    return np.fmax(table["rounding_pct"], noise.astype(float))


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per effect and use (fit / held-out) and all: comparisons, sign agreement where the published effect
    exceeds its rounding and its paper's stated noise (noise_floor), median and worst |error| in points of loss %."""
    rows = []
    for (effect, use), g in [*table.groupby(["effect", "use"]), (("all", "all"), table)]:
        big = g[g["published_delta_pct"].abs() > noise_floor(g)]
        agree = (np.sign(big["predicted_delta_pct"]) == np.sign(big["published_delta_pct"])).mean()
        err = g["error_pct"].abs()
        rows.append({"effect": effect, "use": use, "comparisons": len(g), "beyond_noise": len(big),
                     "sign_share": float(agree) if len(big) else float("nan"),
                     "median_abs_error": float(err.median()), "worst_abs_error": float(err.max())})
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for use, marker in (("fit", "o"), ("held-out", "s")):
        g = table[table["use"] == use]
        ax.scatter(g["published_delta_pct"], g["predicted_delta_pct"], marker=marker, label=f"{use} ({len(g)})")
    lo = float(min(table["published_delta_pct"].min(), table["predicted_delta_pct"].min())) - 0.3
    hi = float(max(table["published_delta_pct"].max(), table["predicted_delta_pct"].max())) + 0.3
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.set_xlabel("published Δloss % (facts/loss_published.csv)")
    ax.set_ylabel("predicted Δloss % (geodt's loss path)")
    ax.set_title("Loss at equal tokens: published against predicted")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "loss-published"))
    args = parser.parse_args(argv)
    table = published().copy()
    table["predicted_delta_pct"] = [predicted_delta_pct(r) for r in table.itertuples()]
    table["error_pct"] = table["predicted_delta_pct"] - table["published_delta_pct"]
    summary = verdicts(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "loss_published.csv", index=False, float_format="%.4f")
    summary.to_csv(out / "summary.csv", index=False, float_format="%.4f")
    figure(table, out / "predicted_vs_published.png")
    cols = ["arxiv", "table", "effect", "params", "tokens", "replicas", "sync_steps", "published_delta_pct",
            "predicted_delta_pct", "error_pct", "use"]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print()
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    whole = summary[summary["effect"] == "all"].iloc[0]
    met = (whole["sign_share"] >= GOALS["sign_share"] and whole["median_abs_error"] <= GOALS["median_abs_error"]
           and whole["worst_abs_error"] <= GOALS["worst_abs_error"])
    line = (f"goals (sign >= 90%, median |error| <= 0.3, worst <= 1.5 points): sign {whole['sign_share']:.0%} of "
            f"{int(whole['beyond_noise'])}, median {whole['median_abs_error']:.2f}, worst "
            f"{whole['worst_abs_error']:.2f}: {'met' if met else 'NOT met'}")
    print(line)
    (out / "verdicts.txt").write_text(line + "\n")
    (out / "README.md").write_text(_readme(line, summary, table))
    return 0


def _table(summary: pd.DataFrame) -> str:
    """summary.csv as a markdown table."""
    rows = ["| effect | use | rows | beyond noise | sign right | median \\|error\\| | worst \\|error\\| |",
            "|---|---|---|---|---|---|---|"]
    for r in summary.itertuples():
        sign = "-" if np.isnan(r.sign_share) else f"{r.sign_share:.0%}"
        rows.append(f"| {r.effect} | {r.use} | {r.comparisons} | {r.beyond_noise} | {sign} | "
                    f"{r.median_abs_error:.2f} | {r.worst_abs_error:.2f} |")
    return "\n".join(rows)


def strict_sign(table: pd.DataFrame) -> tuple[float, int]:
    """The sign share over all rows (and how many count) with Liu et al.'s footnote-5 figure as their noise in
    place of noise_pct's."""
    strict = table.assign(noise_pct=np.where(table["noise_pct"].notna(), LIU_FOOTNOTE5_PCT, np.nan))
    whole = verdicts(strict).set_index("effect").loc["all"]
    return float(whole["sign_share"]), int(whole["beyond_noise"])


def shrink_check(table: pd.DataFrame) -> list[str]:
    """Each comparison printed at 25, 100 and 250 tokens per parameter (Streaming DiLoCo Table 7, Kale et al.
    Table 1): published and predicted Δ at 25 and 250, and the share left at 250."""
    rows = table[(table["tokens"] / table["params"]).round().isin([25, 100, 250]) & (table["params"] == 1e9)
                 & table["table"].isin(["Table 1", "Table 7"])]
    out = []
    for _, g in rows.groupby(["reference_run", "setting_run"], sort=False):
        g = g.sort_values("tokens")
        if len(g) != 3:
            continue
        pub, pred = g["published_delta_pct"].to_numpy(), g["predicted_delta_pct"].to_numpy()
        left = f"{abs(pub[2] / pub[0]) if pub[2] == 0 else pub[2] / pub[0]:.2f}"
        out.append(f"| {g['table'].iloc[0]} | {g['setting'].iloc[0]} against {g['reference'].iloc[0]} | "
                   f"{pub[0]:+.2f} / {pub[2]:+.2f} | {pred[0]:+.2f} / {pred[2]:+.2f} | {left} | {pred[2] / pred[0]:.2f} |")
    return out


def _readme(line: str, summary: pd.DataFrame, table: pd.DataFrame) -> str:
    over = table[table["effect"] == "overtraining"]["error_pct"].abs().max()
    rest = table[~table["effect"].isin(["overtraining", "async"])]["error_pct"].abs().max()
    strict_share, strict_rows = strict_sign(table)
    head = ("| table | comparison | published at 25 / 250 | predicted at 25 / 250 | published share left | "
            "predicted share left |")
    shrink = "\n".join([head, "|---|---|---|---|---|---|", *shrink_check(table)])
    return README.format(machine=platform.machine(), python=platform.python_version(), line=line,
                         table=_table(summary), over=over, rest=rest, strict_share=strict_share,
                         strict_rows=strict_rows, footnote5=LIU_FOOTNOTE5_PCT, shrink=shrink)


README = """# Published loss comparisons, recomputed (issue 55)

`python benchmarks/bench_loss_published.py --out results/loss-published` on {machine} Linux
({python}), CPU only (no accelerator is used: the loss path is arithmetic).

Each row of facts/loss_published.csv (published loss at equal tokens, setting against reference) is
recomputed through `geodt simulate`'s loss path: for each of its two runs (reference_run, setting_run) a
scenario of M identical nodes at the row's N, D and the run's H, its baseline (DiLoCo, with the run's
fragments, overlap τ, merge α and payload), async or sync-ddp (data-parallel) simulated and predicted
(simulator/models/loss_prediction.predict), the loss taken at the row's D. Files: loss_published.csv (every
comparison, predicted and error in points of loss %), summary.csv (per effect and use: sign agreement where the
published effect exceeds its rounding and its paper's stated noise, median and worst |error|),
predicted_vs_published.png.

{line}

{table}

**Sign, and the paper's own noise.** A sign counts where the published effect exceeds its printed rounding
and, where the paper states one, its own noise (noise_pct). Of the papers read only Liu et al. 2024 (arXiv 2401.09135v2) states
one: footnote 5 calls DN+DyLU's lead over synchronous DiLoCo with no heterogeneity ({footnote5:.3f}%)
numerical error, "as the two methods reduce to the same", and its Table 4 text finds "no significant
difference" between c = 0 and c = 0.1 across its DN+DyLU runs, up to 0.20% (60M: 24.53 against 24.69
perplexity; the 60M row's sign against DiLoCo flips between the two). Its abstract: the method "matches the
performance of synchronous Local-SGD". Taken at 0.20%, none of the 8 async rows (-0.18 to +0.06%) counts, and
geodt's async effect is none (predicted 0). With footnote 5's {footnote5:.3f}% alone, 5 of them count (all
predicted 0, so wrong) and the sign share would be {strict_share:.0%} of {strict_rows}. The paper prints no
variable that sets the sign beyond its noise: heterogeneity none and slight give the same -0.05%, moderate and
very -0.17 and -0.14%, 8 and 16 workers -0.14 and -0.18%, 60M and 150M -0.03 and +0.06%.

**Overtraining.** Every effect with a share of the loss (the DiLoCo factor, H, overlap) was measured at about
D = 20N; beyond it each is read as a token multiplier and scaled by the curve's slope s(D)/s(20N)
(simulator/models/loss_literature.overtraining_scale, held at 250 tokens per parameter). No constant of it is
fitted to these rows. Checked against the comparisons printed at 25, 100 and 250 tokens per parameter (1B on
Dolma; all held out):

{shrink}

The shape (how much is left at 250) is near the published one; the level at 25 is not: on Dolma the
M = 4 penalty is 2.25-2.63% where the same N, D/N and M on C4 give 0.81% (Streaming DiLoCo Table 6) and
Charles et al.'s law 0.4-0.5%, and M = 2 is better than data-parallel (-0.4%) where the law has it +0.15%.
Table 7's M = 4 runs also double the global batch (its caption). No form in N, D and M gives both tables;
the overtraining rows reach {over:.2f} points. Every other row is within {rest:.2f} points.

What this covers: the comparisons read in the papers' tables (facts/loss_published.csv says where each
was read and what a table does not print and was taken):

- replicas: Charles et al. 2025 Tables 4-5 (DiLoCo M = 1-8 against data-parallel, 35M-10B, D = 20N,
  H = 30; Table 4 is what Table 7's laws were fitted on, "fit"; Table 5's 4B and 10B, held out) and
  Douillard et al. 2025 (Streaming DiLoCo) Table 6 (M = 4 against M = 2, held out).
- sync_interval: Streaming DiLoCo Table 6, H = 100 against H = 30 at M = 2 and 4 (fit to 300M, held
  out at 500M and 1B).
- streaming, fragments_payload: Streaming DiLoCo Table 5 (streaming with overlapped fp4 against
  data-parallel and against DiLoCo; held out).
- overlap: Kale et al. 2025 Table 2 (500M: naive and eager delay of one and two outer steps; the naive
  and the two-step rows fit the cost and the exponent), Table 3, Table 6 (eager, 35M-1B: fit) and
  Table 1 (eager at 25-250 tokens per parameter on 1B, held out).
- overtraining: Streaming DiLoCo Table 7 (1B on Dolma at 25B, 100B and 250B tokens, M = 2 and 4;
  held out).
- async: Liu et al. 2024 Tables 1-3 (async with delayed Nesterov and dynamic local updates against
  synchronous DiLoCo, 20M-150M, 4-16 workers, H = 50; perplexity, taken as ln ppl; held out). The runs are
  identical nodes: the heterogeneity levels of Table 1 are not modelled.

Not covered: H beyond 30-100, M beyond 16, naive async (geodt's async is the delayed-Nesterov kind), batch
across M (Charles et al. Finding 3: DiLoCo's optimal global batch grows with M, their Tables 9-10 give it,
but no table prints the loss away from it; Streaming DiLoCo Table 7 prints no batch size).
"""


if __name__ == "__main__":
    raise SystemExit(main())
