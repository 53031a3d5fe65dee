"""`geodt simulate` and `geodt plan`: load a scenario, make plans, simulate, print, write."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from formats.cli import OneLineParser
from formats.errors import FieldError, InputError


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="a scenario TOML file or a built-in name (paper, hetero-cpu)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. training.rounds=20 or nodes.node1.step_time_s=0.1")
    parser.add_argument("--out", help="output directory (default: out/<scenario name>/<command>, e.g. "
                        "out/paper/simulate, out/paper/plan-hybrid)")
    parser.add_argument("--large", action="store_true",
                        help="allow work beyond the default limit (formats/limits.py: WORK_ROWS timeline rows) "
                             "up to WORK_ROWS_LARGE")


def default_out(scenario_name: str, command: str, strategy: str | None = None) -> Path:
    """Each command's own default directory, so that no command removes another's outputs:
    out/<scenario>/simulate, out/<scenario>/plan-<S>, out/<scenario>/table, out/<scenario>/run-<S>,
    out/<scenario>/validate-<S> (docs/DESIGN.md, "Where outputs go")."""
    return Path("out") / scenario_name / (f"{command}-{strategy}" if strategy else command)


def estimated_rows(scenario, strategies: list[str]) -> dict[str, int]:
    """Timeline and sync rows each strategy would make, before planning (formats.limits.check_work):
    one per node and round; sync-ddp's rounds are the inner steps; streaming picks up to
    FRAGMENT_CHOICES' largest fragments, each a sync row per node and round."""
    from simulator.strategies.streaming import FRAGMENT_CHOICES

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


def check_work(scenario, source: str, strategies: list[str], large: bool) -> None:
    """InputError (one line) when the work estimated up front is beyond formats.limits' bounds."""
    from formats.limits import check_work as refused

    why = refused(estimated_rows(scenario, strategies), large)
    if why is not None:
        raise InputError(f"{source}: {why}")


def format_table(summary: pd.DataFrame, plan_frame: pd.DataFrame) -> str:
    """Per node: batch, H, compute, idle, sync, tokens; and a total row."""
    table = plan_frame[["node", "batch_size", "local_steps"]].merge(
        summary[["node", "compute_s", "idle_s", "comm_s", "tokens"]], on="node")
    table.columns = ["node", "batch", "H", "compute_s", "idle_s", "sync_s", "tokens"]
    total = {"node": "total", "batch": "", "H": "", **table[["compute_s", "idle_s", "sync_s", "tokens"]].sum()}
    table = pd.concat([table, pd.DataFrame([total])], ignore_index=True)
    table["tokens"] = table["tokens"].astype("int64")
    layout = plan_frame["sharding"] + plan_frame["activation_checkpointing"].map({"none": "", "full": "+recompute"})
    if (layout != "none").any():  # how each node holds its batch (simulator/memory.py), where any is sharded
        table.insert(1, "memory", list(layout) + [""])
    return table.to_string(index=False, float_format=lambda v: f"{v:.2f}")


TABLE_WIDTH = 120
PLAN_SHOWN = ["node", "gpus", "batch_size", "local_steps", "step_s", "tokens_per_round", "comm_s", "link_gbps"]
# Shown too where a node differs from the default (a value given): left out first when too wide.
PLAN_OPTIONAL = {"sharding": "none", "activation_checkpointing": "none", "cpu_quota": "", "cpu_cores": "",
                 "fragments": 1, "sync_delay_steps": 0}


def plan_text(frame: pd.DataFrame, wide: bool = False) -> str:
    """`geodt plan`'s table: the per-node columns that say what each node does, at most
    TABLE_WIDTH characters; --wide: every column of plan.csv (which always holds them all)."""
    if wide:
        return frame.drop(columns=["strategy"]).to_string(index=False)
    extra = [c for c, default in PLAN_OPTIONAL.items()
             if c in frame and (frame[c].fillna("").astype(str) != str(default)).any()]
    while True:
        text = frame[PLAN_SHOWN + extra].to_string(index=False)
        if not extra or max(map(len, text.splitlines())) <= TABLE_WIDTH:
            break
        extra.pop()
    hidden = [c for c in frame.columns if c not in ["strategy", *PLAN_SHOWN, *extra]]
    return text + f"\n(plan.csv also holds {', '.join(hidden)}; --wide prints them)"


def _parser(prog: str, plan_only: bool) -> OneLineParser:
    from simulator.engine import ENGINES
    from simulator.perfetto import TRACE_MAX_NODE_ROUNDS
    from simulator.strategies import STRATEGIES

    parser = OneLineParser(prog=prog, description=__doc__)
    _common(parser)
    if plan_only:
        parser.add_argument("--strategy", required=True, help=f"one of {', '.join(STRATEGIES)}")
        parser.add_argument("--wide", action="store_true", help="print every column of plan.csv")
    else:
        parser.add_argument("--strategy", nargs="+", action="extend", metavar="S",
                            help=f"strategies to compare (default: all of {', '.join(STRATEGIES)})")
        parser.add_argument("--engine", default="simpy", help=f"one of {', '.join(ENGINES)} (default simpy)")
        parser.add_argument("--full-trace", action="store_true",
                            help=f"trace.json with every round (default: the first rounds, up to "
                                 f"{TRACE_MAX_NODE_ROUNDS:,} node-rounds: a file a trace viewer opens comfortably)")
    return parser


def _run(argv: list[str], plan_only: bool) -> int:
    """`geodt simulate` (plan_only False) or `geodt plan`: check, plan, simulate, write, print."""
    from simulator.engine import ENGINES
    from simulator.outputs import OutputError, write_output_set
    from simulator.scenario import load_scenario
    from simulator.strategies import STRATEGIES

    prog = "geodt plan" if plan_only else "geodt simulate"
    args = _parser(prog, plan_only).parse_args(argv)
    engine = None if plan_only else args.engine
    try:
        scenario = load_scenario(args.scenario, args.overrides)
        strategies = [args.strategy] if plan_only else list(dict.fromkeys(args.strategy or STRATEGIES))
        if engine is not None and engine not in ENGINES:
            raise InputError(f"--engine {engine}: unknown engine; expected one of {', '.join(ENGINES)}")
        check_work(scenario, args.scenario, strategies, args.large)
        results, sync_frames = _results(scenario, args.scenario, strategies, engine)
        out = Path(args.out) if args.out else default_out(scenario.name, "plan" if plan_only else "simulate",
                                                          args.strategy if plan_only else None)
        files, trace_kept = _output_files(scenario, results, sync_frames, getattr(args, "full_trace", False))
        try:
            stale = write_output_set(out, files)
        except OutputError as exc:
            raise InputError(f"--out {out}: {exc}") from None
    except InputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    _print_results(scenario, results, plan_only, getattr(args, "wide", False))
    print(f"\nwrote {out}/" + (f" (removed {', '.join(stale)} of an earlier command)" if stale else ""))
    if trace_kept is not None:
        from simulator.perfetto import TRACE_MAX_NODE_ROUNDS

        rounds = max(int(t["round"].max()) for _, t, _ in results) + 1
        print(f"trace.json holds rounds 0-{trace_kept - 1} of {rounds} (the first "
              f"{TRACE_MAX_NODE_ROUNDS:,} node-rounds at most, a file a trace viewer opens comfortably); "
              "--full-trace writes every round")
    if not plan_only:  # the answer: strategies side by side and which to use (simulator/report.py)
        from simulator.report import answer
        print("\n" + answer(scenario, [(p, t) for p, t, _ in results], engine))
    return 0


def _results(scenario, source: str, strategies: list[str], engine: str | None) -> tuple[list[tuple], list]:
    """(plan, timeline, summary) per strategy, timeline and summary None when only planning; and
    the simulated fragment syncs per strategy (syncs.csv)."""
    from simulator.engine import simulate_syncs, summary
    from simulator.strategies import make_plan

    try:
        plans = [make_plan(scenario, s) for s in strategies]
    except FieldError as exc:
        raise InputError(f"{source}: {exc.key}: {exc.expected}") from None
    results, sync_frames = [], []
    for plan in plans:
        if engine is None:
            results.append((plan, None, None))
        else:
            timeline, syncs = simulate_syncs(scenario, plan, engine)
            results.append((plan, timeline, summary(timeline, plan)))
            sync_frames.append(syncs)
    return results, sync_frames


def _output_files(scenario, results: list[tuple], sync_frames: list, full_trace: bool) -> tuple[dict, int | None]:
    """The output set (plan.csv; for a simulation timeline.csv, summary.csv, syncs.csv and
    trace.json; scenario.toml, resolved, always) and the rounds trace.json holds when it was
    capped (else None)."""
    from simulator.outputs import csv_bytes
    from simulator.perfetto import TRACE_MAX_NODE_ROUNDS, simulation_trace_text

    plan_frame = pd.concat([p.to_frame(scenario) for p, _, _ in results], ignore_index=True)
    files = {"plan.csv": csv_bytes(plan_frame)}
    trace_kept = None
    if sync_frames:  # a simulation
        timeline = pd.concat([t for _, t, _ in results], ignore_index=True)
        files["timeline.csv"] = csv_bytes(timeline)
        files["summary.csv"] = csv_bytes(pd.concat([s for _, _, s in results], ignore_index=True))
        syncs = pd.concat(sync_frames, ignore_index=True)
        files["syncs.csv"] = csv_bytes(syncs)
        trace, trace_kept = simulation_trace_text(timeline, plan_frame,  # opens in ui.perfetto.dev
                                                  None if full_trace else TRACE_MAX_NODE_ROUNDS, syncs)
        files["trace.json"] = trace.encode()
    files["scenario.toml"] = scenario.to_toml().encode()
    return files, trace_kept


def _print_results(scenario, results: list[tuple], plan_only: bool, wide: bool = False) -> None:
    """Per strategy: its plan (geodt plan) or its per-node table (geodt simulate)."""
    for plan, timeline, summ in results:
        frame = plan.to_frame(scenario)
        print(f"\n== {plan.strategy} ==  {scenario.name}: {len(plan.nodes)} nodes, "
              f"{plan.rounds or scenario.training.rounds} rounds, sync {plan.comm_s:.2f} s per "
              + (f"fragment, {plan.fragments} a round, all-reduces overlapping {plan.sync_delay_steps} inner steps"
                 if plan.streaming else "round")
              + (f"; {plan.note}" if plan.note else ""))
        if plan_only:
            print(plan_text(frame, wide))
        else:
            print(format_table(summ, frame))
    encoded = [p.strategy for p, _, _ in results
               if (p.payload_dtype or scenario.network.payload_dtype, p.collective or scenario.network.collective)
               != ("fp32", "ring")]
    if encoded:  # only the fused ring + fp32 all-reduce encodes nothing
        from simulator.network import codec_note

        print(f"\nsync of {', '.join(encoded)}: {codec_note(scenario)}")
    if scenario.network_model is not None and scenario.network_model.shaped:
        from simulator.network import wire_note

        print(f"sync: {wire_note(scenario)}")


def interruptible(prog: str, main, argv) -> int:
    """main(argv), with Ctrl-C as one line and exit status 130 (outputs are written as a set: none half-written)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing was written", file=sys.stderr)
        return 130


def simulate_main(argv: list[str] | None = None) -> int:
    return interruptible("geodt simulate", lambda a: _run(a, plan_only=False), list(sys.argv[1:] if argv is None else argv))


def plan_main(argv: list[str] | None = None) -> int:
    return interruptible("geodt plan", lambda a: _run(a, plan_only=True), list(sys.argv[1:] if argv is None else argv))
