"""A node lost and rejoining under --on-node-loss continue (a benchmark, not a test).

Runs `geodt validate` on `hetero-cpu` (4 CPU nodes, emulated steps; --strategy baseline by default,
any classic DiLoCo strategy: rebalance and deadline re-plan each round) with `nodes.<node>.outage =
{round = R, rounds = K}` and `simulation.on_node_loss = "continue"`: the node's process SIGKILLs
itself at round R's start (real/membership/members.py), the launcher restarts it at once, and it is admitted
no earlier than round R + K. Prints, from that one run:
- the survivors' work lost at the loss: inner steps discarded (their rounds without a row) and the
  seconds the recovery took (the loss round's idle_s beyond the median idle_s of the rounds
  before it), beside one round's length: the issue's goal is at most one round;
- the lost node: the rounds it missed, the round it rejoined at against the predicted one (R + K,
  or later when its restart, priced at --restart-s, outlasts K rounds), and
  the time from its restart to its admission (process start and model build, then the wait for
  the round boundary), from its own line;
- the samples the members did per round against the plan's K (an adaptive plan's survivors absorb
  the lost node's share from the round after the loss; a static plan's do not);
- per node, predicted against measured tokens, compute and idle (validation.csv).
With --no-prediction it runs `geodt run` instead (the measured side only: for a strategy whose
outage the simulator does not model).

    python benchmarks/bench_nodeloss.py [--strategy baseline] [--rounds 14] [--round 3] [--gone 6] [--time-scale 3]
        [--restart-s S] [--no-prediction] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def cold_start_s() -> float:
    """Seconds for a fresh process to import the executor (torch, transformers): most of a restart."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import real.process.worker"], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="baseline")
    parser.add_argument("--no-prediction", action="store_true", help="geodt run: the measured side only")
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--round", type=int, default=3, help="the round the node is lost at")
    parser.add_argument("--gone", type=int, default=6, help="rounds it stays away")
    parser.add_argument("--node", default="medium")
    parser.add_argument("--time-scale", type=float, default=3.0)
    # What a restarted node takes before it can rejoin, priced by the simulator as [simulation]
    # restart_s (in the scenario's seconds: real seconds / --time-scale under --emulate). Best given
    # from an earlier run's "time to rejoin" line (process start and model build: 2.9-3.5 s here,
    # 12.5 s under load 10); else a fresh process's import of the executor, timed just before the
    # run: a lower bound (1.5-1.7 s here), which misses the spawn and the model build.
    parser.add_argument("--restart-s", type=float, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-nodeloss-"))
    restart_s = cold_start_s() if args.restart_s is None else args.restart_s
    command = "run" if args.no_prediction else "validate"
    cmd = [sys.executable, "-m", "geodt", command, "hetero-cpu", "--strategy", args.strategy, "--out", str(out),
           "--no-progress", "--emulate", "--time-scale", str(args.time_scale), "--on-node-loss", "continue",
           "--set", f"training.rounds={args.rounds}", "--set", "training.local_steps=3",
           "--set", f"nodes.{args.node}.outage={{round={args.round}, rounds={args.gone}}}",
           "--set", 'simulation.on_node_loss="continue"', "--set", f"simulation.restart_s={restart_s / args.time_scale}"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        return run.returncode
    trace, plan = pd.read_csv(out / "trace.csv"), pd.read_csv(out / "plan.csv").set_index("node")
    predicted_back = None if args.no_prediction else predicted_rejoin(out, args.node, args.round)
    print(f"hetero-cpu/{args.strategy}, {args.rounds} rounds, emulated x{args.time_scale:g}: node {args.node} lost at "
          f"round {args.round} for {args.gone} rounds, its restart priced at {restart_s:.2f} s"
          + ("" if predicted_back is None else f": predicted back at round {predicted_back}"))
    survivors(trace, plan, args.node, args.round, args.rounds)
    lost = trace[trace.node == args.node]["round"].tolist()
    back = [r for r in lost if r > args.round]
    print(f"  lost node {args.node}: rounds {sorted(set(range(args.rounds)) - set(lost))} missed; rejoined at round "
          f"{back[0] if back else 'never'}" + ("" if predicted_back is None else f" (predicted {predicted_back})"))
    said = re.search(r"rejoined at round \d+, ([\d.]+) s after the launcher restarted it \(([\d.]+) s to start its "
                     r"process and build the model, ([\d.]+) s", run.stderr)
    if said:
        print(f"  time to rejoin: {said.group(1)} s from the restart ({said.group(2)} s process start and model build, "
              f"{said.group(3)} s waiting for the others' next round boundary)")
    if not args.no_prediction:
        columns = ["node", "predicted_tokens", "measured_tokens", "predicted_compute_s", "measured_compute_s",
                   "predicted_idle_s", "measured_idle_s", "error_pct_of_round"]
        table = pd.read_csv(out / "validation.csv")
        print(table[columns].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"(outputs in {out})")
    return 0


def predicted_rejoin(out: Path, node: str, lost_at: int):
    """The first round after the loss in which validate's timeline gives the node tokens ("never")."""
    predicted = pd.read_csv(out / "timeline.csv")
    predicted = predicted[(predicted.node == node) & (predicted["round"] > lost_at) & (predicted.tokens > 0)]["round"]
    return int(predicted.min()) if len(predicted) else "never"


def survivors(trace: pd.DataFrame, plan: pd.DataFrame, lost: str, f: int, rounds: int) -> None:
    """Per survivor: its rounds without a row (the inner steps it lost, at its plan's H_i) and the
    recovery's idle beyond its usual; then the members' samples per round against the plan's K."""
    for node, rows in trace.groupby("node", sort=False):
        if node == lost:
            continue
        rows = rows.set_index("round")
        missing = sorted(set(range(rounds)) - set(rows.index))
        normal = rows.loc[:f - 1, "idle_s"].median()
        round_s = (rows.loc[:f - 1, "round_end_s"] - rows.loc[:f - 1, "round_start_s"]).median()
        extra = rows.loc[f, "idle_s"] - normal
        print(f"  survivor {node:8s}: rounds without a row {missing or 'none'} (inner steps lost: "
              f"{len(missing) * int(plan.loc[node, 'local_steps'])}); recovery {extra:.3f} s beyond its usual idle "
              f"= {extra / round_s:.2f} of a round ({round_s:.2f} s)")
    k = int((plan["local_steps"] * plan["batch_size"]).sum())
    samples = (trace["local_steps"] * trace.node.map(plan["batch_size"])).groupby(trace["round"]).sum()
    away = trace.groupby("round")["members"].first().map(lambda m: lost not in m.split("+"))
    print(f"  members' samples per round (K = {k}): all members {samples[~away].tolist()}; "
          f"without {lost} {samples[away].tolist()} (the first: the round in flight at the loss, planned with it)")

if __name__ == "__main__":
    raise SystemExit(main())
