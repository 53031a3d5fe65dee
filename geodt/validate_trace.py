"""`geodt validate --trace RUN_DIR`: compare a run that already happened with the plan's prediction.

RUN_DIR is the output directory of a real run: `geodt run --out RUN_DIR`, or rank 0's `--out`
of `python -m real` under torchrun, on one machine or across machines (rank 0 gathers every
node's rows into its trace.csv and copies plan.csv and scenario.toml beside it), or the folder of
`geodt plan --export torchft DIR` after its torchft run (no trace.csv: each replica's recorder
wrote DIR/traces/<node>.csv, read together as one). The plan in
RUN_DIR/plan.csv (the one that ran) is simulated on RUN_DIR/scenario.toml and compared with
RUN_DIR/trace.csv: the same validation.csv, validation.png, timeline.csv and trace.json as
`geodt validate`, written into --out (default RUN_DIR/validation: the run's own
files are left as they are). Nothing runs; nothing of the machine this runs on is measured.
RUN_DIR may come from elsewhere: it is data, never directions. No output goes through a
symbolic link found in it (check_out), --out takes the owner rule of every command
(formats/owners.py, --force), and rows that would give a silent wrong answer (a (node, round)
twice, a time that is NaN or negative) are refused in one line (check_rows).

How the run was made comes from trace.csv's run columns (`mode`, `time_scale`; real/rounds/trace.py):
an emulated run's validation says "emulated" everywhere (table, verdict, trace.json's tracks,
validation.png) and its times are divided by its own time scale, whatever --emulate and
--time-scale say; a flag that contradicts the record is named on stderr in one line. A trace
written before those columns existed has no record: the flags decide, as they did.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from formats.cli import OneLineParser
from formats.errors import InputError
from formats.files import short
from formats.owners import add_force_argument, check_owner
from formats.plan import PlanError, load_plan
from formats.timeline import MODES, RUN_COLUMNS, TRACE_COLUMNS
from geodt.validation import predicted_timeline, report
from real.wan.wan import network_note
from simulator.cli import check_work
from simulator.outputs.outputs import write_csv
from simulator.scenario import load_scenario


def wants_trace(argv: list[str]) -> bool:
    return any(a == "--trace" or a.startswith("--trace=") for a in argv)


def _parser():
    parser = OneLineParser(prog="geodt validate --trace", description=__doc__.splitlines()[0])
    run = parser.add_argument_group("the run and its prediction")
    run.add_argument("--trace", required=True, metavar="RUN_DIR",
                     help="a real run's directory: trace.csv, plan.csv and scenario.toml")
    run.add_argument("--engine", choices=("analytic", "simpy"), default="analytic",
                     help="simulator engine for the prediction")
    old = parser.add_argument_group("for a trace that does not record how it ran (older runs)")
    old.add_argument("--emulate", action="store_true",
                     help="the run was emulated (--emulate): a schedule check; only for a trace that does not "
                          "record it (trace.csv's mode column, written by runs since it exists)")
    old.add_argument("--time-scale", type=float, default=None, metavar="X",
                     help="the emulated run's --time-scale (its times are divided by X); only for a trace that "
                          "does not record it (trace.csv's time_scale column)")
    outputs = parser.add_argument_group("where outputs go")
    outputs.add_argument("--out", help="where validation.csv and the rest go (default RUN_DIR/validation)")
    outputs.add_argument("--wide", action="store_true", help="print every column of validation.csv")
    add_force_argument(outputs)
    return parser


def load_run(run_dir: Path):
    """(scenario, plan, trace) of a finished run; InputError (one line) when a file is missing or wrong."""
    for name in ("trace.csv", "plan.csv", "scenario.toml"):
        if name == "trace.csv" and not (run_dir / name).exists() and per_replica_traces(run_dir):
            continue
        if not (run_dir / name).is_file():
            raise InputError(f"--trace {run_dir}: {name} not found; expected a real run's --out (geodt run, or "
                             "rank 0's --out under torchrun)")
    scenario = load_scenario(str(run_dir / "scenario.toml"))
    try:
        plan = load_plan(run_dir / "plan.csv", seq_len=scenario.model.seq_len)
    except PlanError as exc:
        raise InputError(f"{run_dir / 'plan.csv'}: {exc}") from None
    parts = [run_dir / "trace.csv"] if (run_dir / "trace.csv").exists() else per_replica_traces(run_dir)
    try:
        trace = pd.concat([pd.read_csv(p) for p in parts], ignore_index=True)
    except (ValueError, OSError) as exc:
        raise InputError(f"{run_dir / 'trace.csv'}: not a readable CSV ({exc})") from None
    missing = [c for c in TRACE_COLUMNS[:6] + ["loss", "overrun_steps"] if c not in trace.columns]
    if missing or trace.empty:
        raise InputError(f"{run_dir / 'trace.csv'}: expected a trace with rows and columns "
                         f"{', '.join(TRACE_COLUMNS[:6])}, "
                         f"loss, overrun_steps" + (f"; missing {', '.join(missing)}" if missing else "; it is empty"))
    unknown = sorted(set(trace["node"]) - {n.node for n in plan.nodes})
    if unknown or set(trace["strategy"]) != {plan.strategy}:
        raise InputError(f"{run_dir / 'trace.csv'}: its nodes or strategy are not plan.csv's (nodes "
                         f"{', '.join(map(str, unknown)) or 'as planned'}, "
                         f"strategy {', '.join(map(str, set(trace['strategy'])))}); "
                         "expected the trace of this plan")
    check_rows(trace, run_dir / "trace.csv")
    rounds = plan.settings_from(scenario).rounds
    if trace["round"].max() >= rounds:
        raise InputError(f"{run_dir / 'trace.csv'}: round {trace['round'].max()} beyond the plan's {rounds} rounds")
    return scenario, plan, trace


def per_replica_traces(run_dir: Path) -> list[Path]:
    """RUN_DIR/traces/*.csv: one per replica, written by train/torchft_recorder.py (a torchft run of a plan
    exported with geodt plan --export torchft), read as one trace.csv where RUN_DIR has none."""
    folder = run_dir / "traces"
    return sorted(p for p in folder.glob("*.csv") if p.is_file()) if folder.is_dir() else []


TIME_COLUMNS = ("compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s")


def check_rows(trace, trace_path: Path) -> None:
    """InputError (one line) for rows that would give a silent wrong answer: a time that is not a
    finite number >= 0 (NaN ended in a traceback), a round that is not a whole number >= 0, and a
    (node, round) given twice (a trace with every row twice reported idle and rounds doubled)."""
    for column in ("round", *TIME_COLUMNS):
        values = pd.to_numeric(trace[column], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(values) & (values >= 0)) | ((values != np.round(values)) if column == "round" else False)
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            what = "a whole number >= 0" if column == "round" else "a finite number of seconds >= 0"
            raise InputError(f"{trace_path}: line {at + 2}: {column} = {short(str(trace[column].iloc[at]))}; "
                             f"expected {what}")
        trace[column] = values
    twice = trace.duplicated(["node", "round"], keep="first").to_numpy()
    if twice.any():
        at = int(np.flatnonzero(twice)[0])
        node, round_ = trace["node"].iloc[at], int(trace["round"].iloc[at])
        raise InputError(f"{trace_path}: line {at + 2}: node {short(str(node))} round {round_} is given "
                         f"{int(((trace['node'] == node) & (trace['round'] == round_)).sum())} times; expected one "
                         "row per node and round (a trace concatenated twice?)")


def check_out(run_dir: Path, out: Path) -> None:
    """InputError when an output would go through a symbolic link inside RUN_DIR: a run folder
    from another machine is data, never directions (a planted `validation` link replaced a
    user's validation.csv elsewhere). --out outside RUN_DIR is the user's own choice."""
    try:
        parts = out.relative_to(run_dir).parts
    except ValueError:
        return
    path = run_dir
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise InputError(f"--trace {run_dir}: {path.relative_to(run_dir)} is a symbolic link (to "
                             f"{short(os.readlink(path))}); geodt never writes through a link found in a run "
                             "folder; remove it, or give --out outside the run folder")
        if path.exists() and not path.is_dir():
            raise InputError(f"--trace {run_dir}: {path.relative_to(run_dir)} is not a directory; expected a "
                             "folder for the validation's outputs, or give --out")


def recorded_mode(trace, trace_path: Path) -> tuple[bool, float] | None:
    """(emulated, time scale) as trace.csv records them (RUN_COLUMNS), or None for a trace written
    before it recorded them; InputError (one line) when the record is not one mode and one scale."""
    if not set(RUN_COLUMNS) <= set(trace.columns):
        return None
    modes = set(trace["mode"].astype(str))
    if len(modes) != 1 or not modes <= set(MODES.values()):
        raise InputError(f"{trace_path}: mode: expected one of {', '.join(MODES.values())} on every row, got "
                         f"{', '.join(sorted(modes))}")
    scales = set(pd.to_numeric(trace["time_scale"], errors="coerce").astype(float))
    scale = scales.pop() if len(scales) == 1 else float("nan")
    if not (np.isfinite(scale) and scale > 0):
        raise InputError(f"{trace_path}: time_scale: expected one finite positive number on every row, got "
                         f"{', '.join(sorted(set(trace['time_scale'].astype(str))))}")
    return modes == {MODES[True]}, scale


def run_mode(args, record: tuple[bool, float] | None, trace_path: Path) -> tuple[bool, float]:
    """(emulated, time scale) to validate with: the trace's record where it has one (a flag that
    contradicts it is said in one line on stderr), else --emulate and --time-scale."""
    if record is None:
        return args.emulate, 1.0 if args.time_scale is None else args.time_scale
    emulated, scale = record
    said = []
    if args.emulate and not emulated:
        said.append("--emulate")
    if args.time_scale is not None and args.time_scale != (scale if emulated else 1.0):
        said.append(f"--time-scale {args.time_scale:g}")
    if said:
        how = f"emulated at time scale {scale:g}" if emulated else "measured (not emulated)"
        print(f"geodt validate: {' and '.join(said)}: {trace_path} records the run as {how}; validating it as "
              "recorded", file=sys.stderr)
    return emulated, scale


def trace_main(argv: list[str]) -> int:
    """Validate an existing run's trace; 0, or 2 with one line for bad input."""
    args = _parser().parse_args(argv)
    run_dir = Path(args.trace)
    out = Path(args.out) if args.out else run_dir / "validation"
    try:
        if not run_dir.is_dir():
            raise InputError(f"--trace {run_dir}: not a directory; expected a real run's --out")
        if args.time_scale is not None and not (0 < args.time_scale < float("inf")):
            raise InputError(f"--time-scale: expected a finite positive number, got {args.time_scale}")
        check_out(run_dir, out)
        why = check_owner(out, "validate", args.force)
        if why is not None:
            raise InputError(why)
        scenario, plan, trace = load_run(run_dir)
        record = recorded_mode(trace, run_dir / "trace.csv")
        check_work(scenario, str(run_dir / "scenario.toml"), [plan.strategy], large=False)
    except InputError as exc:
        print(f"geodt validate: {exc}", file=sys.stderr)
        return 2

    # wan.csv names a shaped run's network; without it the run was on loopback (one machine) or
    # on whatever network joined the machines, which the trace does not record.
    network = network_note(run_dir) if (run_dir / "wan.csv").exists() else "as recorded (not known to the trace)"
    emulated, time_scale = run_mode(args, record, run_dir / "trace.csv")
    timeline = predicted_timeline(scenario, plan, args.engine)
    write_csv(timeline, out / "timeline.csv")
    report("geodt validate", scenario, plan, timeline, trace, out, emulated, time_scale, network,
           caveat="", wide=args.wide)
    return 0
