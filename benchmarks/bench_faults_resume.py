"""Two faults that lost data or left processes (issue 59), measured with real processes (a benchmark,
not a test; beside benchmarks/bench_faults.py):

- resume-bad-node: `geodt run hetero-cpu --emulate --checkpoint-every 1 --stop-after S`, then one byte
  flipped in every kept `checkpoints/node<i>/round-*/global.pt` of one node (a different node and
  byte each run), then the same command with `--resume`. Counted: the exit status, whether stderr
  is one line naming the node, and every other file under checkpoints/ byte-identical before and
  after (sets lost: those that changed or went). Was: exit 0, all rounds trained again from the
  start and every intact set of the other nodes deleted by the keep rotation.
- killed-parent: `geodt calibrate convergence hetero-cpu --runs baseline` SIGKILLed once its run's
  4 workers train, with a $TMPDIR of its own. Counted: its descendants still running 30 s later,
  and what it left in $TMPDIR that nothing removes (a launcher's rendezvous folder, which the next
  launch removes once its launcher is gone, counted apart; torch's compile cache, which every run
  keeps, not counted). Was: the run and its 4 workers trained
  to the end; an 18 MB folder stayed in $TMPDIR.

Each case --repeats times (5). Every run's record goes to OUT/runs.csv, the table to
OUT/table.csv (each temp name, then rename) and to stdout.

    python benchmarks/bench_faults_resume.py [--repeats 5] [--rounds 6] [--stop-after 4]
        [--cases resume-bad-node,killed-parent] [--more] [--out results/faults/resume-killed]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from tests.proctree import launcher_env, running
from tests.test_killed_parent import descendants, kill_once_training

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NODES = ("fast", "medium", "slow", "slowest")  # hetero-cpu's, in plan order


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _run(args, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "geodt", "run", "hetero-cpu", "--strategy", "baseline", "--emulate", "--no-progress",
           "--checkpoint-every", "1", "--stop-after", str(args.stop_after), "--out", str(out),
           "--set", f"training.rounds={args.rounds}", "--set", "training.local_steps=2", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def resume_bad_node(args, work: Path, stopped: Path, k: int) -> dict:
    """One --resume after every kept global.pt of one node got a flipped byte."""
    rng = random.Random(k)
    out = work / f"resume-{k}"
    shutil.copytree(stopped, out)
    index = 1 + k % (len(NODES) - 1)  # a node other than the first: the "second node" and the others
    victim = out / "checkpoints" / f"node{index}"
    flipped = sorted(victim.glob("round-*/global.pt"))
    for path in flipped:
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    before = _digests(out / "checkpoints")
    start = time.monotonic()
    done = _run(args, out, "--resume")
    wall = time.monotonic() - start
    after = _digests(out / "checkpoints")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"case": "resume-bad-node", "run": k, "node": NODES[index], "sets_flipped": len(flipped),
            "exit": done.returncode, "one_line": len(lines) == 1, "names_node": f"node {NODES[index]}" in done.stderr,
            "files_before": len(before), "files_changed_or_lost": sum(after.get(f) != d for f, d in before.items()),
            "descendants_left": None, "folders_outside": None, "wall_s": round(wall, 2),
            "stderr": lines[-1][:300] if lines else ""}


def _descendants(pid: int) -> list[int]:
    return descendants(pid)


def killed_parent(args, work: Path, k: int) -> dict:
    """One `calibrate convergence` SIGKILLed once its run's workers train, with a $TMPDIR of its own
    (other programs' folders in the shared one are not counted)."""
    folder, tmpdir = work / f"killed-{k}", work / f"tmpdir-{k}"
    folder.mkdir()
    tmpdir.mkdir()
    cmd = [sys.executable, "-m", "geodt", "calibrate", "convergence", "hetero-cpu", "--runs", "baseline",
           "--out", str(folder / "conv.csv"), "--set", "training.rounds=400", "--set", "training.local_steps=3",
           "--time-scale", "0.5"]
    start = time.monotonic()
    found, left = kill_once_training(cmd, workers=4, end_s=30.0, env={**launcher_env(), "TMPDIR": str(tmpdir)})
    wall = time.monotonic() - start
    # a launcher's rendezvous folder (geodt-rdzv-<pid>-*) is removed by the next launch once its pid is gone;
    # torchinductor_<user> is torch's compile cache, made and kept by every run alike (not a leftover)
    outside = sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_"))
    kept = [n for n in outside if not n.startswith("geodt-rdzv-")]
    beside = sorted(p.name for p in folder.iterdir())
    return {"case": "killed-parent", "run": k, "node": None, "sets_flipped": None, "exit": -signal.SIGKILL,
            "one_line": None, "names_node": None, "files_before": None, "files_changed_or_lost": None,
            "descendants_left": len([p for p in left if running(p)]), "descendants": len(found),
            "folders_outside": len(kept), "rendezvous_left": len(outside) - len(kept), "wall_s": round(wall, 2),
            "stderr": f"$TMPDIR: {', '.join(outside) or '-'}; beside the profile: {', '.join(beside) or '-'}"}


def _write(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def table(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for case, g in runs.groupby("case", sort=False):
        row = {"case": case, "runs": len(g), "median_wall_s": g["wall_s"].median()}
        if case == "resume-bad-node":
            row.update(refused_exit_2=int((g["exit"] == 2).sum()), one_line_naming_node=int(
                (g["one_line"].astype(bool) & g["names_node"].astype(bool)).sum()),
                files_changed_or_lost=int(g["files_changed_or_lost"].sum()))
        else:
            row.update(descendants_left=int(g["descendants_left"].sum()),
                       folders_outside_out=int(g["folders_outside"].sum()),
                       rendezvous_left=int(g["rendezvous_left"].sum()))
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--stop-after", type=int, default=4)
    p.add_argument("--cases", default="resume-bad-node,killed-parent")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "faults" / "resume-killed")
    p.add_argument("--more", action="store_true", help="keep the recorded runs of the cases not run now")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-resume-") as tmp:
        work = Path(tmp)
        if "resume-bad-node" in args.cases:
            stopped = work / "stopped"
            done = _run(args, stopped)
            assert done.returncode == 0, done.stderr[-2000:]
            for k in range(args.repeats):
                records.append(resume_bad_node(args, work, stopped, k))
                print(records[-1], flush=True)
        if "killed-parent" in args.cases:
            for k in range(args.repeats):
                records.append(killed_parent(args, work, k))
                print(records[-1], flush=True)
    runs = pd.DataFrame(records)
    if args.more and (args.out / "runs.csv").exists():
        earlier = pd.read_csv(args.out / "runs.csv")
        runs = pd.concat([earlier[~earlier["case"].isin(set(runs["case"]))], runs], ignore_index=True)
    _write(runs, args.out / "runs.csv")
    summary = table(runs)
    _write(summary, args.out / "table.csv")
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
