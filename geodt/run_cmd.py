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

This is the one place that imports both `simulator` and `real`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from formats.timeline import VALIDATION_COLUMNS

MODES = {False: "measured", True: "emulated"}  # mode column: real run | schedule check


def _parser(prog: str, validate: bool) -> argparse.ArgumentParser:
    from formats.cli import OneLineParser
    from real.cli import add_exec_arguments

    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="a scenario TOML file or a built-in name (paper, hetero-cpu)")
    parser.add_argument("--strategy", required=True, help="baseline, A, B, C, ...")
    parser.add_argument("--out", help="output directory (default: out/<scenario name>/run-<S> or validate-<S>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. training.rounds=3 (repeatable)")
    add_exec_arguments(parser)
    if validate:
        parser.add_argument("--no-emulate", action="store_true",
                            help="run for real (the default; kept for older command lines)")
        parser.add_argument("--engine", choices=("analytic", "simpy"), default="analytic",
                            help="simulator engine for the prediction")
    return parser


def _prepare(prog: str, args: argparse.Namespace):
    """Scenario + plan (simulator), checked by the executor, then written into DIR.

    Returns (scenario, plan, exec options) or an exit status. Nothing is written unless
    every input is good.
    """
    from formats.errors import InputError
    from real.cli import exec_options
    from real.config import ConfigError
    from real.launch import LaunchError, check_inputs
    from simulator.outputs import write_csv, write_text
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    from simulator.cli import default_out

    try:
        scenario = load_scenario(args.scenario, args.overrides)
        plan = make_plan(scenario, args.strategy)
        if args.out is None:  # each command its own directory: a run never replaces a validation's trace
            args.out = str(default_out(scenario.name, prog.split()[-1], args.strategy))
        opts = exec_options(args, args.out)
    except (InputError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    frame, toml_text = plan.to_frame(scenario), scenario.to_toml()
    with tempfile.TemporaryDirectory(prefix="geodt-run-") as tmp:
        write_csv(frame, Path(tmp) / "plan.csv")
        write_text(Path(tmp) / "scenario.toml", toml_text)
        try:
            check_inputs(Path(tmp) / "plan.csv", Path(tmp) / "scenario.toml", opts)
        except (ConfigError, LaunchError) as exc:
            print(f"{prog}: the executor cannot run this scenario: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out)
    try:
        write_csv(frame, out / "plan.csv")
        write_text(out / "scenario.toml", toml_text)
    except OSError as exc:
        print(f"{prog}: {out}: cannot write the output directory ({exc})", file=sys.stderr)
        return 2
    return scenario, plan, opts


def announcer(prog: str, scenario, plan, emulate: bool):
    """launch()'s announce: the reproduction warnings, once the inputs are known to be good."""

    def announce() -> None:
        for warning in reproduction_warnings(scenario, plan, emulate):
            print(f"{prog}: warning: {warning}", file=sys.stderr, flush=True)

    return announce


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def reproduction_warnings(scenario, plan, emulate: bool, cores: int | None = None) -> list[str]:
    """What a real (not emulated) run of this plan on this machine cannot reproduce, said up front.

    1. A node whose step time is only given (`step_time_s`) and which carries no real limit
       (`cpu_quota` / `cpu_cores`): this machine runs it at its own speed, like every other such
       node, so its measured times say nothing about the given ones.
    2. More CPU device processes than cores (each process without a quota counting as a core,
       one with `cpu_quota` q as q): devices then share cores, while the prediction assumes each
       device its own.
    Under --emulate steps are padded to the plan's times, so neither applies.
    """
    if emulate:
        return []
    warnings = []
    given = [n.name for n in scenario.nodes
             if n.step_time_s is not None and n.cpu_quota is None and n.cpu_cores is None]
    if given:
        warnings.append(f"node{'s' if len(given) > 1 else ''} {', '.join(given)}: step_time_s is given and no real "
                        "limit (cpu_quota, cpu_cores) is set, so this machine runs "
                        f"{'them' if len(given) > 1 else 'it'} at its own speed and the measured times cannot "
                        "reproduce the given ones; add --emulate to pad each step to step_time_s (a schedule "
                        "check), or give the nodes real limits or profiles")
    cpu_nodes = [node for node in plan.nodes if node.node in {n.name for n in scenario.nodes if set(n.gpus) == {"cpu"}}]
    demand = sum(node.gpus * (node.cpu_quota or 1.0) for node in cpu_nodes)
    processes = sum(node.gpus for node in cpu_nodes)
    cores = available_cores() if cores is None else cores
    if demand > cores + 1e-9:
        warnings.append(f"{processes} CPU device processes need {demand:g} cores and this machine offers {cores}: "
                        "devices share cores, so the prediction (every device its own) cannot hold; use fewer "
                        "devices, or cpu_quota / cpu_cores limits that fit the machine")
    return warnings


def _interruptible(main):
    """Ctrl-C: one line and exit 130 (outputs are written whole or not at all)."""

    def wrapped(argv: list[str]) -> int:
        try:
            return main(argv)
        except KeyboardInterrupt:
            print("geodt: interrupted", file=sys.stderr)
            return 130

    wrapped.__doc__ = main.__doc__
    return wrapped


@_interruptible
def run_main(argv: list[str]) -> int:
    args = _parser("geodt run", validate=False).parse_args(argv)
    prepared = _prepare("geodt run", args)
    if isinstance(prepared, int):
        return prepared
    from dataclasses import replace

    from real.launch import launch

    out = Path(args.out)
    opts = replace(prepared[2], summary=False)  # printed below, with what was measured and what emulated
    status = launch(out / "plan.csv", out / "scenario.toml", opts, host=args.host,
                    announce=announcer("geodt run", prepared[0], prepared[1], args.emulate))
    if status == 0:
        import pandas as pd

        from real.trace import summary
        from simulator.perfetto import trace_csv_to_json

        print(run_heading(args.emulate, args.time_scale))
        print(summary(pd.read_csv(out / "trace.csv")))
        trace_csv_to_json(out / "trace.csv", out / "trace.json")  # opens in ui.perfetto.dev
        from real.wan import network_note

        print(f"geodt run: wrote {out / 'trace.csv'}, {out / 'trace.json'}; network: {network_note(out)}")
    return status


def run_heading(emulated: bool, time_scale: float) -> str:
    """The line above `geodt run`'s per-node summary: measured, or emulated (and then what that means)."""
    if not emulated:
        return "per node, summed over rounds (measured: every time is this machine's own):"
    scale = f", times x{time_scale:g}" if time_scale != 1.0 else ""
    return (f"per node, summed over rounds (emulated{scale}: each inner step padded to the plan's step_s and "
            "each sync to its comm_s, so these times are the plan's, not this machine's):")


VARIABILITY_SAMPLES = 32


def predicted_timeline(scenario, plan, engine: str):
    """The simulator's timeline; with per-step jitter on, the mean over VARIABILITY_SAMPLES seeds.

    One measured run is one draw of the step times, but the prediction to compare it with is
    the expectation: with jitter the slowest node varies from round to round, which adds idle
    on average that a single seeded draw over or under-states."""
    from dataclasses import replace

    from simulator.engine import simulate
    from simulator.workload import node_cvs

    timeline = simulate(scenario, plan, engine=engine)
    if not any(node_cvs(scenario, plan)):
        return timeline
    numeric = ["compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s"]
    total = timeline[numeric].to_numpy(copy=True)
    for k in range(1, VARIABILITY_SAMPLES):
        total += simulate(replace(scenario, seed=scenario.seed + k), plan, engine=engine)[numeric].to_numpy()
    timeline[numeric] = total / VARIABILITY_SAMPLES
    return timeline


def validation_table(timeline, trace, time_scale: float, emulated: bool = False, network: str = "loopback",
                     wall=None):
    """Per node, totals over rounds: predicted (timeline) against measured (trace) idle and round time.

    Measured times are divided by time_scale so that both are in the scenario's seconds.
    error_pct_of_round = 100 × (measured idle − predicted idle) / predicted round time;
    comm_error_pct = 100 × (measured sync − predicted sync) / predicted sync (NaN where no sync
    is predicted). Both are signed, so a bias shows.
    network: what the run's processes talked over (real.wan.network_note).
    wall: the predicted whole run (simulator.wallclock.WallClock), beside the measured one on every
    row (predicted_wall_s, measured_wall_s, wall_error_pct: the run's, the same for all nodes).
    """
    import pandas as pd

    from simulator.wallclock import measured_wall_s

    rounds = sorted(set(trace["round"]))
    pred = timeline[timeline["round"].isin(rounds)].copy()
    pred["round_s"] = pred["compute_s"] + pred["idle_s"] + pred["comm_s"]
    meas = trace.copy()
    for column in ("compute_s", "idle_s", "comm_s"):
        meas[column] = meas[column] / time_scale
    meas["round_s"] = meas["compute_s"] + meas["idle_s"] + meas["comm_s"]
    p = pred.groupby("node", sort=False)[["idle_s", "round_s", "compute_s", "comm_s"]].sum()
    m = meas.groupby("node", sort=False)[["idle_s", "round_s", "compute_s", "comm_s", "overrun_steps"]].sum()
    nodes = list(dict.fromkeys(timeline["node"]))
    measured_wall = measured_wall_s(trace, time_scale)
    predicted_wall = wall.wall_s if wall is not None else float("nan")
    rows = []
    for node in nodes:
        rows.append({
            "strategy": timeline["strategy"].iloc[0], "node": node,
            "predicted_idle_s": p.at[node, "idle_s"], "measured_idle_s": m.at[node, "idle_s"],
            "predicted_round_s": p.at[node, "round_s"], "measured_round_s": m.at[node, "round_s"],
            "error_pct_of_round": 100.0 * (m.at[node, "idle_s"] - p.at[node, "idle_s"]) / p.at[node, "round_s"],
            "predicted_comm_s": p.at[node, "comm_s"], "measured_comm_s": m.at[node, "comm_s"],
            "comm_error_pct": _pct(m.at[node, "comm_s"] - p.at[node, "comm_s"], p.at[node, "comm_s"]),
            "mode": MODES[emulated], "network": network,
            "predicted_compute_s": p.at[node, "compute_s"], "measured_compute_s": m.at[node, "compute_s"],
            "predicted_wall_s": predicted_wall, "measured_wall_s": measured_wall,
            "wall_error_pct": _pct(measured_wall - predicted_wall, predicted_wall) if wall is not None else float("nan"),
            "overrun_steps": int(m.at[node, "overrun_steps"]),
        })
    return pd.DataFrame(rows)


def wall_line(wall, measured_s: float) -> str:
    """The summary's wall-clock line: predicted (its parts) and measured whole-run seconds."""
    return (f"wall time: predicted {wall.wall_s:.2f} s (startup {wall.startup_s:.2f} s, rounds and checkpoints "
            f"between them {wall.rounds_s:.2f} s, last checkpoint {wall.last_checkpoint_s:.2f} s), measured "
            f"{measured_s:.2f} s ({_pct(measured_s - wall.wall_s, wall.wall_s):+.1f}%)"
            + (f"; {wall.note}" if wall.note else ""))


def _pct(difference: float, reference: float) -> float:
    return 100.0 * difference / reference if reference > 0 else float("nan")


def device_kind(scenario) -> str:
    """What the nodes' devices are, for labels: CPU, GPU, or device when the scenario mixes them."""
    kinds = {"CPU" if key == "cpu" else "GPU" for node in scenario.nodes for key in node.gpus}
    return kinds.pop() if len(kinds) == 1 else "device"


def plot_validation(table, path: Path, title: str, device: str = "GPU") -> None:
    """Three panels per node: idle and sync (predicted vs measured, signed errors under the
    nodes), and the round split into its parts.

    `device` names what idles (device_kind: CPU, GPU or device)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from simulator.outputs import save_figure

    nodes = list(table["node"])
    x = np.arange(len(nodes))
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(17, 4.8), constrained_layout=True)
    w = 0.38
    _paired_bars(ax1, x, w, table["predicted_idle_s"], table["measured_idle_s"],
                 [f"{n}\n{e:+.1f}%" for n, e in zip(nodes, table["error_pct_of_round"])])
    ax1.set_xlabel("node  (idle error: measured − predicted, % of round time)")
    ax1.set_ylabel("idle time, summed over rounds (s)")
    ax1.set_title(f"{device} idle time per node")
    _paired_bars(ax3, x, w, table["predicted_comm_s"], table["measured_comm_s"],
                 [f"{n}\n{e:+.1f}%" for n, e in zip(nodes, table["comm_error_pct"])])
    ax3.set_xlabel("node  (sync error: measured − predicted, % of predicted sync)")
    ax3.set_ylabel("sync time, summed over rounds (s)")
    ax3.set_title("sync (outer all-reduce + step) per node")
    parts = [("compute_s", "compute", "#74c476"), ("idle_s", "idle", "#fd8d3c"), ("comm_s", "sync", "#9e9ac8")]
    for offset, kind, hatch in ((-w / 2, "predicted", ""), (w / 2, "measured", "//")):
        bottom = np.zeros(len(nodes))
        for col, label, color in parts:
            values = table[f"{kind}_{col}"].to_numpy(float)
            ax2.bar(x + offset, values, w, bottom=bottom, color=color, hatch=hatch, edgecolor="white",
                    label=f"{label}" if kind == "predicted" else None)
            bottom += values
    ax2.set_xticks(x, nodes)
    ax2.set_ylabel("time, summed over rounds (s)")
    ax2.set_title("round time: predicted (plain) | measured (hatched)")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, frameon=False)
    fig.suptitle(title)
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _paired_bars(ax, x, width: float, predicted, measured, ticks: list[str]) -> None:
    b1 = ax.bar(x - width / 2, predicted, width, label="predicted", color="#9ecae1", edgecolor="#3182bd")
    b2 = ax.bar(x + width / 2, measured, width, label="measured", color="#fdae6b", edgecolor="#e6550d")
    ax.bar_label(b1, fmt="%.2f", fontsize=8)
    ax.bar_label(b2, fmt="%.2f", fontsize=8)
    ax.set_xticks(x, ticks)
    ax.legend()


@_interruptible
def validate_main(argv: list[str]) -> int:
    args = _parser("geodt validate", validate=True).parse_args(argv)
    if args.emulate and args.no_emulate:
        print("geodt validate: --emulate and --no-emulate: expected one of them", file=sys.stderr)
        return 2
    prepared = _prepare("geodt validate", args)
    if isinstance(prepared, int):
        return prepared
    scenario, plan, opts = prepared
    from dataclasses import replace

    opts = replace(opts, summary=False)  # validate prints its own table
    import pandas as pd

    from real.launch import launch
    from simulator.outputs import write_csv
    from simulator.perfetto import validation_trace, write_trace_json

    out = Path(args.out)
    timeline = predicted_timeline(scenario, plan, args.engine)
    write_csv(timeline, out / "timeline.csv")
    status = launch(out / "plan.csv", out / "scenario.toml", opts, host=args.host,
                    announce=announcer("geodt validate", scenario, plan, args.emulate))
    if status != 0:
        return status
    trace = pd.read_csv(out / "trace.csv")
    scale = args.time_scale if args.emulate else 1.0
    from real.wan import network_note

    network = network_note(out)
    from simulator.wallclock import predicted_wall_clock

    wall = predicted_wall_clock(scenario, timeline)
    table = validation_table(timeline, trace, scale, emulated=args.emulate, network=network, wall=wall)
    write_csv(table[VALIDATION_COLUMNS], out / "validation.csv")
    write_trace_json(validation_trace(timeline, trace, scale, plan.to_frame(scenario)), out / "trace.json")
    mode = (f"schedule check (emulated, time scale {args.time_scale:g})" if args.emulate
            else "measured, not emulated") + f"; {network}"
    plot_validation(table, out / "validation.png",
                    f"{scenario.name}: strategy {plan.strategy}, {len(set(trace['round']))} rounds ({mode})",
                    device_kind(scenario))
    shown = table[VALIDATION_COLUMNS + ["overrun_steps"]].copy()
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    losses = trace.groupby("round")["loss"].mean()
    print("mean loss by round: " + ", ".join(f"{v:.3f}" for v in losses))
    worst = table["error_pct_of_round"].abs().max()
    label = "schedule check (emulated): " if args.emulate else "measured: "
    caveat = ("; the warnings above say why this machine cannot reproduce the prediction"
              if reproduction_warnings(scenario, plan, args.emulate) else "")
    sync_errors = table["comm_error_pct"].dropna()
    sync = f", sync error {sync_errors.min():+.1f}% to {sync_errors.max():+.1f}%" if len(sync_errors) else ""
    print(f"{label}largest idle error: {worst:.2f}% of round time{sync}{caveat}; network: {network}; "
          f"wrote {out / 'validation.csv'}, "
          f"{out / 'validation.png'}, {out / 'trace.json'}")
    print(wall_line(wall, table["measured_wall_s"].iloc[0]))
    from simulator.network import outer_step_source

    print(outer_step_source(scenario))
    overruns = int(table["overrun_steps"].sum())
    if args.emulate and overruns:
        print(f"warning: {overruns} inner steps took longer in real compute than their emulated step time; "
              f"measured compute exceeds the prediction there (raise step_time_s or lower the load)",
              file=sys.stderr)
    return 0
