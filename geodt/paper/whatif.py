"""results/what-if-1b/: 1B-8B what-ifs (issue 15), rendered from the `geodt sweep --table` folders there.

Each case is one `geodt sweep --table` run (CASES: folder, command, what it is). This module reads
their table.csv and plan.csv and writes results/what-if-1b/README.md (per case: the sharding
and recomputation `auto` chose per node, every strategy's round, idle and tokens/s) and the
repository README's short section between two markers:

    python -m geodt.paper.whatif [--dir results/what-if-1b] [--readme README.md] [--check]

--check only compares (exit 1 if either differs); tests/test_paper_whatif.py runs it. Every number
is read off the CSVs; nothing here is measured (catalog step-time estimate).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from geodt.paper.sweep_findings import replace_marked
from simulator.outputs.outputs import write_text

START = "<!-- what-if-1b: generated from results/what-if-1b by `python -m geodt.paper.whatif`; do not edit -->"
END = "<!-- /what-if-1b -->"
TABLE = "geodt sweep --table"
CASES = (  # folder, arguments after `geodt sweep --table`, description
    ("paper", "paper --set model.preset=llama-1b",
     "OpenDiLoCo's llama-1b on the paper's cluster (seq 1024, fp16, 1 Gbit/s)"),
    ("modern-1b-1g", "results/what-if-1b/modern.toml",
     "Llama-3.2-1B, seq 4096, bf16, on 8× H100 SXM, 8× A100 80GB, 8× L40S and 8× RTX 4090 at 1 Gbit/s"),
    ("modern-1b-10g", "results/what-if-1b/modern.toml --set network.bandwidth_gbps=10", "the same at 10 Gbit/s"),
    ("modern-8b-1g", "results/what-if-1b/modern-8b.toml",
     "Llama-3.1-8B, seq 8192, bf16, on 8× H100 SXM, 8× A100 80GB and 8× L40S at 1 Gbit/s"),
    ("modern-8b-10g", "results/what-if-1b/modern-8b.toml --set network.bandwidth_gbps=10", "the same at 10 Gbit/s"),
)
TOKENS_BAND = 0.05   # "the baseline's work": tokens per round within ±5% (as `geodt simulate` recommends)


def load(folder: Path) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    return {name: (pd.read_csv(folder / name / "table.csv", keep_default_na=False, na_values=[""]),
                   pd.read_csv(folder / name / "plan.csv", keep_default_na=False, na_values=[""]))
            for name, _, _ in CASES}


def _layout(plan: pd.DataFrame) -> str:
    base = plan[plan["strategy"] == "baseline"]
    return ", ".join(f"{r.node} {r.sharding}" + ("+recompute" if r.activation_checkpointing == "full" else "")
                     for r in base.itertuples())


def case_facts(table: pd.DataFrame, plan: pd.DataFrame) -> dict:
    t = table.set_index("strategy")
    same_work = t[(t["tokens_vs_baseline"] - 1).abs() <= TOKENS_BAND]
    return {"layout": _layout(plan), "base_tps": float(t.loc["baseline", "tokens_per_s"]),
            "hybrid_tps": float(t.loc["hybrid", "tokens_per_s"]),
            "streaming_tps": float(t.loc["streaming", "tokens_per_s"]),
            "best_same": str(same_work["tokens_per_s"].idxmax()), "best_same_x": float(same_work["speedup"].max()),
            "best": str(t["tokens_per_s"].idxmax()), "best_x": float(t["speedup"].max()),
            "best_tokens": float(t.loc[t["tokens_per_s"].idxmax(), "tokens_vs_baseline"]),
            "streaming_note": str(t.loc["streaming", "note"])}


def _md(frame: pd.DataFrame) -> list[str]:
    cols = list(frame.columns)
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)])


def _plan_table(plan: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for node, part in plan.groupby("node", sort=False):
        p = part.set_index("strategy")
        rows.append({"node": node, "GPUs": int(p.loc["baseline", "gpus"]), "sharding": p.loc["baseline", "sharding"],
                     "recompute": p.loc["baseline", "activation_checkpointing"],
                     "baseline step (s)": f"{p.loc['baseline', 'step_s']:.3f}",
                     "hybrid b × H": f"{p.loc['hybrid', 'batch_size']} × {p.loc['hybrid', 'local_steps']}",
                     "hybrid sharding": p.loc["hybrid", "sharding"] + (
                         "+recompute" if p.loc["hybrid", "activation_checkpointing"] == "full" else "")})
    return pd.DataFrame(rows)


def _strategy_table(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"strategy": table["strategy"],
                         "tokens/round vs baseline": table["tokens_vs_baseline"].map("{:.3f}".format),
                         "round (s)": table["round_s"].map("{:.2f}".format),
                         "idle (s)": table["idle_s"].map("{:.1f}".format),
                         "utilization": table["utilization"].map("{:.3f}".format),
                         "tokens/s": table["tokens_per_s"].map("{:,.0f}".format),
                         "speed-up": table["speedup"].map("{:.2f}×".format)})


def render_folder(frames: dict) -> str:
    lines = ["# results/what-if-1b/", "",
             ("1B-8B what-ifs (issue 15), each one `geodt sweep --table` run into the folder of its name; this file is "
             "written from their CSVs by `python -m geodt.paper.whatif` (geodt/paper/whatif.py); do not edit by hand. "
             "Step times are the catalog estimate (simulator/models/estimate.py), sharding and recomputation are "
             "chosen by `auto` (the least that holds the baseline batch on each node; per strategy, the least that "
             "holds its batch), the outer state is on the CPU (OpenDiLoCo). Nothing here is measured. `modern.toml` "
             "and `modern-8b.toml` are the results-local scenarios (their comments say why the 8B case has no RTX 4090 "
             "node: it needs 34.2 GiB per card even fully sharded with recomputation)."), ""]
    for name, args, what in CASES:
        table, plan = frames[name]
        f = case_facts(table, plan)
        lines += [f"## `{name}/`: {what}", "", f"`{TABLE} {args} --out results/what-if-1b/{name}`", ""]
        lines += _md(_plan_table(plan)) + [""] + _md(_strategy_table(table)) + [""]
        lines += [(f"At the baseline's tokens per round (±5%) `{f['best_same']}` is fastest, "
                  f"{f['best_same_x']:.2f}× the baseline's tokens/s; over all, `{f['best']}` ({f['best_x']:.2f}×, "
                  f"at {f['best_tokens']:.2f}× the "
                  f"baseline's tokens per round). `streaming`: {f['streaming_note']}."), ""]
    return "\n".join(lines)


def render_section(frames: dict) -> str:
    rows = []
    for name, _, _what in CASES:
        f = case_facts(*frames[name])
        rows.append({"case (results/what-if-1b/)": f"`{name}`", "sharding chosen (baseline batch)": f["layout"],
                     "baseline tokens/s": f"{f['base_tps']:,.0f}", "hybrid": f"{f['hybrid_tps'] / f['base_tps']:.2f}×",
                     "streaming": (f"{f['streaming_tps'] / f['base_tps']:.2f}× "
                                   f"({f['streaming_tps'] / f['hybrid_tps']:.2f}× hybrid)"),
                     "most tokens/s": f"`{f['best']}` {f['best_x']:.2f}× (at {f['best_tokens']:.2f}× the tokens)"})
    cases = "; ".join(f"`{name}`: {what}" for name, _, what in CASES)
    return "\n".join([f"Cases ({cases}); speed-ups are tokens/s over the baseline's:", ""] + _md(pd.DataFrame(rows)))


def replace_section(readme: str, section: str) -> str:
    return replace_marked(readme, section, START, END)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodt.paper.whatif", description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="results/what-if-1b")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--check", action="store_true", help="only compare; exit 1 if either README differs")
    args = p.parse_args(argv)
    folder, readme = Path(args.dir), Path(args.readme)
    try:
        frames = load(folder)
        own, text = render_folder(frames), readme.read_text()
        new = replace_section(text, render_section(frames))
        old_own = (folder / "README.md").read_text() if (folder / "README.md").exists() else None
    except (OSError, KeyError, ValueError) as exc:
        print(f"geodt.paper.whatif: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text or own != old_own:
            print(f"{readme} or {folder}/README.md differ from {folder}'s CSVs; re-render without --check",
                  file=sys.stderr)
            return 1
        return 0
    write_text(folder / "README.md", own)
    write_text(readme, new)
    print(f"wrote {folder}/README.md, {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
