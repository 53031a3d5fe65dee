"""`geodt simulate` and `geodt plan`: load a scenario, make plans, simulate, print, write.

`geodt simulate` writes its tables as the engine produces them (simulator/outputs/run_outputs.py) into a
stage that replaces --out's files only once all are written (simulator/outputs/outputs.py StagedOutput).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from formats.cli import OneLineParser, add_key_option, add_strategy_list, key_overrides
from formats.errors import FieldError, InputError, write_error
from formats.limits import check_work as refused
from formats.limits import large_help
from formats.owners import add_force_argument, check_owner
from formats.timeline import LOSS_COLUMNS, STALENESS_COLUMNS, SYNC_COLUMNS, TIMELINE_COLUMNS
from simulator.engines.engine import ENGINES, check_size, pick_engine, simulate, simulate_chunks, summary
from simulator.models.loss_prediction import (
    at_baseline_loss,
    describe,
    format_time,
    loss_setup,
    plan_rounds,
    predict,
)
from simulator.models.network import codec_note, wire_note
from simulator.models.outage import check_modelled, outages
from simulator.models.provenance import band_note, sources_text, with_provenance
from simulator.models.totals import RunTotals
from simulator.outputs.loss_figure import loss_figure
from simulator.outputs.outputs import OutputError, StagedOutput, csv_bytes, write_output_set
from simulator.outputs.perfetto import TRACE_MAX_NODE_ROUNDS, simulation_trace_text
from simulator.outputs.report import answer
from simulator.outputs.run_figure import EDGE_NODES, SHOWN_NODES_MAX, edge_nodes, idle_figure
from simulator.outputs.run_outputs import TIMELINE_FULL_MAX_ROWS, PlanSink, TableWriter, block_rounds, chunk_rounds
from simulator.scenario import load_scenario
from simulator.strategies import BARRIERLESS, STRATEGIES, make_plan
from simulator.strategies.registry import help_lines
from simulator.strategies.streaming import FRAGMENT_CHOICES

SIMULATE_HELP = ("Load a scenario, plan each strategy, simulate its rounds and compare: a summary on the screen, "
                 "and the tables and figures in --out. The new files replace --out's old ones only once all are "
                 "written, so an interrupted run leaves the old ones whole.")
PLAN_HELP = ("Load a scenario and make one strategy's plan: print it and write plan.csv, scenario.toml and a "
             "figure of its idle time per node and its first rounds (idle.png).")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="a scenario TOML file or a built-in name (paper, hetero-cpu)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. training.rounds=20 or nodes.node1.step_time_s=0.1")
    parser.add_argument("--out", help="output directory (default: out/<scenario name>/<command>, e.g. "
                        "out/paper/simulate, out/paper/plan-hybrid)")
    add_key_option(parser, "target_loss", "the loss the run must reach: each strategy's predicted time to it, "
                   "and the recommendation ranks by it")
    parser.add_argument("--large", action="store_true", help=large_help())
    add_force_argument(parser)


def default_out(scenario_name: str, command: str, strategy: str | None = None) -> Path:
    """Each command's own default directory, so that no command removes another's outputs:
    out/<scenario>/simulate, out/<scenario>/plan-<S>, out/<scenario>/table, out/<scenario>/run-<S>,
    out/<scenario>/validate-<S> (docs/DESIGN.md, "Where outputs go")."""
    return Path("out") / scenario_name / (f"{command}-{strategy}" if strategy else command)


def estimated_rows(scenario, strategies: list[str]) -> dict[str, int]:
    """Timeline and sync rows each strategy would make, before planning (formats.limits.check_work):
    one per node and round; sync-ddp's rounds are the inner steps; streaming picks up to
    FRAGMENT_CHOICES' largest fragments, each a sync row per node and round."""
    rounds, nodes = scenario.training.rounds, len(scenario.nodes)
    fragments = scenario.diloco.fragments
    rows = {}
    for name in strategies:
        if name == "sync-ddp":
            rows[name] = rounds * scenario.training.local_steps * nodes
        else:
            p = max(FRAGMENT_CHOICES) if name == "streaming" else fragments
            rows[name] = rounds * nodes * (1 + (p if p > 1 else 0))
    return rows


def check_work(scenario, source: str, strategies: list[str], large: bool, output: str | None = None) -> None:
    """InputError (one line) when the work estimated up front is beyond formats.limits' bounds
    (`output`: "csv" or "parquet" where the command writes the rows, for the size it names)."""
    why = refused(estimated_rows(scenario, strategies), large, output=output)
    if why is not None:
        raise InputError(f"{source}: {why}")


def format_table(summary: pd.DataFrame, plan_frame: pd.DataFrame) -> str:
    """Per node: batch, H, compute, idle, sync, tokens, where its step time comes from; and a total row."""
    table = plan_frame[["node", "batch_size", "local_steps"]].merge(
        summary[["node", "compute_s", "idle_s", "comm_s", "tokens", "step_source"]], on="node")
    table.columns = ["node", "batch", "H", "compute_s", "idle_s", "sync_s", "tokens", "step"]
    total = {"node": "total", "batch": "", "H": "", **table[["compute_s", "idle_s", "sync_s", "tokens"]].sum(),
             "step": ""}
    layout = plan_frame["sharding"] + plan_frame["activation_checkpointing"].map({"none": "", "full": "+recompute"})
    if (layout != "none").any():  # how each node holds its batch (simulator/models/memory.py), where any is sharded
        table.insert(1, "memory", list(layout))
    picked = edge_nodes(table["idle_s"].to_numpy()) if len(table) > SHOWN_NODES_MAX else None
    if picked is not None:
        table = table.iloc[picked]
    table = pd.concat([table, pd.DataFrame([total])], ignore_index=True).fillna({"memory": ""})
    table["tokens"] = table["tokens"].astype("int64")
    text = table.to_string(index=False, float_format=lambda v: f"{v:.2f}")
    if picked is None:
        return text
    idle = summary["idle_s"].to_numpy(dtype=float)
    lines = text.splitlines()
    note = (f"(the {EDGE_NODES} slowest nodes, least idle, then the {EDGE_NODES} fastest, most idle, of "
            f"{len(summary):,}: summary.csv holds every node; idle_s per node: min {idle.min():.2f}, median "
            f"{np.median(idle):.2f}, p90 {np.quantile(idle, 0.9):.2f}, max {idle.max():.2f})")
    return "\n".join([*lines[:-1], note, lines[-1]])


TABLE_WIDTH = 120
PLAN_SHOWN = ["node", "gpus", "batch_size", "local_steps", "step_s", "tokens_per_round", "comm_s", "link_gbps"]
# Shown too where a node differs from the default (a value given): left out first when too wide.
PLAN_OPTIONAL = {"sharding": "none", "activation_checkpointing": "none", "cpu_quota": "", "cpu_cores": "",
                 "fragments": 1, "sync_delay_steps": 0, "quorum": "", "grace_s": ""}


def plan_text(frame: pd.DataFrame, wide: bool = False) -> str:
    """`geodt plan`'s table: the per-node columns that say what each node does, at most
    TABLE_WIDTH characters; --wide: every column of plan.csv (which always holds them all)."""
    note = ""
    if len(frame) > SHOWN_NODES_MAX:  # the slowest and fastest rounds' compute; plan.csv holds every node
        compute_s = frame["step_s"].to_numpy(dtype=float) * frame["local_steps"].to_numpy(dtype=float)
        note = (f"\n(the {EDGE_NODES} slowest nodes, most compute a round, then the {EDGE_NODES} fastest, of "
                f"{len(frame):,}: plan.csv holds every node; step_s x local_steps per node: min "
                f"{compute_s.min():.2f} s, median {np.median(compute_s):.2f} s, max {compute_s.max():.2f} s)")
        frame = frame.iloc[edge_nodes(-compute_s)]
    if wide:
        return frame.drop(columns=["strategy"]).to_string(index=False) + note
    extra = [c for c, default in PLAN_OPTIONAL.items()
             if c in frame and (frame[c].fillna("").astype(str) != str(default)).any()]
    while True:
        text = frame[PLAN_SHOWN + extra].to_string(index=False)
        if not extra or max(map(len, text.splitlines())) <= TABLE_WIDTH:
            break
        extra.pop()
    hidden = [c for c in frame.columns if c not in ["strategy", *PLAN_SHOWN, *extra]]
    return text + note + f"\n(plan.csv also holds {', '.join(hidden)}; --wide prints them)"


def _parser(prog: str, plan_only: bool) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=PLAN_HELP if plan_only else SIMULATE_HELP)
    _common(parser)
    if plan_only:
        parser.add_argument("--strategy", required=True,
                            help=f"one of {', '.join(STRATEGIES)}, or without a barrier {', '.join(BARRIERLESS)}")
        parser.add_argument("--wide", action="store_true", help="print every column of plan.csv")
    else:
        parser.add_argument("--strategy", nargs="+", action="extend", metavar="S",
                            help=f"strategies to compare (default: all of {', '.join(STRATEGIES)}; without a "
                                 f"barrier, when named: {', '.join(BARRIERLESS)})")
        parser.add_argument("--engine", default="auto",
                            help=f"one of {', '.join(ENGINES)} (default auto: the analytic path where it is "
                                 "exact, which the output says; simpy simulates every event)")
        parser.add_argument("--full-trace", action="store_true",
                            help=f"trace.json with every round (default: the first rounds, up to "
                                 f"{TRACE_MAX_NODE_ROUNDS:,} node-rounds: a file a trace viewer opens comfortably)")
        parser.add_argument("--full-timeline", action="store_true",
                            help=f"every node-round in the timeline and every sync (default: a strategy of "
                                 f"more than {TIMELINE_FULL_MAX_ROWS:,} node-rounds has its rounds summed in "
                                 "blocks and its first syncs only)")
        parser.add_argument("--csv", action="store_true",
                            help="timeline.csv and syncs.csv instead of timeline.parquet and syncs.parquet")
    add_strategy_list(parser, help_lines())
    return parser


def _run(argv: list[str], plan_only: bool) -> int:
    """`geodt simulate` (plan_only False) or `geodt plan`: check, plan, simulate, write, print."""
    prog = "geodt plan" if plan_only else "geodt simulate"
    args = _parser(prog, plan_only).parse_args(argv)
    engine = None if plan_only else args.engine
    try:
        scenario = load_scenario(args.scenario, args.overrides + key_overrides(args))
        setup = loss_setup(scenario)
        strategies = [args.strategy] if plan_only else list(dict.fromkeys(args.strategy or STRATEGIES))
        if engine is not None and engine not in ENGINES:
            raise InputError(f"--engine {engine}: unknown engine; expected one of {', '.join(ENGINES)}")
        check_work(scenario, args.scenario, strategies, args.large,
                   None if plan_only else ("csv" if args.csv else "parquet"))
        plans = _plans(scenario, args.scenario, strategies)
        if not plan_only and "baseline" not in strategies:  # the answer's ratios simulate the baseline too:
            _refuse_unmodelled_outage(scenario, _plans(scenario, args.scenario, ["baseline"])[0])  # before writing
        out = Path(args.out) if args.out else default_out(scenario.name, "plan" if plan_only else "simulate",
                                                          args.strategy if plan_only else None)
        why = check_owner(out, "plan" if plan_only else "simulate", args.force)
        if why is not None:
            raise InputError(why)
        frames = {p.strategy: p.to_frame(scenario) for p in plans}  # plan.csv's rows: written, printed, traced
        try:
            if plan_only:
                results, notes = [(p, None, None) for p in plans], []
                timelines = _plan_timelines(scenario, plans)
                files = {"plan.csv": csv_bytes(pd.concat(frames.values(), ignore_index=True)),
                         "scenario.toml": scenario.to_toml().encode(),
                         "idle.png": idle_figure([_idle_run(p.strategy, timelines[p.strategy]) for p in plans])}
                stale = write_output_set(out, files)
                written = list(files)
                losses = _plan_losses(scenario, plans, setup, timelines) if setup.target is not None else None
            else:
                results, notes, stale, losses, written = _simulate(out, scenario, plans, frames, args, setup)
        except OutputError as exc:
            raise InputError(f"--out {out}: {exc}") from None
        except OSError as exc:  # a full disk, a quota, a read-only file system met while writing
            raise InputError(write_error(out, exc)) from None
    except InputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    _print_results(scenario, results, frames, plan_only, getattr(args, "wide", False))
    print(f"\nwrote {out}/: {', '.join(written)}"
          + (f" (removed {', '.join(stale)} of an earlier command)" if stale else ""))
    for note in notes:
        print(note)
    _print_answer(scenario, results, plan_only, engine, losses, setup)
    return 0


def _print_answer(scenario, results: list[tuple], plan_only: bool, engine, losses, setup) -> None:
    """geodt simulate: strategies side by side and which to use (simulator/outputs/report.py); geodt plan:
    the loss model's prediction, when a target loss is given."""
    if not plan_only:
        bands = {p.strategy: float(s["error_band_pct"].iloc[0]) for p, _, s in results}
        staleness = ({p.strategy: tuple(s[STALENESS_COLUMNS].iloc[0]) for p, _, s in results}
                     if any(not p.round_kind.barrier for p, _, _ in results) else None)
        print("\n" + answer(scenario, [(p, t) for p, t, _ in results], engine, losses, setup.target,
                            loss_notes(setup, losses), bands, band_note(scenario, [s for _, _, s in results]),
                            staleness))
    elif losses:
        print("\n" + loss_notes(setup, losses))
        for name, pred in losses.items():
            print(f"{name}: predicted loss {pred['loss_end']:.3f} at the end; loss {setup.target:g} at "
                  f"{format_time(pred['time_to_target_s'])} s")


def loss_notes(setup, losses: dict) -> str:
    """Where the loss figures come from: each effect's source once, then per strategy its effects (δ: share of
    the loss at equal tokens; η: token multiplier), its band, what lies beyond a source's range, and what the
    model could not weigh."""
    lines = [describe(setup)]
    legend = {}
    for pred in losses.values():
        legend.update({k: src for k, (_, _, src, _) in pred.get("sources", {}).items()})
    lines += [f"  {k}: {src}" for k, src in legend.items()]
    for name, pred in losses.items():
        parts = [_effect_text(k, d, eta) for k, (d, eta, _, _) in pred.get("sources", {}).items()
                 if _shown(d, eta)]
        assumed = [k for k, (d, eta, src, _) in pred.get("sources", {}).items() if "assumed none" in src]
        if assumed:
            parts.append(f"no published effect, none assumed: {', '.join(assumed)}")
        parts.append(f"band ±{100 * pred['band']:.2f}%")
        out = [f"{k}: {x}" for k, (_, _, _, x) in pred.get("sources", {}).items() if x]
        if out:
            parts.append("extrapolated: " + "; ".join(out))
        if pred["uncalibrated"]:
            parts.append(f"not calibrated: {', '.join(pred['uncalibrated'])}")
        if pred["clamped"]:
            parts.append(f"beyond the calibrated runs, held at their edge: {', '.join(pred['clamped'])}")
        lines.append(f"  {name}: " + ", ".join(parts))
    return "\n".join(lines)


# An effect is printed where it shows at the printed precision (δ to 0.01%, η to 0.001): below, "-0.00%".
DELTA_SHOWN_PCT, ETA_SHOWN = 0.005, 0.0005


def _shown(delta_pct: float, eta: float) -> bool:
    return abs(delta_pct) >= DELTA_SHOWN_PCT or abs(eta - 1) >= ETA_SHOWN


def _effect_text(name: str, delta_pct: float, eta: float) -> str:
    return name + (f" {delta_pct:+.2f}%" if abs(delta_pct) >= DELTA_SHOWN_PCT else "") + \
        (f" η {eta:.3f}" if abs(eta - 1) >= ETA_SHOWN else "")


def _baseline_loss(scenario, setup) -> dict:
    """The baseline's prediction where it was not asked for: the reference of the loss-weighed answer."""
    plan = make_plan(scenario, "baseline")
    return predict(setup, scenario, plan, plan_rounds(plan, simulate(scenario, plan, "auto")))


def _plan_timelines(scenario, plans) -> dict:
    """`geodt plan`: each plan's rounds simulated (the exact engine), for idle.png and the loss model."""
    return {p.strategy: simulate(scenario, p, "auto") for p in plans}


def _plan_losses(scenario, plans, setup, timelines: dict) -> dict:
    """`geodt plan --target-loss`: the loss model over each plan's simulated rounds."""
    return {p.strategy: predict(setup, scenario, p, plan_rounds(p, timelines[p.strategy])) for p in plans}


def _idle_run(strategy: str, timeline: pd.DataFrame) -> tuple:
    """idle_figure's entry of one strategy from its whole timeline."""
    totals = RunTotals.of(timeline)
    return strategy, totals.nodes, totals.per_node[:, 1], timeline


def _refuse_unmodelled_outage(scenario, plan) -> None:
    """InputError where the plan has a lost node its kind of rounds does not model (simulator/models/outage.py)."""
    if outages(scenario, plan):
        check_modelled(scenario, plan)


def _plans(scenario, source: str, strategies: list[str]) -> list:
    try:
        return [make_plan(scenario, s) for s in strategies]
    except FieldError as exc:
        raise InputError(f"{source}: {exc.key}: {exc.expected}") from None


def _simulate(out: Path, scenario, plans: list, frames: dict, args,
              setup) -> tuple[list[tuple], list[str], list[str], dict, list]:
    """Simulate every plan into --out's stage, the tables written chunk by chunk as the engine
    produces them (simulator/outputs/run_outputs.py); then plan.csv, summary.csv, trace.json and
    scenario.toml, loss.png and idle.png, and the whole set renamed into place. ((plan, totals,
    summary) per strategy, the notes to print, the stale files removed, the files written)."""
    for plan in plans:  # every refusal before anything is written
        check_size(scenario, plan)
    fmt = "csv" if args.csv else "parquet"
    rounds = [plan.settings_from(scenario).rounds for plan in plans]
    blocks = [block_rounds(r, len(p.nodes), args.full_timeline) for r, p in zip(rounds, plans)]
    columns = TIMELINE_COLUMNS + (["rounds"] if max(blocks) > 1 else [])
    names = ["plan.csv", f"timeline.{fmt}", "summary.csv", f"syncs.{fmt}", "trace.json", "scenario.toml", "loss.png",
             "idle.png"]
    cap = None if args.full_trace else TRACE_MAX_NODE_ROUNDS
    engines = [pick_engine(scenario, plan, args.engine) for plan in plans]
    with StagedOutput(out, names) as stage:
        with stage.open(f"timeline.{fmt}") as timeline_file, stage.open(f"syncs.{fmt}") as syncs_file:
            tables = TableWriter(timeline_file, fmt, columns), TableWriter(syncs_file, fmt, SYNC_COLUMNS)
            try:
                sinks = [_run_plan(scenario, plan, engine, r, block, tables, cap)
                         for plan, (engine, _), r, block in zip(plans, engines, rounds, blocks)]
                # made while the tables' writer thread encodes their last chunks (pyarrow, off the GIL)
                results, losses, files, kept = _the_rest(scenario, sinks, frames, setup, cap)
                for table in tables:
                    table.close()
            except BaseException:
                for table in tables:
                    table.abandon()
                raise
        for name, data in files.items():
            with stage.open(name) as handle:
                handle.write(data)
        stale = stage.commit()
    notes = _notes(sinks, engines, fmt, kept)
    return results, notes, stale, losses, names


def _the_rest(scenario, sinks, frames: dict, setup, cap) -> tuple[list[tuple], dict, dict, int | None]:
    """After the runs: each strategy's loss and summary rows, and the files but the tables (plan.csv,
    summary.csv, trace.json, scenario.toml, loss.png, idle.png); the trace's rounds kept (None: all)."""
    losses = {s.plan.strategy: predict(setup, scenario, s.plan, pd.concat(s.round_parts, ignore_index=True))
              for s in sinks}
    if setup.target is None:  # ranked by the time to the baseline's loss (report.py), asked for or not
        reference = losses if "baseline" in losses else {**losses, "baseline": _baseline_loss(scenario, setup)}
        at_baseline_loss(reference, setup.model.curve)
    results = [(s.plan, s.totals, with_staleness(with_provenance(
        with_losses(summary(s.totals, s.plan), losses[s.plan.strategy]), scenario), s.totals)) for s in sinks]
    plan_frame = pd.concat(frames.values(), ignore_index=True)
    trace, kept = _trace(sinks, plan_frame, cap)
    files = {"plan.csv": csv_bytes(plan_frame),
             "summary.csv": csv_bytes(pd.concat([s for _, _, s in results], ignore_index=True)),
             "trace.json": trace.encode(), "scenario.toml": scenario.to_toml().encode(),
             "loss.png": loss_figure(losses, setup, getattr(scenario.model.arch, "vocab_size", None)),
             "idle.png": idle_figure([(s.plan.strategy, s.totals.nodes, s.totals.per_node[:, 1],
                                       pd.concat([t for t, _ in s.heads], ignore_index=True)) for s in sinks])}
    return results, losses, files, kept


def with_losses(summ: pd.DataFrame, pred: dict) -> pd.DataFrame:
    """summary.csv's rows of one strategy with the loss model's columns (formats/timeline.py LOSS_COLUMNS)."""
    return summ.assign(**{c: pred[c] for c in LOSS_COLUMNS})


def with_staleness(summ: pd.DataFrame, totals) -> pd.DataFrame:
    """summary.csv's rows of one strategy with its merges' staleness (formats/timeline.py STALENESS_COLUMNS)."""
    return summ.assign(**dict(zip(STALENESS_COLUMNS, totals.staleness_stats())))


def _run_plan(scenario, plan, engine: str, rounds: int, block: int, tables, cap):
    """One strategy simulated into the tables; its PlanSink (totals, the trace's first rounds)."""
    from tqdm import tqdm  # noqa: PLC0415  deferred: tqdm only when simulating; geodt plan and --help read without it

    n = len(plan.nodes)
    sink = PlanSink(plan, rounds, *tables, block, None if cap is None else cap // n + 2)
    chunk = chunk_rounds(n, block)
    with tqdm(total=rounds, desc=plan.strategy, unit="round", leave=False,
              disable=True if rounds <= 4 * chunk else None) as bar:
        def add(timeline, syncs):
            sink.add(timeline, syncs)
            bar.update(len(timeline) // n)
        simulate_chunks(scenario, plan, engine, add, chunk)
    return sink


def _trace(sinks, plan_frame: pd.DataFrame, cap) -> tuple[str, int | None]:
    """trace.json (opens in ui.perfetto.dev) from every strategy's first rounds, and the rounds it
    holds when capped (else None)."""
    heads = [head for sink in sinks for head in sink.heads]
    timeline = pd.concat([t for t, _ in heads], ignore_index=True)
    syncs = pd.concat([s for _, s in heads], ignore_index=True)
    return simulation_trace_text(timeline, plan_frame, cap, syncs, max(s.rounds for s in sinks))


def _notes(sinks, engines, fmt: str, kept: int | None) -> list[str]:
    """What the run did that a reader must know: the engine, aggregated tables, a capped trace."""
    notes = [f"engine: {engine} ({why})" for engine, why in dict.fromkeys(engines)]
    for sink in sinks:
        if sink.block > 1:
            notes.append(f"timeline.{fmt}: {sink.plan.strategy}'s {sink.rounds:,} rounds x {sink.n} nodes are "
                         f"above {TIMELINE_FULL_MAX_ROWS:,} node-rounds: summed in blocks of {sink.block} rounds "
                         f"(column rounds), syncs.{fmt} holds its rounds 0-{min(sink.sync_rounds, sink.rounds) - 1}; "
                         "--full-timeline writes every round")
    if kept is not None:
        rounds = max(s.rounds for s in sinks)
        notes.append(f"trace.json holds rounds 0-{kept - 1} of {rounds} (the first {TRACE_MAX_NODE_ROUNDS:,} "
                     "node-rounds at most, a file a trace viewer opens comfortably); --full-trace writes every round")
    return notes


def _print_results(scenario, results: list[tuple], frames: dict, plan_only: bool, wide: bool = False) -> None:
    """Per strategy: its plan (geodt plan) or its per-node table (geodt simulate); frames: plan.csv's rows
    per strategy."""
    for plan, _timeline, summ in results:
        frame = frames[plan.strategy]
        print(f"\n== {plan.strategy} ==  {scenario.name}: {len(plan.nodes)} nodes, "
              f"{plan.settings_from(scenario).rounds} rounds, sync {plan.comm_s:.2f} s per "
              + plan.round_kind.sync_text(plan) + (f"; {plan.note}" if plan.note else ""))
        if plan_only:
            print(plan_text(frame, wide))
        else:
            print(format_table(summ, frame))
            print(f"band ± {summ['error_band_pct'].iloc[0]:.0f}% "
                  f"({sources_text(scenario, list(summ['step_source']))})")
    settings = {p.strategy: p.settings_from(scenario) for p, _, _ in results}
    encoded = [name for name, s in settings.items() if (s.payload_dtype, s.collective) != ("fp32", "ring")]
    if encoded:  # only the fused ring + fp32 all-reduce encodes nothing
        print(f"\nsync of {', '.join(encoded)}: {codec_note(scenario)}")
    if scenario.network_model is not None and scenario.network_model.shaped:
        print(f"sync: {wire_note(scenario)}")


def interruptible(prog: str, main, argv) -> int:
    """main(argv), with Ctrl-C as one line and exit status 130 (outputs are written as a set: none half-written)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing was written", file=sys.stderr)
        return 130


def simulate_main(argv: list[str] | None = None) -> int:
    return interruptible("geodt simulate", lambda a: _run(a, plan_only=False),
                         list(sys.argv[1:] if argv is None else argv))


def plan_main(argv: list[str] | None = None) -> int:
    return interruptible("geodt plan", lambda a: _run(a, plan_only=True), list(sys.argv[1:] if argv is None else argv))
