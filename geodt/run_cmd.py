"""`geodt run` and `geodt validate`: a strategy's plan, executed for real, compared with the simulator.

`geodt run SCENARIO --strategy S --out DIR` makes the plan with the simulator, writes
DIR/plan.csv (every value resolved: rounds, collective, payload dtype, links, CPU limits)
and DIR/scenario.toml and launches the real executor (`real/`) on exactly that plan, which
writes DIR/trace.csv and prints a per-node summary. `geodt validate` also simulates the same
plan (DIR/timeline.csv), runs it for real, and writes DIR/validation.csv and
DIR/validation.png: per node, predicted and measured idle, sync and round time, summed over
rounds, the idle error as a percentage of the round time and the sync error as a percentage
of the predicted sync (both signed). `--emulate` pads every step
and sync to the plan's times instead: that checks the schedule (the executor reproduces
the predicted timeline), not the prediction, and the outputs say so (mode = emulated).

It composes the simulator (the plan and the prediction) with the executor, as
geodt/calibration/wan_links.py does for link calibration.
"""
from __future__ import annotations

import argparse
import errno
import sys

from formats.cli import OneLineParser, add_key_option, add_strategy_list, group_options
from formats.limits import large_help
from formats.owners import add_force_argument
from geodt.validate_trace import trace_main, wants_trace
from geodt.validation import (  # noqa: F401
    MODES,
    VARIABILITY_SAMPLES,
    device_kind,
    plot_validation,
    predicted_timeline,
    report,
    validation_table,
    wall_line,
)
from real.process.cli import add_exec_arguments
from simulator.strategies.registry import BARRIERLESS, STRATEGIES, help_lines


def _parser(prog: str, validate: bool) -> argparse.ArgumentParser:
    description = ("Simulate a strategy's plan, run it for real on this machine, and compare: validation.csv, "
                   "validation.png (or, with --trace RUN_DIR, compare a finished run)." if validate else
                   "Run a strategy's plan for real: DiLoCo training on torch.distributed, one process per device "
                   "of every node; writes plan.csv, scenario.toml, trace.csv and trace.json (geodt validate "
                   "compares with the prediction).")
    parser = OneLineParser(prog=prog, description=description)
    parser.add_argument("scenario", help="a scenario TOML file or a built-in name (paper, hetero-cpu)")
    parser.add_argument("--strategy", default="baseline",
                        help=f"one of {', '.join(STRATEGIES)}, or without a barrier {', '.join(BARRIERLESS)} "
                             "(default baseline: DiLoCo as the scenario's [diloco] says, Streaming DiLoCo when "
                             "it has fragments)")
    parser.add_argument("--out", help="output directory (default: out/<scenario name>/run-<S> or validate-<S>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. training.rounds=3 (repeatable)")
    add_exec_arguments(parser)
    add_force_argument(parser)
    parser.add_argument("--large", action="store_true", help=large_help())
    if validate:
        parser.add_argument("--no-emulate", action="store_true",
                            help="run for real (the default; kept for older command lines)")
        parser.add_argument("--engine", choices=("auto", "analytic", "simpy"), default="auto",
                            help="simulator engine for the prediction (auto: analytic where it is exact, "
                                 "the event simulation for quorum rounds)")
        parser.add_argument("--wide", action="store_true", help="print every column of validation.csv")
        add_key_option(parser, "target_loss", "the loss to reach: the time to it predicted and measured (needs "
                       "--data with the convergence profile's corpus, e.g. python-stdlib)")
        parser.add_argument("--trace", metavar="RUN_DIR",
                            help="instead of running: compare RUN_DIR/trace.csv of a finished run (geodt run, or "
                                 "rank 0's --out under torchrun, across machines) with its plan's prediction "
                                 "(geodt validate --trace RUN_DIR [--out DIR] [--engine E] [--wide]); no SCENARIO or "
                                 "--strategy then; measured or emulated, and at what time scale, as RUN_DIR/trace.csv "
                                 "records (--emulate --time-scale X only for a trace that does not)")
    group_options(parser, RUN_GROUPS | (VALIDATE_GROUPS if validate else {}))
    add_strategy_list(parser, help_lines())
    return parser


# `geodt run --help` and `geodt validate --help` by purpose (formats/cli.py group_options); tests/test_help.py
# checks that no option is left out of a group
RUN_GROUPS = {
    "what to train": ["--strategy", "--set", "--data", "--replicate-data"],
    "where outputs go": ["--out", "--force", "--large", "--no-progress"],
    "measured or emulated": ["--emulate", "--time-scale"],
    "checkpoints and resuming": ["--resume", "--stop-after", "--checkpoint-every", "--checkpoint-final"],
    "a node that fails": ["--timeout-s", "--on-node-loss", "--rejoin-after-s"],
    "processes and network": ["--backend", "--threads", "--wan", "--host", "--allow-any-host"],
}
VALIDATE_GROUPS = {
    "the prediction": ["--engine", "--target-loss", "--wide", "--no-emulate"],
    "a finished run instead": ["--trace"],
}


def interruptible(main):
    """Ctrl-C: one line and exit 130 (outputs are written whole or not at all); an output that
    cannot be written (a full disk): one line naming it, exit 1."""

    def wrapped(argv: list[str]) -> int:
        try:
            return main(argv)
        except KeyboardInterrupt:
            print("geodt: interrupted", file=sys.stderr)
            return 130
        except OSError as exc:
            reason = "no space left on device" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror
            print(f"geodt: {exc.filename or 'an output'}: {reason or exc}; nothing half-written is left (the "
                  f"outputs written before it and the checkpoints are intact)", file=sys.stderr)
            return 1

    wrapped.__doc__ = main.__doc__
    return wrapped


@interruptible
def run_main(argv: list[str]) -> int:
    args = _parser("geodt run", validate=False).parse_args(argv)
    # deferred: the executor's modules and torch (geodt/run_exec.py); --help reads without them
    from geodt import run_exec  # noqa: PLC0415

    prepared = run_exec.prepare("geodt run", args)
    if isinstance(prepared, int):
        return prepared
    try:
        return run_exec.run(args, prepared)
    finally:
        prepared[4].release()


@interruptible
def validate_main(argv: list[str]) -> int:
    if wants_trace(argv):  # an existing run's trace: nothing runs
        return trace_main(argv)
    args = _parser("geodt validate", validate=True).parse_args(argv)
    if args.emulate and args.no_emulate:
        print("geodt validate: --emulate and --no-emulate: expected one of them", file=sys.stderr)
        return 2
    # deferred: the executor's modules and torch (geodt/run_exec.py); --help reads without them
    from geodt import run_exec  # noqa: PLC0415

    prepared = run_exec.prepare("geodt validate", args)
    if isinstance(prepared, int):
        return prepared
    try:
        return run_exec.validate(args, *prepared[:4], loss=prepared[5])
    finally:
        prepared[4].release()
