"""The membership fault matrix of --on-node-loss continue, measured with real processes (a benchmark, not a test).

Runs `geodt run hetero-cpu --strategy baseline --emulate --on-node-loss continue` (4 CPU nodes,
4 inner steps a round) with each fault injected at its exact point (real/membership/inject.py,
GEODT_TEST_FAULTS), --repeats times each, for each kind of round (--kinds: classic DiLoCo, or
Streaming DiLoCo with 2 fragments and τ = 1) on each network (--wans: the loopback, or the shaped
WAN of real/wan/wan.py, which needs root):
- one-lost:         node medium lost at round R's start;
- two-20ms:         medium at round R's start, slow 20 ms later (same round);
- before-round-0:   medium lost as it enters membership epoch 0, before round 0;
- joiner-killed:    medium lost at round R, restarted at once (--rejoin-after-s 0), its new process
                    killed once it asked to join.
Per case: runs, runs whose survivors finished every round (exit 0), runs whose members' final
global weights were identical (the launcher's digest check: no "differ" line), and the lost
nodes' rounds (trace rows) predicted against measured: predicted R (0 before round 0: it never
rejoins), a run counted when every lost node's rows are within ±1 of it, and the processes the
launcher saw killed per run (the joiner case: 2, the node and its restart). Every run's record
goes to results/faults/runs.csv and the table to results/faults/faults.csv (each temp name, then
rename) and to stdout; --more adds the runs to those already recorded.

--processes N runs the node lost (medium) as N processes (data parallel in the node), which leave
and join as one node: its every process dies at the fault's point. --sharding fsdp (or zero2) shards
that node's model over its processes (FSDP2, built again over the node's group in each membership
epoch: real/process/worker.py reshard_parts); a sharded node runs classic rounds only.

    python benchmarks/bench_faults.py [--repeats 5] [--rounds 8] [--round 3] [--time-scale 1]
        [--kinds classic,streaming] [--wans loopback,shaped] [--processes 1]
        [--sharding none] [--out results/faults]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SURVIVORS = ("fast", "slowest")  # in every case; slow survives where it is not lost
KINDS = {"classic": [], "streaming": ["--set", "diloco.fragments=2", "--set", "diloco.sync_delay_steps=1"]}
WANS = {"loopback": [], "shaped": ["--wan", "shaped"]}


def cases(r: int) -> list[tuple[str, str, tuple[str, ...], int, list[str]]]:
    """(case, GEODT_TEST_FAULTS, lost nodes, their predicted rounds, extra options)."""
    return [
        ("one-lost", f"medium:round:{r}", ("medium",), r, []),
        ("two-20ms", f"medium:round:{r},slow:round:{r}:20", ("medium", "slow"), r, []),
        ("before-round-0", "medium:epoch:0", ("medium",), 0, []),
        # rounds 6x as long: the restarted process (python, torch, the model: 5-12 s here) asks before the end
        ("joiner-killed", f"medium:round:{r},medium:asked:0", ("medium",), r,
         ["--rejoin-after-s", "0", "--time-scale", "6"]),
    ]


def run_once(faults: str, extra: list[str], args, out: Path) -> tuple[int, str, pd.DataFrame | None, float]:
    cmd = [sys.executable, "-m", "geodt", "run", "hetero-cpu", "--strategy", "baseline", "--emulate",
           "--on-node-loss", "continue", "--no-progress", "--out", str(out), "--timeout-s", str(args.timeout_s),
           "--time-scale", str(args.time_scale), "--set", f"training.rounds={args.rounds}",
           "--set", "training.local_steps=4", *extra]
    if args.processes > 1:
        cmd += ["--set", f'nodes.medium.gpus={{"cpu"={args.processes}}}']
    if args.sharding != "none":
        cmd += ["--set", f'nodes.medium.sharding="{args.sharding}"']
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GEODT_TEST_FAULTS": faults}
    start = time.monotonic()
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=20 * args.timeout_s)
    wall = time.monotonic() - start
    trace = pd.read_csv(out / "trace.csv") if (out / "trace.csv").exists() else None
    return result.returncode, result.stderr, trace, wall


def measure(case, kind: str, wan: str, args) -> list[dict]:
    """--repeats runs of one case: a record per run."""
    name, faults, lost, predicted, extra = case
    extra = [*extra, *KINDS[kind], *WANS[wan]]
    records = []
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
            code, err, trace, wall = run_once(faults, extra, args, Path(tmp) / "run")
        survivors = [n for n in (*SURVIVORS, "slow") if n not in lost]
        done = trace is not None and code == 0 and all(
            trace[trace.node == n]["round"].tolist() == list(range(args.rounds)) for n in survivors)
        rows = [int((trace.node == n).sum()) if trace is not None else -1 for n in lost]
        records.append({"case": name, "kind": kind, "wan": wan, "medium_processes": args.processes,
                        "medium_sharding": args.sharding, "exit": code,
                        "survivors_finished": int(done),
                        "weights_identical": int(done and "final global weights differ" not in err),
                        "lost_rounds_predicted": predicted, "lost_rounds_measured": "/".join(map(str, rows)),
                        "lost_rounds_within_1": int(all(abs(m - predicted) <= 1 for m in rows)),
                        # the joiner case's second kill: its restart, killed while joining
                        "kills": err.count("was killed by SIGKILL"), "wall_s": round(wall, 1)})
        print(f"  {name} {kind} {wan} run {k + 1}: exit {code}, lost rounds {records[-1]['lost_rounds_measured']}, "
              f"{wall:.1f} s" + ("" if code == 0 else f": {err.strip().splitlines()[-1] if err.strip() else ''}"),
              flush=True)
    return records


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per case, kind and network: the runs' counts (faults.csv)."""
    keys = ["case", "kind", "wan", "medium_processes", "medium_sharding"]
    grouped = runs.groupby(keys, sort=False)
    return pd.DataFrame({
        "runs": grouped.size(), "survivors_finished": grouped["survivors_finished"].sum(),
        "weights_identical": grouped["weights_identical"].sum(),
        "lost_rounds_predicted": grouped["lost_rounds_predicted"].first(),
        "lost_rounds_measured": grouped["lost_rounds_measured"].agg(" ".join),
        "lost_rounds_within_1": grouped["lost_rounds_within_1"].sum(),
        "kills_per_run": grouped["kills"].mean(), "median_wall_s": grouped["wall_s"].median()}).reset_index()


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round", type=int, default=3, help="the round the node(s) are lost at")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: classic, streaming")
    parser.add_argument("--wans", default=",".join(WANS), help="comma-separated: loopback, shaped (root)")
    parser.add_argument("--processes", type=int, default=1, help="processes of the node lost (medium)")
    parser.add_argument("--sharding", default="none", choices=["none", "fsdp", "zero2"],
                        help="the lost node's sharding over its --processes")
    parser.add_argument("--out", default=str(ROOT / "results" / "faults"))
    parser.add_argument("--more", action="store_true",
                        help="add these runs to the runs already in --out (runs.csv) rather than replace them")
    args = parser.parse_args()
    chosen = [c for c in cases(args.round) if not args.cases or c[0] in args.cases.split(",")]
    runs = pd.DataFrame([record for wan in args.wans.split(",") for kind in args.kinds.split(",")
                         for case in chosen for record in measure(case, kind, wan, args)])
    earlier = Path(args.out) / "runs.csv"
    if args.more and earlier.exists():
        runs = pd.concat([pd.read_csv(earlier, dtype={"lost_rounds_measured": str}), runs], ignore_index=True)
        runs["medium_processes"] = runs["medium_processes"].fillna(1).astype(int)  # runs before --processes: 1
        runs["medium_sharding"] = runs["medium_sharding"].fillna("none")  # runs before --sharding
    write_csv(runs, earlier)
    faults = table(runs)
    write_csv(faults, Path(args.out) / "faults.csv")
    print(faults.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
