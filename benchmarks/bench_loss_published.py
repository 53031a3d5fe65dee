"""Every published comparison in facts/loss_published.csv recomputed through the simulator's loss path.

Each row is a loss at equal tokens, published, of one setting against a reference (e.g. DiLoCo with M
replicas against data-parallel, Charles et al. 2025 Tables 4 and 5). For each, a scenario of M
identical nodes at the row's model size N is built (`geodt simulate`'s loss_setup: the literature path,
as for every model outside the built-in profile's span), D = the row's tokens, H = the row's inner
steps, and the baseline (DiLoCo) and sync-ddp (data-parallel) strategies are predicted by
loss_prediction.predict on their simulated rounds; the predicted Δloss % is the setting's loss over the
reference's, each at the run's last token (the papers compare final losses at equal tokens). Printed and written to --out: the table (loss_published.csv), errors and sign agreement per
effect (summary.csv), a figure (predicted against published Δloss %), and a README with the machine and
command. Goals (issue 55): sign right in >= 90% of the comparisons whose published effect exceeds its
rounding, median |error| <= 0.3 points, worst <= 1.5.

    python benchmarks/bench_loss_published.py --out results/loss-published
"""
from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOALS = {"sign_share": 0.90, "median_abs_error": 0.3, "worst_abs_error": 1.5}


def scenario_for(row) -> object:
    """A scenario of `replicas` identical one-GPU nodes training N parameters for the row's tokens at H."""
    from simulator.scenario import load_scenario

    seq_len, batch, gpus = 2048, 8, 4  # gpus: the paper scenario's node1, copied M times (identical_nodes)
    rounds = max(1, round(row.tokens / (row.replicas * row.sync_steps * batch * gpus * seq_len)))
    return load_scenario("paper", [f"model.params={row.params:.0f}", f"model.seq_len={seq_len}",
                                   f"training.batch_size={batch}", f"training.local_steps={int(row.sync_steps)}",
                                   f"training.rounds={rounds}"])


def predicted_delta_pct(row) -> float:
    """The setting's loss over the reference's, in %, through loss_prediction.predict on simulated rounds."""
    from simulator.engines.engine import simulate
    from simulator.models.loss_prediction import loss_setup, plan_rounds, predict
    from simulator.strategies import make_plan

    scenario = identical_nodes(scenario_for(row), int(row.replicas))
    setup = loss_setup(scenario)
    out = {}
    for name in ("baseline", "sync-ddp"):
        plan = make_plan(scenario, name)
        rounds = plan_rounds(plan, simulate(scenario, plan, "auto"))
        out[name] = predict(setup, scenario, plan, rounds)["loss_last_token"]  # equal tokens: the run's last
    return 100.0 * (out["baseline"] / out["sync-ddp"] - 1.0)


def identical_nodes(scenario, replicas: int):
    """The scenario with `replicas` copies of its first node (identical replicas: the papers' setting)."""
    from dataclasses import replace

    first = scenario.nodes[0]
    return replace(scenario, nodes=tuple(replace(first, name=f"node{i + 1}") for i in range(replicas)))


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per effect and use (fit / held-out) and all: comparisons, sign agreement where the published effect
    exceeds its rounding, median and worst |error| in points of loss %."""
    rows = []
    for (effect, use), g in [*table.groupby(["effect", "use"]), (("all", "all"), table)]:
        big = g[g["published_delta_pct"].abs() > g["rounding_pct"]]
        agree = (np.sign(big["predicted_delta_pct"]) == np.sign(big["published_delta_pct"])).mean()
        err = g["error_pct"].abs()
        rows.append({"effect": effect, "use": use, "comparisons": len(g), "beyond_rounding": len(big),
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
    from simulator.models.loss_literature import published

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
    cols = ["table", "params", "replicas", "published_delta_pct", "predicted_delta_pct", "error_pct", "use"]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print()
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    whole = summary[summary["effect"] == "all"].iloc[0]
    met = (whole["sign_share"] >= GOALS["sign_share"] and whole["median_abs_error"] <= GOALS["median_abs_error"]
           and whole["worst_abs_error"] <= GOALS["worst_abs_error"])
    line = (f"goals (sign >= 90%, median |error| <= 0.3, worst <= 1.5 points): sign {whole['sign_share']:.0%} of "
            f"{int(whole['beyond_rounding'])}, median {whole['median_abs_error']:.2f}, worst "
            f"{whole['worst_abs_error']:.2f}: {'met' if met else 'NOT met'}")
    print(line)
    (out / "verdicts.txt").write_text(line + "\n")
    (out / "README.md").write_text(_readme(line))
    return 0


def _readme(line: str) -> str:
    return f"""# Published loss comparisons, recomputed (issue 55)

`python benchmarks/bench_loss_published.py --out results/loss-published` on {platform.machine()} Linux
({platform.python_version()}), CPU only (no accelerator is used: the loss path is arithmetic).

Each row of facts/loss_published.csv (published loss at equal tokens, setting against reference) is
recomputed through `geodt simulate`'s loss path: a scenario of M identical nodes at the row's N, D and
H, its baseline (DiLoCo) and sync-ddp (data-parallel) strategies simulated and predicted
(simulator/models/loss_prediction.predict). Files: loss_published.csv (every comparison, predicted and
error in points of loss %), summary.csv (per effect and use: sign agreement where the published effect
exceeds its rounding, median and worst |error|), predicted_vs_published.png.

{line}

What this covers: only the comparisons whose figures were read in the papers (Charles et al. 2025
Tables 4 and 5: DiLoCo M = 1-8 against data-parallel, 35M-10B, D = 20N, H = 30). Table 4 is what
Table 7's laws were fitted on ("fit"); Table 5's 4B and 10B runs came after ("held-out"). The H,
overlap, eager, async and payload effects rest on figures quoted by issue 55 that were not read in
the papers here (docs/MODELS.md), so they have no rows and are not checked by this benchmark.
"""


if __name__ == "__main__":
    raise SystemExit(main())
