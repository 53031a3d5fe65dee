"""results/time-to-loss/: every strategy's predicted loss and time to a target, on the paper's cluster and a 1B fleet.

For each scenario, `geodt simulate SCENARIO --target-loss L` into results/time-to-loss/<name>/, L the
baseline's predicted loss at TARGET_SHARE of its run (so the baseline reaches it, late), then
README.md rendered from the summary.csv files. Nothing here is measured at this scale: the step
times are the catalog's estimate, the curve is the literature prior (no convergence profile trained
these models), and so are the strategies' effects (simulator/models/loss_literature.py: outside the
built-in profile's span its tiny-model coefficients are not used); the README says so.

    python benchmarks/time_to_loss_at_scale.py [--out results/time-to-loss]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.cli import simulate_main
from simulator.engines.engine import simulate
from simulator.models.loss_prediction import loss_setup, plan_rounds
from simulator.scenario import load_scenario
from simulator.strategies import make_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_SHARE = 0.6
SCENARIOS = {  # name -> (scenario, overrides, what it is)
    "paper": ("paper", [], ("the paper's cluster (docs/PAPERS.md 000): llama-150m, 4 nodes of 4 GPUs, 1 Gbit/s, "
                           "10 rounds of H = 100")),
    "modern-1b": (str(ROOT / "results" / "what-if-1b" / "modern.toml"), ["training.rounds=40"],
                  ("a mixed fleet (results/what-if-1b/modern.toml): Llama-3.2-1B at seq 4096, nodes of 8 H100, A100, "
                  "L40S, RTX 4090, 1 Gbit/s, 40 rounds of H = 100")),
}


def target_of(source: str, overrides: list[str]) -> float:
    """The baseline's predicted round loss at TARGET_SHARE of its tokens, rounded up to 0.01."""
    scenario = load_scenario(source, overrides)
    plan = make_plan(scenario, "baseline")
    tokens = plan_rounds(plan, simulate(scenario, plan, "auto"))["tokens"].sum()
    return float(np.ceil(100 * loss_setup(scenario).model.curve.loss(TARGET_SHARE * tokens)) / 100)


def run(name: str, out: Path) -> tuple[pd.DataFrame, str, float]:
    source, overrides, _ = SCENARIOS[name]
    target = target_of(source, overrides)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = simulate_main([source, "--target-loss", f"{target:g}", "--out", str(out / name),
                              *[a for o in overrides for a in ("--set", o)]])
    if code != 0:
        raise SystemExit(f"geodt simulate {name} failed ({code})")
    (out / name / "trace.json").unlink()  # 3-10 MB of events the command regenerates; not kept in results/
    text = printed.getvalue()
    answer = text[text.rindex("\nstrategy "):].strip()
    summary = pd.read_csv(out / name / "summary.csv")
    return summary, answer, target


def table(summary: pd.DataFrame) -> str:
    per = summary.groupby("strategy", sort=False).agg(tokens=("tokens", "sum"), idle_s=("idle_s", "sum"),
                                                      loss_end=("loss_end", "first"),
                                                      reach=("time_to_target_s", "first"))
    base = per.loc["baseline", "reach"]
    lines = [("| strategy | run tokens / baseline's | idle (s) | predicted loss at the end | time to target (s) "
             "| × baseline's |"), "|---|---|---|---|---|---|"]
    for name, r in per.iterrows():
        reach = f"{r.reach:,.0f}" if np.isfinite(r.reach) else "never"
        ratio = f"{r.reach / base:.2f}" if np.isfinite(r.reach) and np.isfinite(base) else "–"
        lines.append(f"| {name} | {r.tokens / per.loc['baseline', 'tokens']:.3f} | {r.idle_s:,.1f} "
                     f"| {r.loss_end:.3f} | {reach} | {ratio} |")
    return "\n".join(lines)


def bench_section(bench: Path) -> str:
    """bench_time_to_loss.py's table (bench/time_to_loss.csv) and its verdicts, as Markdown."""
    t = pd.read_csv(bench / "time_to_loss.csv")
    lines = ["## Predicted against measured (benchmarks/bench_time_to_loss.py)", "",
             ("Fitted on one node mix, reported on another; what each part is: the benchmark's docstring. "
             "loss model alone: the predicted round losses on the run's own round ends."), "",
             "| model | mix | strategy | target | predicted (s) | measured (s) | error | loss model alone |",
             "|---|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        lines.append(f"| {r.model} | {r.mix} | {r.strategy} | {r.target_loss:g} | {r.predicted_s:.2f} "
                     f"| {r.measured_s:.2f} | {r.error_pct:+.1f}% | {r.loss_model_error_pct:+.1f}% |")
    verdicts = (bench / "verdicts.txt").read_text().strip().splitlines() if (bench / "verdicts.txt").exists() else []
    return "\n".join(lines + [""] + [f"- {v}" for v in verdicts]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "time-to-loss")
    args = parser.parse_args()
    parts = [(f"# Time to loss at scale, predicted\n\nGenerated by `python benchmarks/time_to_loss_at_scale.py` "
             f"on {date.today().isoformat()} ({platform.machine()}, Python {platform.python_version()}); each folder "
             "holds `geodt simulate`'s outputs (summary.csv with loss_end and time_to_target_s, loss.png; trace.json left out: the command makes it).\n\n"
             "**Assumptions.** Nothing here was measured at this scale. Step times: the catalog estimate "
             "(simulator/models/estimate.py). Loss curve: the literature prior (Besiroglu et al. 2024's Chinchilla fit on "
             "MassiveText-like data × Charles et al. 2025's DiLoCo factor for M replicas at H = 30, "
             "docs/PAPERS.md): a level and a shape, not a measurement of these models on your data. Each "
             "strategy's effect on the loss: the published forms of simulator/models/loss_literature.py "
             "(docs/MODELS.md, \"Loss effects\"; these models are outside the built-in convergence profile's "
             "span, so none of its tiny-model coefficients is used); the printed notes name each effect's "
             "source, its band and what lies beyond a source's range. The target is the baseline's "
             f"predicted loss at {TARGET_SHARE:.0%} of its run.\n")]
    bench = args.out / "bench"
    if (bench / "time_to_loss.csv").exists():  # bench_time_to_loss.py's table, rendered beside
        parts.append(bench_section(bench))
    for name in SCENARIOS:
        summary, answer, target = run(name, args.out)
        parts.append(f"## {name}: {SCENARIOS[name][2]}\n\nTarget loss {target:g}.\n\n{table(summary)}\n\n"
                     f"What `geodt simulate` printed:\n\n```\n{answer}\n```\n\n![{name}]({name}/loss.png)\n")
    (args.out / "README.md").write_text("\n".join(parts))
    print(f"wrote {args.out / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
