"""`geodt calibrate convergence SCENARIO`: short real runs of the strategies -> a convergence profile.

Each run is `geodt run SCENARIO --strategy S --emulate` (real training on this machine's CPU,
every process of every node, the plan's batches and local steps, each step padded to the plan's
step time scaled by --time-scale, so adaptive plans decide as they would) on real text
(`--data python-stdlib`: the standard library's sources as bytes), with the same seed. Each run
varies one thing the loss model must weigh (formats/convergence.py and
simulator/models/convergence.py): unequal local steps, unequal batches, deadline rounds averaged
plainly or by tokens, stale fragments (Streaming DiLoCo's τ), a 16-bit payload, a node that
leaves and rejoins, one node fewer (the replicas M), no barrier at all (async: a parameter server
merges each node's pseudo-gradient on arrival; its rows carry the trace's per node-round staleness,
which the loss model's update_staleness weighs). Every finished run's rows are added to the
profile at once (written whole, temp name then rename), so an interrupted calibration keeps them
and a rerun does only the rest. Each run ends with this process (killed too: train/children.py),
and its folder lies beside the profile under geodt's temporary name, removed by the next
calibration into that profile when this one was killed (formats/owners.py).
"""
from __future__ import annotations

import argparse
import errno
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import tomli_w
from tqdm import tqdm

from formats.cli import OneLineParser, positive_float
from formats.convergence import COLUMNS, ConvergenceProfileError, read_convergence_profile
from formats.errors import InputError, write_error
from formats.owners import TEMP_SUFFIX, add_force_argument, check_file_owner, remove_orphan_temps, temp_prefix
from real.core.data import DataError, corpus_digest, load_tokens
from simulator.outputs.outputs import write_csv
from simulator.scenario import load_scenario
from simulator.strategies import make_plan
from simulator.strategies.registry import BARRIERLESS
from train.children import die_with_parent

# name -> (strategy, scenario overrides, executor flags); "{node}" is the scenario's second-slowest node
RUNS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "baseline": ("baseline", (), ()),
    "unequal-steps": ("measured-steps", (), ()),
    "unequal-batch": ("measured-batch", (), ()),
    "deadline": ("deadline", (), ()),
    "deadline-tokens": ("deadline", ("diloco.averaging=tokens",), ()),
    "stale-fragments": ("baseline", ("diloco.fragments=2", "diloco.sync_delay_steps=2"), ()),
    "fp16-payload": ("baseline", ("network.payload_dtype=fp16",), ()),
    "node-lost": ("baseline", ("simulation.on_node_loss=continue", "nodes.{node}.outage.round={lost_round}",
                               "nodes.{node}.outage.rounds={lost_rounds}"), ("--on-node-loss", "continue")),
    "fewer-nodes": ("baseline", (), ()),  # the scenario without its fastest node: DiLoCo's replicas M
    "async": ("async", (), ()),  # no barrier: pseudo-gradients merged stale (update_staleness)
}
FEWER_NODES = "fewer-nodes"
PROGRESS_S = 10.0  # a progress line this often where stderr is not a terminal


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="geodt calibrate convergence", description=__doc__.splitlines()[0])
    p.add_argument("scenario", help="a scenario TOML file or a built-in name (hetero-cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key for every run, e.g. training.rounds=30")
    p.add_argument("--runs", default=",".join(RUNS), help=f"runs to make, of {', '.join(RUNS)} [all]")
    p.add_argument("--data", default="python-stdlib",
                   help="the corpus: python-stdlib (the standard library's sources as bytes) or a file [python-stdlib]")
    p.add_argument("--time-scale", type=positive_float, default=1.0, metavar="X",
                   help="each emulated step takes X times the plan's step time [1]; below the machine's own "
                        "step time every node steps alike and the plans' unequal work is lost")
    p.add_argument("--out", type=Path, default=None,
                   help="the profile CSV (default: out/<scenario>/convergence.csv); rows of finished runs are kept")
    add_force_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        scenario, runs = _check(args)
    except InputError as exc:
        print(f"geodt calibrate convergence: {exc}", file=sys.stderr)
        return 2
    out = args.out
    done = _done_runs(out)
    todo = [r for r in runs if r not in done]
    if done:
        print(f"geodt calibrate convergence: {out} holds {', '.join(sorted(done))}; measuring "
              f"{', '.join(todo) or 'nothing more'}")

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphan_temps(out.parent, only=out.name)  # the runs' folders of a calibration that was killed
    # a terminal gets tqdm's bar; a log (stderr not a terminal: CI, nohup) a line every PROGRESS_S instead
    # of nothing for the minutes the runs take
    quiet = not sys.stderr.isatty()
    try:  # beside the profile, under geodt's temporary name: a killed calibration's is removed by the next
        with tempfile.TemporaryDirectory(prefix=temp_prefix(out.name), suffix=TEMP_SUFFIX, dir=out.parent) as tmp:
            for k, name in enumerate(tqdm(todo, desc="convergence runs", unit="run", disable=quiet)):
                note = _progress_line(f"run {k + 1}/{len(todo)} ({name})") if quiet else None
                status, log = _run_one(args, scenario, name, Path(tmp) / name, note)
                kept = f"the runs finished before ({', '.join(sorted(done)) or 'none'}) are kept in it"
                if status != 0:
                    if "[Errno 28]" in log:  # the run's folder sits beside the profile: that disk is full
                        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out.parent))
                        print(f"geodt calibrate convergence: {write_error(out, full, kept)}", file=sys.stderr)
                        return 2
                    tail = " | ".join(line for line in log.strip().splitlines()[-3:])
                    print(f"geodt calibrate convergence: run {name} failed (exit {status}): {tail}", file=sys.stderr)
                    return 1
                rows = _rows(scenario, name, Path(tmp) / name, args.data)
                try:
                    _append(out, rows)
                except OSError as exc:  # a full disk under --out: the profile is written whole or not at all
                    print(f"geodt calibrate convergence: {write_error(out, exc, kept)}", file=sys.stderr)
                    return 2
                done = done | {name}
    except KeyboardInterrupt:
        print(f"geodt calibrate convergence: interrupted; the runs finished are in {out}, a rerun measures the rest",
              file=sys.stderr)
        return 130
    print(f"geodt calibrate convergence: wrote {out} ({len(done | set(todo))} runs); the simulator fits its loss "
          "model from it "
          f"(`[training] convergence_profile = \"{out}\"`)")
    return 0


def _check(args):
    """(scenario, run names): the scenario loads, every run is known, the corpus is readable."""
    scenario = load_scenario(args.scenario, args.overrides)
    args.out = args.out or Path("out") / scenario.name / "convergence.csv"
    why = check_file_owner(args.out, "convergence profile", read_convergence_profile, args.force)
    if why is not None:  # a profile that fails its checks is not taken for an empty one
        raise InputError(why)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in runs if r not in RUNS]
    if unknown or not runs:
        raise InputError(f"--runs {args.runs}: unknown run {unknown[0] if unknown else '(none)'!r}; expected some "
                         f"of {', '.join(RUNS)}")
    if "baseline" not in runs and not _done_runs(args.out):
        raise InputError(f"--runs {args.runs}: expected baseline among them (every run is measured against it)")

    try:  # a corpus that cannot be read is one line now, not a failed run later
        load_tokens(args.data, scenario.model.arch.vocab_size if scenario.model.arch else 256)
    except DataError as exc:
        raise InputError(f"--data: {exc}") from None
    for name in ("node-lost", FEWER_NODES):
        if len(scenario.nodes) < 2 and name in runs:
            runs.remove(name)  # one node cannot leave, nor be left out, and leave a run
    return scenario, runs


def _done_runs(out: Path) -> set[str]:
    """The runs `out` holds (its checks were passed in _check, or --force replaces it: none)."""
    if not out.exists():
        return set()
    try:
        return set(read_convergence_profile(out)["run"])
    except ConvergenceProfileError:
        return set()  # only under --force (_check refuses such a file otherwise): it is written over


def _by_speed(scenario) -> list[str]:
    """The scenario's nodes, fastest first, by the baseline plan's step times (given, profiled or estimated)."""
    return [n.node for n in sorted(make_plan(scenario, "baseline").nodes, key=lambda n: n.step_s)]


def _overrides(scenario, name: str) -> list[str]:
    order = _by_speed(scenario)
    node = order[-2] if len(order) > 1 else order[0]
    rounds = scenario.training.rounds
    fill = {"node": node, "lost_round": max(1, rounds // 3), "lost_rounds": max(1, rounds // 6)}
    return [o.format(**fill) for o in RUNS[name][1]]


def _run_one(args, scenario, name: str, run_dir: Path, note=None) -> tuple[int, str]:
    """`geodt run` of one calibration run (argument list, no shell); (exit status, its output);
    note() every PROGRESS_S while it runs, where given."""
    strategy, _, flags = RUNS[name]
    source, overrides = args.scenario, [*args.overrides, *_overrides(scenario, name)]
    if name == FEWER_NODES:
        source, overrides = str(_without_fastest(scenario, run_dir.parent / f"{name}.toml")), []

    # one checkpoint at the end at most (its cost out of the rounds); a run without a barrier none (its
    # cuts are counted in pushes, not rounds: the measured rounds stay free of writes)
    checkpoints = [] if strategy in BARRIERLESS else ["--checkpoint-every", str(scenario.training.rounds)]
    command = [sys.executable, "-m", "geodt", "run", source, "--strategy", strategy, "--emulate",
               "--time-scale", str(args.time_scale), "--no-progress", "--data", args.data, "--out", str(run_dir),
               *checkpoints, *flags]
    for override in overrides:
        command += ["--set", override]
    parent = os.getpid()  # the run (and through it its workers) ends with this process, even on SIGKILL
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=lambda: die_with_parent(parent)) as child:
        while True:
            try:  # communicate again after a timeout loses no output (subprocess's documentation)
                output, _ = child.communicate(timeout=PROGRESS_S)
                return child.returncode, output
            except subprocess.TimeoutExpired:
                if note is not None:
                    note()


def _progress_line(what: str):
    """A callable that prints `what` and the seconds since it was made, one line to stderr."""
    start = time.monotonic()
    return lambda: print(f"geodt calibrate convergence: {what}: {time.monotonic() - start:.0f} s",
                         file=sys.stderr, flush=True)


def _without_fastest(scenario, path: Path) -> Path:
    """The resolved scenario (overrides applied, paths absolute) less its fastest node, as a TOML file."""
    table = scenario.to_table()
    fastest = _by_speed(scenario)[0]
    table["nodes"] = [n for n in table["nodes"] if n["name"] != fastest]
    path.write_text(tomli_w.dumps(table))
    return path


def _rows(scenario, name: str, run_dir: Path, data: str):
    """The run's node-rounds with what the run was (formats/convergence.py's columns)."""
    # deferred: torch for the trace's run only; calibrate convergence --help reads without it
    import torch  # noqa: PLC0415

    trace = pd.read_csv(run_dir / "trace.csv")
    plan = pd.read_csv(run_dir / "plan.csv", keep_default_na=False)
    ran = load_scenario(str(run_dir / "scenario.toml"))
    rows = trace.merge(plan[["node", "gpus"]], on="node")
    run = {"run": name, "strategy": RUNS[name][0], "model": ran.model.preset or "params",
           "params": ran.model.param_count,
           "seq_len": ran.model.seq_len, "corpus": corpus_digest(data), "seed": ran.seed, "nodes": len(plan),
           "rounds": ran.training.rounds, "base_local_steps": ran.training.local_steps,
           "base_batch_size": ran.training.batch_size, "averaging": ran.diloco.averaging,
           "payload_dtype": plan["payload_dtype"].iloc[0], "fragments": int(plan["fragments"].iloc[0]),
           "sync_delay_steps": int(plan["sync_delay_steps"].iloc[0]),
           "fragment_alpha": float(plan["fragment_alpha"].iloc[0]), "inner_lr": ran.diloco.inner_lr,
           "host": platform.node(), "torch_version": torch.__version__,
           "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    for key, value in run.items():
        rows[key] = value
    rows["loss"] = rows["loss"].where(rows["tokens"] > 0, 0.0)  # a node away that round trained on nothing
    if "staleness" not in rows:  # a barrier run's trace has no staleness column: every merge is fresh
        rows["staleness"] = 0
    return rows[list(COLUMNS)]


def _append(out: Path, rows) -> None:
    """The profile with this run's rows added, written whole (temp name, then rename)."""
    frame = rows
    if out.exists():
        kept = read_convergence_profile(out) if _done_runs(out) else None
        if kept is not None:
            frame = pd.concat([kept[kept["run"] != rows["run"].iloc[0]], rows], ignore_index=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(frame, out)
