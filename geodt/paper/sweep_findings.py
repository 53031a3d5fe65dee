"""The README's "When each strategy wins" findings, rendered from results/sweep/sweep.csv.

Every number in that section is computed here from sweep.csv (and the base scenario's dtype and
payload from the scenario.toml beside it), and the README holds the rendered text between two
markers: the idle each strategy leaves, and a one-line pointer to results/sweep/README.md, which
this also writes, with the throughput details (per bandwidth: the winners, the speed-ups, the
payloads, streaming, B and sync-ddp). After a new sweep, re-render both:

    python -m geodt.paper.sweep_findings [--sweep results/sweep] [--readme README.md] [--check]

--check only compares (exit 1 if either differs); tests/test_sweep_findings.py
runs the same comparison, so the README cannot drift from the committed CSV. The text names
no winner in advance: which strategy wins, and by how much, is read off the CSV.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from formats.toml import tomllib
from simulator.outputs.outputs import write_text

START = "<!-- sweep-findings: generated from results/sweep by `python -m geodt.paper.sweep_findings`; do not edit -->"
END = "<!-- /sweep-findings -->"
UNDER = 0.10            # "under 10% of the baseline's idle"
SPREAD = 3.0            # "the slowest node's step within 3× of the fastest's" (sweep_figures' 3-10x bin starts here)
ALIKE = 1.001           # speed_ratio below this: all nodes equally fast (simulator.sweep.sweep_figures' "alike")
PAPER = ("A", "B", "C", "C-slowest")
BALANCED = ("measured-steps", "hybrid", "network-aware")


def _pct(x: float) -> str:
    """A share in %, with as many digits as it needs to differ from its neighbours (0.46, 72, 160)."""
    return f"{x:.2g}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _winners(frame: pd.DataFrame) -> pd.DataFrame:
    """Per scenario, the strategy with the most tokens per second (ties: the first in the CSV's order)."""
    order = {s: i for i, s in enumerate(dict.fromkeys(frame["strategy"]))}
    ranked = frame.assign(_o=frame["strategy"].map(order)).sort_values(
        ["scenario_id", "tokens_per_s", "_o"], ascending=[True, False, True])
    return ranked.groupby("scenario_id", sort=True).head(1)


def findings(frame: pd.DataFrame) -> dict:
    strategies = list(dict.fromkeys(frame["strategy"]))
    base = frame[frame["strategy"] == "baseline"]
    n = base["scenario_id"].nunique()
    zero = int(base["idle_left"].isna().sum())
    out = {"mixes": frame["nodes"].nunique(), "scenarios": n, "zero": zero, "with_idle": n - zero,
           "bandwidths": sorted(frame["bandwidth_gbps"].unique()), "payload": base["payload_dtype"].iloc[0],
           "zero_alike": bool((base.loc[base["idle_left"].isna(), "speed_ratio"] < ALIKE).all())}
    by = {s: frame[frame["strategy"] == s] for s in strategies}
    out["median_left_pct"] = {s: float(by[s]["idle_left"].median() * 100) for s in strategies if s != "baseline"}
    tokens = base.set_index("scenario_id")["tokens_per_round"]
    out["median_tokens_x"] = {s: float((by[s].set_index("scenario_id")["tokens_per_round"] / tokens).median())
                              for s in strategies}
    out["under_pct"] = {s: float((by[s]["idle_left"].dropna() < UNDER).mean() * 100) for s in BALANCED if s in by}
    out["under_all_pct"] = {s: float((by[s]["idle_left"] < UNDER).sum() / n * 100) for s in BALANCED if s in by}
    win = _winners(frame)
    out["wins"] = {}
    for bw in out["bandwidths"]:
        w = win[win["bandwidth_gbps"] == bw]["strategy"].value_counts()
        out["wins"][bw] = (str(w.index[0]), float(w.iloc[0] / w.sum() * 100))
    out["win_counts"] = win["strategy"].value_counts().to_dict()
    b_wins = win[win["strategy"] == "B"]
    out["b_wins"], out["b_wins_alike"] = len(b_wins), int((b_wins["speed_ratio"] < ALIKE).sum())
    out["speedup"] = {s: {bw: float(by[s].loc[by[s]["bandwidth_gbps"] == bw, "speedup"].median())
                          for bw in out["bandwidths"]} for s in strategies}
    if "network-aware" in by:
        na = by["network-aware"]
        out["na_payloads"] = {bw: na.loc[na["bandwidth_gbps"] == bw, "payload_dtype"].value_counts().to_dict()
                              for bw in out["bandwidths"]}
    if "streaming" in by and "hybrid" in by:
        out["streaming"] = _streaming(frame, by, win, out["bandwidths"])
    return out


def _streaming(frame: pd.DataFrame, by: dict, win: pd.DataFrame, bandwidths: list) -> dict:
    """Per bandwidth: scenarios `streaming` wins, its median tokens/s over hybrid's (whose b and H it keeps),
    and where it wins, its median margin over the best other strategy and which that is most often."""
    st = by["streaming"].set_index("scenario_id")
    over_hybrid = st["tokens_per_s"] / by["hybrid"].set_index("scenario_id")["tokens_per_s"]
    others = frame[frame["strategy"] != "streaming"].sort_values(["scenario_id", "tokens_per_s"],
                                                                 ascending=[True, False])
    runner = others.groupby("scenario_id").head(1).set_index("scenario_id")
    margin = st["tokens_per_s"] / runner["tokens_per_s"]
    won = set(win.loc[win["strategy"] == "streaming", "scenario_id"])
    out = {}
    for bw in bandwidths:
        ids = st.index[st["bandwidth_gbps"] == bw]
        wins = [i for i in ids if i in won]
        out[bw] = {"wins": len(wins), "of": len(ids), "over_hybrid": float(over_hybrid[ids].median()),
                   "wins_within_3x": int((st.loc[wins, "speed_ratio"] < SPREAD).sum()),
                   "margin": float(margin[wins].median()) if wins else None,
                   "runner_up": str(runner.loc[wins, "strategy"].value_counts().index[0]) if wins else None}
    return out


def _bws(values: dict, fmt) -> str:
    items = [fmt(v) for v in values.values()]
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


def render(frame: pd.DataFrame, dtype: str) -> str:
    """The README's section: what the sweep covers, the figures, the idle left, the pointer to the details."""
    f = findings(frame)
    med, tok = f["median_left_pct"], f["median_tokens_x"]
    bw_text = ", ".join(f"{b:g}" for b in f["bandwidths"])
    lines = [
        (f"From `results/sweep/` (`geodt sweep`: {f['mixes']:,} mixes of four nodes of four GPUs over eight GPU types, "
        f"each at {bw_text} Gbit/s: {f['scenarios']:,} scenarios; base scenario `paper` in {dtype} with "
        f"{f['payload']} payloads; `sweep.csv` has one row per scenario × strategy)."),
        "",
        "![idle left per strategy](results/sweep/idle_left.png)",
        "![which strategy wins](results/sweep/winners.png)",
        "",
    ]
    paper = [s for s in PAPER if s in med]
    text = ("At the baseline's token count, the median scenario keeps "
            + _bws({s: s for s in paper}, lambda s: f"{_pct(med[s])}% of the baseline's idle under {s}"
                   if s == paper[0] else f"{_pct(med[s])}% under {s}") + ". ")
    balanced = [s for s in BALANCED if s in med]
    if balanced:
        text += ("Balancing the nodes' measured step times, the median scenario keeps "
                 + _bws({s: s for s in balanced},
                        lambda s: f"{_pct(med[s])}% under `{s}` (at {tok[s]:.2f}× the baseline's tokens per round)")
                 + ". ")
        lo, hi = min(f["under_pct"].values()), max(f["under_pct"].values())
        lo_all, hi_all = min(f["under_all_pct"].values()), max(f["under_all_pct"].values())
        why = "all nodes equally fast" if f["zero_alike"] else "no idle at all"
        text += (f"Each of them stays under 10% of the baseline's idle in {lo:.1f}-{hi:.1f}% of the "
                 f"{f['with_idle']:,} scenarios whose baseline idles; the other {f['zero']} ({why}) have no idle "
                 f"to remove, and counted as misses they bring the share over all {f['scenarios']:,} scenarios to "
                 f"{lo_all:.1f}-{hi_all:.1f}%.")
    lines.append(text)
    lines.append("")
    wins = ", ".join(f"`{w}` at {bw:g} Gbit/s" for bw, (w, _) in f["wins"].items())
    lines.append(f"Most tokens per second: {wins}; per bandwidth, by how much, and with which payload: "
                 "[results/sweep/README.md](results/sweep/README.md).")
    return "\n".join(lines)


def render_details(frame: pd.DataFrame) -> str:
    """results/sweep/README.md's findings: throughput per bandwidth, strategy by strategy."""
    f = findings(frame)
    bw_text = ", ".join(f"{b:g}" for b in f["bandwidths"])
    wins = ", ".join(f"at {bw:g} Gbit/s `{w}` ({p:.0f}% of the scenarios)" for bw, (w, p) in f["wins"].items())
    text = f"Most tokens per second: {wins}."
    sp = f["speedup"]
    if "network-aware" in sp and "hybrid" in sp:
        text += (" Median speed-up over the baseline, `network-aware` "
                 + _bws(sp["network-aware"], lambda v: f"{v:.2f}×") + ", `hybrid` "
                 + _bws(sp["hybrid"], lambda v: f"{v:.2f}×") + f" at {bw_text} Gbit/s.")
        pays = f["na_payloads"]
        text += (f" `network-aware`'s payload, mixes out of {f['mixes']}: "
                 + "; ".join(f"{bw:g} Gbit/s " + ", ".join(f"{k} {v}" for k, v in
                                                           sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))
                             for bw, d in pays.items()) + ".")
    if "streaming" in f:
        text += " " + _streaming_text(f["streaming"])
    if "B" in sp:
        text += (f" `B` wins {f['b_wins']} scenarios, {f['b_wins_alike']} of them with all nodes equally fast "
                 "(larger batches are then pure gain).")
    if "sync-ddp" in sp:
        text += (" `sync-ddp` pays an all-reduce per step: " + _bws(sp["sync-ddp"], lambda v: f"{v:.2f}×")
                 + f" the baseline's throughput; it wins {f['win_counts'].get('sync-ddp', 0)} scenarios.")
    return text


DETAILS_HEAD = ("# results/sweep: what-ifs over node mixes\n\n"
                "`geodt sweep`'s dataset (`sweep/`, `sweep.csv`), its figures and base scenario; the top-level "
                "README's \"When each strategy wins\" summarises it. Throughput, per bandwidth:\n\n")


def details_file(old: str | None, section: str) -> str:
    """results/sweep/README.md with its marked section replaced (the whole file when it has none yet)."""
    if old is not None and START in old:
        return replace_section(old, section)
    return f"{DETAILS_HEAD}{START}\n{section}\n{END}\n"


def _streaming_text(per_bw: dict) -> str:
    parts = []
    for bw, s in per_bw.items():
        part = f"at {bw:g} Gbit/s it wins {s['wins']} of {s['of']}"
        if s["wins"]:
            part += (f" ({s['wins_within_3x']} of them with the slowest node's step within 3× of the fastest's), "
                     f"by a median {(s['margin'] - 1) * 100:.1f}% over the next best (most often `{s['runner_up']}`)")
        parts.append(part + f", and gives {s['over_hybrid']:.2f}× hybrid's tokens/s")
    return ("`streaming` keeps hybrid's b and H and hides each fragment's all-reduce under τ inner steps: "
            + "; ".join(parts) + " (medians).")


def replace_marked(readme: str, section: str, start: str, end: str) -> str:
    """readme with the text between the markers start and end replaced by section."""
    if start not in readme or end not in readme:
        raise ValueError(f"README: expected the markers {start!r} and {end!r}")
    head, rest = readme.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{section}\n{end}{tail}"


def replace_section(readme: str, section: str) -> str:
    return replace_marked(readme, section, START, END)


def load(sweep_dir: Path) -> tuple[pd.DataFrame, str]:
    if (sweep_dir / "sweep.csv").exists():
        frame = pd.read_csv(sweep_dir / "sweep.csv", keep_default_na=False, na_values=[""])
    else:  # the Parquet dataset alone (geodt sweep without --csv; simulator/sweep/sweep_dataset.py)
        frame = pd.read_parquet(sweep_dir / "sweep")
    with open(sweep_dir / "scenario.toml", "rb") as fh:
        dtype = tomllib.load(fh)["model"]["dtype"]
    return frame, dtype


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodt.paper.sweep_findings", description=__doc__.splitlines()[0])
    p.add_argument("--sweep", default="results/sweep",
                   help="directory with sweep.csv (or the dataset sweep/) and scenario.toml")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--check", action="store_true", help="only compare; exit 1 if the README differs")
    args = p.parse_args(argv)
    readme, details = Path(args.readme), Path(args.sweep) / "README.md"
    try:
        frame, dtype = load(Path(args.sweep))
        text = readme.read_text()
        old = details.read_text() if details.exists() else None
        pages = {readme: (text, replace_section(text, render(frame, dtype))),
                 details: (old, details_file(old, render_details(frame)))}
    except (OSError, KeyError, ValueError) as exc:
        print(f"sweep_findings: {exc}", file=sys.stderr)
        return 2
    if args.check:
        differ = [str(path) for path, (was, new) in pages.items() if was != new]
        if differ:
            print(f"{', '.join(differ)}: the sweep findings differ from {args.sweep}/sweep.csv; re-render without "
                  "--check", file=sys.stderr)
            return 1
        return 0
    for path, (_, new) in pages.items():
        write_text(path, new)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
