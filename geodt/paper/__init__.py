"""`geodt paper [--out results/paper]`: regenerate the papers' tables and figures from the code alone.

Everything is computed (nothing is copied but the papers' own figures in geodt.paper.facts),
built in memory first, then written file by file with atomic replaces (into a new folder or an
earlier `geodt paper` output: formats/owners.py check_paper_owner, --force), so a failure writes
nothing half-made and a rerun rewrites the directory byte for byte.

Parts: facts (the papers' numbers), infer (step times from the paper's idle, row C's checks),
tables (Tables 1-3), variants (dtype × payload, B's memory band), related (papers 001 and 002),
figures (PNGs), readme + template (the README, rendered from the CSVs alone).
"""
from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pandas as pd

from formats.owners import add_force_argument, check_paper_owner
from geodt.paper import figures, readme
from geodt.paper.artifacts import compute
from simulator.outputs.outputs import write_bytes

TIMELINE_ROUNDS = 3


def build() -> dict[str, bytes]:
    """Every output file of `geodt paper`, name -> content, computed in memory."""
    art = compute()
    csvs = art.csv_files()
    files = {name: text.encode() for name, text in csvs.items()}
    files.update({name: text.encode() for name, text in art.scenario_files().items()})
    files["idle_per_node.png"] = figures.idle_per_node(art.table3, art.c_checks)
    files["timeline.png"] = figures.timeline(art.timelines, art.timeline_subtitles(), TIMELINE_ROUNDS,
                                             "step times inferred from the paper's measurements")
    files["batch_time_002.png"] = figures.batch_time(art.fit)
    files["share_001.png"] = figures.share_time(art.curves)
    frames = {name: pd.read_csv(io.StringIO(text)) for name, text in csvs.items()}
    files["README.md"] = readme.render(frames, sorted([*files, "README.md"])).encode()
    return files


def write_files(files: dict[str, bytes], out: Path) -> None:
    """Each file whole or not at all (simulator.outputs.outputs.write_bytes)."""
    for name, data in files.items():
        write_bytes(out / name, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geodt paper", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/paper", help="output directory (default: results/paper)")
    add_force_argument(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"geodt paper: --out {out}: expected a directory, found a file", file=sys.stderr)
        return 2
    files = build()
    why = check_paper_owner(out, files, args.force)  # the user's README.md is not paper's to replace
    if why is not None:
        print(f"geodt paper: {why}", file=sys.stderr)
        return 2
    try:
        write_files(files, out)
    except OSError as exc:
        print(f"geodt paper: --out {out}: cannot write ({exc.strerror or exc})", file=sys.stderr)
        return 2
    for name in sorted(files):
        print(f"wrote {out / name}")
    return 0
