"""`geodt validate --trace RUN_DIR`: compare a run that already happened with the plan's prediction.

RUN_DIR is the output directory of a real run: `geodt run --out RUN_DIR`, or rank 0's `--out`
of `python -m real` under torchrun, on one machine or across machines (rank 0 gathers every
node's rows into its trace.csv and copies plan.csv and scenario.toml beside it). The plan in
RUN_DIR/plan.csv (the one that ran) is simulated on RUN_DIR/scenario.toml and compared with
RUN_DIR/trace.csv: the same validation.csv, validation.png, timeline.csv and trace.json as
`geodt validate`, written into --out (default RUN_DIR/validation: the run's own
files are left as they are). Nothing runs; nothing of the machine this runs on is measured.

Also the shared tail of `geodt validate` (`report`): the table written, plotted and printed.
"""
from __future__ import annotations

import sys
from pathlib import Path

from formats.timeline import TRACE_COLUMNS, VALIDATION_COLUMNS

# Printed by default (the CSV holds every column; --wide prints them all): ≤ 120 characters.
SHOWN = {"node": "node", "predicted_idle_s": "idle_pred_s", "measured_idle_s": "idle_meas_s",
         "error_pct_of_round": "idle_err_%round", "predicted_comm_s": "sync_pred_s", "measured_comm_s": "sync_meas_s",
         "comm_error_pct": "sync_err_%", "predicted_round_s": "round_pred_s", "measured_round_s": "round_meas_s"}
TABLE_WIDTH = 120


def validation_text(table, wide: bool = False) -> str:
    """validate's table: the idle, sync and round columns under short names (≤ TABLE_WIDTH wide),
    or with --wide every column of validation.csv plus overrun_steps."""
    if wide:
        shown = table[VALIDATION_COLUMNS + ["overrun_steps"]]
    else:
        shown = table[list(SHOWN)].rename(columns=SHOWN)
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3f}", line_width=None if wide else TABLE_WIDTH)


def report(prog: str, scenario, plan, timeline, trace, out: Path, emulated: bool, time_scale: float,
           network: str, caveat: str, wide: bool = False) -> None:
    """Write validation.csv, trace.json and validation.png into out; print the table and the verdict."""
    from geodt.run_cmd import device_kind, plot_validation, validation_table
    from simulator.outputs import write_csv
    from simulator.perfetto import validation_trace, write_trace_json

    scale = time_scale if emulated else 1.0
    table = validation_table(timeline, trace, scale, emulated=emulated, network=network)
    write_csv(table[VALIDATION_COLUMNS], out / "validation.csv")
    write_trace_json(validation_trace(timeline, trace, scale, plan.to_frame(scenario)), out / "trace.json")
    mode = (f"schedule check (emulated, time scale {time_scale:g})" if emulated
            else "measured, not emulated") + f"; {network}"
    plot_validation(table, out / "validation.png",
                    f"{scenario.name}: strategy {plan.strategy}, {len(set(trace['round']))} rounds ({mode})",
                    device_kind(scenario))
    print(validation_text(table, wide))
    losses = trace.groupby("round")["loss"].mean()
    print("mean loss by round: " + ", ".join(f"{v:.3f}" for v in losses))
    worst = table["error_pct_of_round"].abs().max()
    label = "schedule check (emulated): " if emulated else "measured: "
    sync_errors = table["comm_error_pct"].dropna()
    sync = f", sync error {sync_errors.min():+.1f}% to {sync_errors.max():+.1f}%" if len(sync_errors) else ""
    print(f"{label}largest idle error: {worst:.2f}% of round time{sync}{caveat}; network: {network}")
    print(f"wrote {out}/: validation.csv, validation.png, trace.json, timeline.csv")
    overruns = int(table["overrun_steps"].sum())
    if emulated and overruns:
        print(f"warning: {overruns} inner steps took longer in real compute than their emulated step time; "
              f"measured compute exceeds the prediction there (raise step_time_s or lower the load)",
              file=sys.stderr)


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
        raise InputError(f"{run_dir / 'trace.csv'}: expected a trace with rows and columns {', '.join(TRACE_COLUMNS[:6])}, "
                         f"loss, overrun_steps" + (f"; missing {', '.join(missing)}" if missing else "; it is empty"))
    unknown = sorted(set(trace["node"]) - {n.node for n in plan.nodes})
    if unknown or set(trace["strategy"]) != {plan.strategy}:
        raise InputError(f"{run_dir / 'trace.csv'}: its nodes or strategy are not plan.csv's (nodes "
                         f"{', '.join(map(str, unknown)) or 'as planned'}, strategy {', '.join(map(str, set(trace['strategy'])))}); "
                         "expected the trace of this plan")
    rounds = plan.rounds or scenario.training.rounds
    if trace["round"].max() >= rounds:
        raise InputError(f"{run_dir / 'trace.csv'}: round {trace['round'].max()} beyond the plan's {rounds} rounds")
    return scenario, plan, trace


def trace_main(argv: list[str]) -> int:
    """Validate an existing run's trace; 0, or 2 with one line for bad input."""
    from formats.errors import InputError
    from geodt.run_cmd import predicted_timeline
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
