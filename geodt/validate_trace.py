"""`geodt validate --trace RUN_DIR`: compare a run that already happened with the plan's prediction.

RUN_DIR is the output directory of a real run: `geodt run --out RUN_DIR`, or rank 0's `--out`
of `python -m real` under torchrun, on one machine or across machines (rank 0 gathers every
node's rows into its trace.csv and copies plan.csv and scenario.toml beside it). The plan in
RUN_DIR/plan.csv (the one that ran) is simulated on RUN_DIR/scenario.toml and compared with
RUN_DIR/trace.csv: the same validation.csv, validation.png, timeline.csv and trace.json as
`geodt validate`, written into --out (default RUN_DIR/validation: the run's own
files are left as they are). Nothing runs; nothing of the machine this runs on is measured.
"""
from __future__ import annotations

import sys
from pathlib import Path

from formats.timeline import TRACE_COLUMNS


def wants_trace(argv: list[str]) -> bool:
    return any(a == "--trace" or a.startswith("--trace=") for a in argv)


def _parser():
    from formats.cli import OneLineParser

    parser = OneLineParser(prog="geodt validate --trace", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, metavar="RUN_DIR",
                        help="a real run's directory: trace.csv, plan.csv and scenario.toml")
    parser.add_argument("--out", help="where validation.csv and the rest go (default RUN_DIR/validation)")
    parser.add_argument("--engine", choices=("analytic", "simpy"), default="analytic",
                        help="simulator engine for the prediction")
    parser.add_argument("--emulate", action="store_true", help="the run was emulated (--emulate): a schedule check")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                        help="the emulated run's --time-scale (its times are divided by X)")
    parser.add_argument("--wide", action="store_true", help="print every column of validation.csv")
    return parser


def load_run(run_dir: Path):
    """(scenario, plan, trace) of a finished run; InputError (one line) when a file is missing or wrong."""
    import pandas as pd

    from formats.errors import InputError
    from formats.plan import PlanError, load_plan
    from simulator.scenario import load_scenario

    for name in ("trace.csv", "plan.csv", "scenario.toml"):
        if not (run_dir / name).is_file():
            raise InputError(f"--trace {run_dir}: {name} not found; expected a real run's --out (geodt run, or "
                             "rank 0's --out under torchrun)")
    scenario = load_scenario(str(run_dir / "scenario.toml"))
    try:
        plan = load_plan(run_dir / "plan.csv", seq_len=scenario.model.seq_len)
    except PlanError as exc:
        raise InputError(f"{run_dir / 'plan.csv'}: {exc}") from None
    try:
        trace = pd.read_csv(run_dir / "trace.csv")
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
    rounds = plan.rounds or scenario.training.rounds
    if trace["round"].max() >= rounds:
        raise InputError(f"{run_dir / 'trace.csv'}: round {trace['round'].max()} beyond the plan's {rounds} rounds")
    return scenario, plan, trace


def trace_main(argv: list[str]) -> int:
    """Validate an existing run's trace; 0, or 2 with one line for bad input."""
    from formats.errors import InputError
    from geodt.validation import predicted_timeline, report
    from simulator.cli import check_work
    from simulator.outputs import write_csv

    args = _parser().parse_args(argv)
    run_dir = Path(args.trace)
    out = Path(args.out) if args.out else run_dir / "validation"
    try:
        if not run_dir.is_dir():
            raise InputError(f"--trace {run_dir}: not a directory; expected a real run's --out")
        if not args.time_scale > 0 or args.time_scale == float("inf"):
            raise InputError(f"--time-scale: expected a finite positive number, got {args.time_scale}")
        scenario, plan, trace = load_run(run_dir)
        check_work(scenario, str(run_dir / "scenario.toml"), [plan.strategy], large=False)
    except InputError as exc:
        print(f"geodt validate: {exc}", file=sys.stderr)
        return 2
    from real.wan import network_note

    # wan.csv names a shaped run's network; without it the run was on loopback (one machine) or
    # on whatever network joined the machines, which the trace does not record.
    network = network_note(run_dir) if (run_dir / "wan.csv").exists() else "as recorded (not known to the trace)"
    timeline = predicted_timeline(scenario, plan, args.engine)
    write_csv(timeline, out / "timeline.csv")
    report("geodt validate", scenario, plan, timeline, trace, out, args.emulate, args.time_scale, network,
           caveat="", wide=args.wide)
    return 0
