"""`geodt sweep`: what-if sweeps over node mixes (parallel, resumable), or one scenario's table.

    geodt sweep --nodes 4 --gpus-per-node 4 --gpu-types a30,v100,t4 [--mixed-nodes]
                --bandwidth-gbps 0.1,1,10 [--strategy S ...] --samples N --seed S --out DIR
    geodt sweep --table paper --out DIR       every strategy on one scenario (SimPy engine)

A sweep splits its scenarios into chunks of CHUNK scenarios, decides them on every core
(multiprocessing) or on a Dask cluster (--scheduler, simulator/sweep/sweep_cluster.py), and writes
each finished chunk to DIR/parts-chunkN/ at once as a Parquet part (the same bytes for the
same chunk on every run and engine); a rerun with the same arguments skips the parts already
there, so an interrupted sweep resumes. At the end the parts become the dataset DIR/sweep/
(tidy: one row per scenario × strategy, simulator/sweep/sweep_dataset.py), DIR/sweep.sha256 (each
part's digest, written last: a dataset cut short or altered is detected and redone, never
taken as finished), and, with --csv, DIR/sweep.csv and sweep.csv.sha256 as well (written part
by part); then spec.json, scenario.toml (the base scenario) and the figures, the findings and
figures computed part by part (memory bounded whatever the size). One sweep at a time writes
into a DIR (a lock file, DIR/.sweep.lock): a second identical sweep waits for the first, then
finds it finished.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from tqdm import tqdm

from facts.catalog import CatalogError, get_gpu
from formats.cli import (
    OneLineParser,
    add_key_option,
    add_strategy_list,
    key_overrides,
    non_negative_int,
    positive_float,
    positive_int,
)
from formats.errors import FieldError, InputError, did_you_mean
from formats.files import FileLock
from formats.limits import SWEEP_STEPS, SWEEP_STEPS_LARGE, large_help
from formats.limits import check_work as refused
from formats.owners import TEMP_SUFFIX, add_force_argument, check_owner, remove_orphan_temps, temp_prefix
from formats.sections import NetworkConfig, bounds_of
from simulator.cli import check_work, default_out, write_error
from simulator.engines.engine import simulate, summary
from simulator.models.loss_prediction import loss_setup, plan_rounds, predict
from simulator.outputs.outputs import (
    OutputError,
    StagedOutput,
    check_writable,
    csv_bytes,
    write_bytes,
    write_output_set,
    write_text,
)
from simulator.outputs.report import TOKENS_BAND, does_baseline_work
from simulator.outputs.sweep_table import format_markdown, table_frame, timeline_metrics
from simulator.scenario import load_scenario
from simulator.strategies import BARRIERLESS, STRATEGIES, make_plan
from simulator.strategies.registry import help_lines
from simulator.strategies.streaming import FRAGMENT_CHOICES
from simulator.sweep.sweep import SweepSpec, describe_grid, node_kinds, scenario_grid
from simulator.sweep.sweep_cluster import WORKER_TIMEOUT_S, ClusterLost, connect, run_on_cluster
from simulator.sweep.sweep_dataset import COMPARABLE, SweepStats, chunk_bytes, kind_tables, read_part, sweep_drift
from simulator.sweep.sweep_figures import write_figures
from simulator.sweep.sweep_summary import findings_text

SWEEP_HELP = """\
    geodt sweep --nodes 4 --gpus-per-node 4 --gpu-types a30,v100,t4 [--mixed-nodes]
                --bandwidth-gbps 0.1,1,10 [--strategy S ...] --samples N --seed S --out DIR
    geodt sweep --table paper --out DIR       every strategy on one scenario (event-by-event engine)

A sweep plans and scores every strategy on many node mixes and bandwidths at once, on every
core (or on a Dask cluster with --scheduler). Each node is laid out in memory (sharding,
recomputation) as `geodt plan` lays it out. Finished chunks are kept in DIR/parts-chunkN/, so
an interrupted sweep resumes when rerun with the same arguments. At the end DIR/sweep/ holds
the dataset (one row per scenario and strategy, Parquet; --csv adds DIR/sweep.csv), with
DIR/sweep.sha256 (its digests, written last), spec.json, scenario.toml, the figures and the
findings. A second identical sweep into the same DIR waits for the first, then finds it done.
"""
CHUNK = 500
MAX_NODES = 1000
MAX_GPUS_PER_NODE = 64
MAX_KINDS = 20_000
MAX_SAMPLES = 1_000_000
_WORKER: dict = {}


def _floats(text: str) -> tuple[float, ...]:
    lo, hi = bounds_of(NetworkConfig, "bandwidth_gbps")
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not values or any(not lo <= v <= hi for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers from {lo:g} to {hi:g}, got {text!r}")
    return values


def parser():
    p = OneLineParser(prog="geodt sweep", description=SWEEP_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", metavar="SCENARIO", help="instead of a sweep: every strategy on this scenario")
    p.add_argument("--base", default="paper",
                   help="scenario whose model, training and network a sweep keeps (default paper)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the base (or --table) scenario")
    p.add_argument("--nodes", type=positive_int, default=4, help="nodes per scenario (default 4)")
    p.add_argument("--gpus-per-node", type=positive_int, default=4, help="GPUs per node (default 4)")
    p.add_argument("--gpu-types", default="rtx-2080-ti,titan-rtx,a30,rtx-3090,v100",
                   help="catalog keys, comma separated (default: the paper's five)")
    p.add_argument("--mixed-nodes", action="store_true", help="nodes may mix GPU types (default: one type per node)")
    p.add_argument("--bandwidth-gbps", type=_floats, default=(0.1, 1.0, 10.0), help="WAN bandwidths (default 0.1,1,10)")
    p.add_argument("--strategy", nargs="+", action="extend", metavar="S",
                   help=f"strategies (default: all of {', '.join(STRATEGIES)})")
    p.add_argument("--samples", type=positive_int, default=1000,
                   help="at most about this many scenarios (default 1000)")
    p.add_argument("--drift", default="", metavar="TOML",
                   help='every node drifts by these events, e.g. \'[{kind="walk", spread=0.05}]\' (docs/DESIGN.md)')
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the sample of mixes (default 0)")
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    p.add_argument("--chunk", type=positive_int, default=CHUNK, help=f"scenarios per unit of work (default {CHUNK})")
    add_key_option(p, "target_loss", "the loss to reach: the dataset gains loss_end and time_to_target_s per "
                   "scenario and strategy (the predicted loss curve)")
    p.add_argument("--no-figures", action="store_true", help="write the table only")
    p.add_argument("--csv", action="store_true", help="also sweep.csv (and its digest) beside the dataset sweep/")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the chunks on this Dask scheduler (tcp://host:8786; needs geodt[cluster]) "
                        "instead of local processes; the results are the same bytes")
    p.add_argument("--worker-timeout-s", type=positive_float, default=None, metavar="S",
                   help="--scheduler: stop when the cluster has had no worker for S seconds [60]; the chunks done "
                        "are kept for a rerun")
    p.add_argument("--out", help="output directory (a sweep: required; --table: default out/<scenario name>/table)")
    p.add_argument("--large", action="store_true",
                   help=large_help() + "; for streaming, " + large_help(
                       "fragment-sync steps (chunks x rounds x nodes x 17)", (SWEEP_STEPS, SWEEP_STEPS_LARGE)))
    add_force_argument(p)
    add_strategy_list(p, help_lines(STRATEGIES))
    return p


# Options that say what a sweep computes, which a --table run does not use: given with --table they
# are refused, not ignored (--nodes 3 would otherwise look applied). How it runs (--workers, --chunk,
# --no-figures) changes no result and stays accepted.
SWEEP_ONLY = ("base", "nodes", "gpus_per_node", "gpu_types", "mixed_nodes", "bandwidth_gbps", "samples", "seed")


def check_table_options(args, p) -> None:
    """--table with a sweep's option (e.g. --nodes 3): one line naming it, not a silently ignored option."""
    given = [name for name in SWEEP_ONLY if getattr(args, name) != p.get_default(name)]
    if args.table and given:
        flag = "--" + given[0].replace("_", "-")
        raise InputError(f"{flag}: a sweep's option, not used by --table {args.table} (which takes the scenario's "
                         "own nodes); expected --table with --set, --strategy, --out")


def _init_worker(spec) -> None:
    kind_tables(spec)  # built here first: a GPU type that cannot hold the batch is refused in the parent
    sweep_drift(spec)  # and --drift parsed: a bad event is refused in the parent too
    _WORKER["spec"] = spec


def _quiet_worker() -> None:
    """Pool workers leave Ctrl-C to the parent (one line there, no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _lock(out: Path):
    """An exclusive lock on DIR/.sweep.lock (waited for), removed with release()."""
    def say():
        print(f"geodt sweep: another sweep is writing {out}; waiting for it", file=sys.stderr)

    return FileLock(out / ".sweep.lock", wait=True, on_wait=say)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _finished(out: Path) -> list[Path] | None:
    """The dataset's parts if it is whole (every digest in sweep.sha256 matches); None if absent
    or cut short."""
    manifest = out / "sweep.sha256"
    if not manifest.exists():
        return None
    try:
        lines = [line.split() for line in manifest.read_text().splitlines()]
        parts = [out / name for _, name in lines]
        whole = bool(lines) and all(_digest(p.read_bytes()) == want for (want, _), p in zip(lines, parts))
    except (OSError, ValueError, UnicodeDecodeError):
        whole = False
    if not whole:
        print(f"geodt sweep: {out / 'sweep'}: incomplete or altered (a digest does not match "
              f"{manifest.name}); redoing it", file=sys.stderr)
        return None
    return parts


def _run_chunk(job) -> tuple[int, int]:
    index, first, kinds, bw, path = job
    write_bytes(Path(path), chunk_bytes(_WORKER["spec"], first, kinds, bw))
    return index, len(kinds)


def _spec_from_args(args, strategies):
    types = tuple(t.strip() for t in args.gpu_types.split(","))
    if not all(types):
        raise InputError(f"--gpu-types {args.gpu_types}: expected catalog keys separated by commas, none empty")
    for key in types:
        try:
            get_gpu(key)
        except CatalogError as exc:
            raise InputError(f"--gpu-types {key}: {exc}") from None
    if len(set(types)) != len(types):
        raise InputError(f"--gpu-types {args.gpu_types}: expected each GPU type once")
    # Sizes that would enumerate or allocate without end are refused before anything is built.
    if args.nodes > MAX_NODES:
        raise InputError(f"--nodes {args.nodes}: expected at most {MAX_NODES} nodes per scenario")
    if args.gpus_per_node > MAX_GPUS_PER_NODE:
        raise InputError(f"--gpus-per-node {args.gpus_per_node}: expected at most {MAX_GPUS_PER_NODE}")
    kinds = math.comb(len(types) + args.gpus_per_node - 1, args.gpus_per_node) if args.mixed_nodes else len(types)
    if kinds > MAX_KINDS:
        raise InputError(f"--mixed-nodes: {len(types)} GPU types x {args.gpus_per_node} GPUs per node make {kinds} "
                         f"node kinds; expected at most {MAX_KINDS} (fewer types or GPUs per node)")
    if args.samples > MAX_SAMPLES:
        raise InputError(f"--samples {args.samples}: expected at most {MAX_SAMPLES}")
    if args.samples * args.nodes > MAX_SAMPLES * 4:
        raise InputError(f"--samples {args.samples} x --nodes {args.nodes}: expected at most {MAX_SAMPLES * 4} "
                         "nodes in all")
    return SweepSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, gpu_types=types,
                     mixed_nodes=args.mixed_nodes, bandwidths_gbps=tuple(args.bandwidth_gbps),
                     strategies=tuple(strategies), samples=args.samples, seed=args.seed,
                     base=args.base, overrides=tuple(args.overrides), drift=args.drift)


def claim(out: Path, command: str, force: bool) -> None:
    """InputError (one line) when --out holds another command's outputs (formats/owners.py)."""
    why = check_owner(out, command, force)
    if why is not None:
        raise InputError(why)


def _sweep(args, strategies, out: Path) -> int:
    spec = _spec_from_args(args, strategies)
    base = load_scenario(spec.base, spec.overrides)
    if base.simulation.jitter_cv != 0:
        raise InputError(f"{spec.base}: simulation.jitter_cv: expected 0 for a sweep (the fast path is deterministic)")
    check_sweep_work(args, spec, base)
    if base.training.target_loss is not None:  # a target beyond the curve, refused before spec.json and parts exist

        loss_setup(base, nodes=spec.nodes)
    _init_worker(spec)  # here first: a GPU type that cannot hold the batch is refused before anything is written
    if args.scheduler:  # reached before anything is written (an unreachable one leaves no directory)

        args.scheduler = connect(args.scheduler)
    claim(out, "sweep", args.force)
    try:
        check_writable(out)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write there ({exc.strerror or exc}); "
                         "expected a writable directory") from None
    lock = _lock(out)
    try:
        remove_orphan_temps(out)  # the stages of a sweep that was killed (SIGKILL: up to the size of sweep.csv)
        spec_path = out / "spec.json"
        if spec_path.exists() and spec_path.read_text() != spec.to_json():
            raise InputError(f"--out {out}: holds a sweep with other arguments ({spec_path}); "
                             "expected a new or matching directory")
        write_text(spec_path, spec.to_json())
        finished = _finished(out)
        if finished is not None:  # a finished sweep of these arguments: nothing to redo
            print(f"{out}/sweep: finished earlier with these arguments; nothing redone", file=sys.stderr)
            return _finish(args, finished, base, out, write=False)
        parts = _run_chunks(args, spec, strategies, out)
        return _finish(args, _publish(parts, out), base, out, write=True)
    finally:
        lock.release()
        if args.scheduler:
            args.scheduler.close()


def check_sweep_work(args, spec, base) -> None:
    """formats.limits.check_work for a sweep, before anything is written. Of a sweep's strategies only
    streaming's work grows with the rounds (its fragment-sync recurrence, over up to 16 fragments a
    round); a chunk of scenarios runs it at once, so it counts chunks x rounds x nodes x (1 + 16),
    bounded by formats.limits' SWEEP_STEPS (measured there)."""
    if "streaming" not in spec.strategies:
        return
    chunks = -(-len(scenario_grid(spec, len(node_kinds(spec)))[0]) // args.chunk)
    why = refused({"streaming": chunks * base.training.rounds * args.nodes * (1 + max(FRAGMENT_CHOICES))},
                  args.large, unit="fragment-sync steps (chunks x rounds x nodes x 17)",
                  limits=(SWEEP_STEPS, SWEEP_STEPS_LARGE), duration="about ten minutes")
    if why is not None:
        raise InputError(f"{spec.base}: {why}")


def _publish(parts: list[Path], out: Path) -> list[Path]:
    """The finished parts become the dataset DIR/sweep/ (its folder renamed), then sweep.sha256."""
    manifest = "".join(f"{_digest(p.read_bytes())}  sweep/part-{k:05d}.parquet\n" for k, p in enumerate(parts))
    (out / "sweep.sha256").unlink(missing_ok=True)  # from here until it is rewritten, not finished
    shutil.rmtree(out / "sweep", ignore_errors=True)
    (out / "sweep").mkdir()
    for k, p in enumerate(parts):
        os.replace(p, out / "sweep" / f"part-{k:05d}.parquet")
    shutil.rmtree(parts[0].parent, ignore_errors=True)
    write_text(out / "sweep.sha256", manifest)
    return [out / "sweep" / f"part-{k:05d}.parquet" for k in range(len(parts))]


def _current_part(path: Path) -> bool:
    """Whether a kept part has this version's columns: one an older geodt left (before sweep.csv's
    `comparable`) is redone, not mixed with newer parts into a dataset of two schemas."""
    try:
        return COMPARABLE in pq.read_schema(path).names
    except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError: a part cut short
        return False


def _run_chunks(args, spec, strategies, out: Path):
    kinds = node_kinds(spec)
    grid_kinds, grid_bw = scenario_grid(spec, len(kinds))
    parts = out / f"parts-chunk{args.chunk}"  # a chunk size of its own: a rerun with another --chunk redoes all
    parts.mkdir(exist_ok=True)
    jobs, done = [], 0
    chunk = args.chunk
    for index, first in enumerate(range(0, len(grid_kinds), chunk)):
        path = parts / f"chunk-{index:05d}.parquet"
        size = min(chunk, len(grid_kinds) - first)
        if path.exists() and _current_part(path):
            done += size
            continue
        jobs.append((index, first, grid_kinds[first:first + chunk], grid_bw[first:first + chunk], str(path)))
    print(f"{describe_grid(spec, len(kinds))}; x {len(strategies)} strategies; {done} already done", file=sys.stderr)
    with tqdm(total=len(grid_kinds), initial=done, unit="scenario", desc="geodt sweep") as bar:
        if jobs and args.scheduler:
            run_on_cluster(args.scheduler, spec, jobs, bar.update, args.worker_timeout_s or WORKER_TIMEOUT_S)
        elif jobs and args.workers > 1 and len(jobs) > 1:
            with multiprocessing.get_context("fork").Pool(min(args.workers, len(jobs)), _quiet_worker) as pool:
                for _, size in pool.imap_unordered(_run_chunk, jobs):
                    bar.update(size)
        elif jobs:
            for job in jobs:
                bar.update(_run_chunk(job)[1])
    chunks = [parts / f"chunk-{index:05d}.parquet" for index in range(-(-len(grid_kinds) // chunk))]

    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in chunks)
    if rows != len(grid_kinds) * len(strategies):  # a part cut short: redo it on the next run
        raise RuntimeError(f"{parts}: {rows} rows; expected {len(grid_kinds) * len(strategies)}")
    return chunks


def _csv_into(stage, parts: list[Path]) -> bytes:
    """sweep.csv written part by part into the stage (the bytes of csv_bytes of the whole table);
    its digest line."""
    digest = hashlib.sha256()
    with stage.open("sweep.csv") as handle:
        for k, path in enumerate(parts):
            data = csv_bytes(read_part(path))
            data = data if k == 0 else data[data.index(b"\n") + 1:]
            digest.update(data)
            handle.write(data)
    return f"{digest.hexdigest()}  sweep.csv\n".encode()


def _finish(args, parts: list[Path], base, out: Path, write: bool) -> int:
    stats = SweepStats.from_parts(parts)
    files = {"scenario.toml": base.to_toml().encode()}
    if not args.no_figures:
        stage = Path(tempfile.mkdtemp(prefix=temp_prefix("figures"), suffix=TEMP_SUFFIX, dir=out))
        try:
            for path in write_figures(stats, stage):
                files[path.name] = path.read_bytes()
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    names = [*(["sweep.csv", "sweep.csv.sha256"] if args.csv else []), *files]
    try:
        with StagedOutput(out, names, owned=()) as stage:
            if args.csv:
                files["sweep.csv.sha256"] = _csv_into(stage, parts)
            for name, data in files.items():
                with stage.open(name) as handle:
                    handle.write(data)
            stage.commit()
    except OutputError as exc:
        raise InputError(f"--out {out}: {exc}") from None
    for name in files:
        if name.endswith(".png"):
            print(f"wrote {out / name}", file=sys.stderr)
    rows = sum(len(v) for v in stats.idle_left.values())
    print(f"{'wrote' if write else 'kept'} {out}/sweep ({rows} rows in {len(parts)} Parquet parts)"
          + (f" and {out}/sweep.csv" if args.csv else ""))

    print("\n" + findings_text(stats))
    return 0


def _table(args, strategies, out: Path | None) -> int:
    scenario = load_scenario(args.table, args.overrides)
    check_work(scenario, args.table, list(dict.fromkeys(["baseline", *strategies])), args.large)
    out = out or default_out(scenario.name, "table")
    claim(out, "table", args.force)
    try:
        plans = [make_plan(scenario, s) for s in ["baseline", *[s for s in strategies if s != "baseline"]]]
    except FieldError as exc:
        raise InputError(f"{args.table}: {exc.key}: {exc.expected}") from None
    timelines = [simulate(scenario, plan, "simpy") for plan in plans]
    table = with_comparable(table_frame(scenario, plans, timelines), plans, timelines)
    if scenario.training.target_loss is not None:  # the loss model's columns, as geodt simulate's summary

        setup = loss_setup(scenario)
        preds = [predict(setup, scenario, p, plan_rounds(p, t)) for p, t in zip(plans, timelines)]
        table["loss_end"] = [pr["loss_end"] for pr in preds]
        table["time_to_target_s"] = [pr["time_to_target_s"] for pr in preds]
    table = table[table["strategy"].isin(strategies)].reset_index(drop=True)
    markdown = format_markdown(scenario, table, _table_other_work())
    files = {"table.csv": csv_bytes(table), "table.md": markdown.encode(),
             "plan.csv": csv_bytes(pd.concat([p.to_frame(scenario) for p in plans], ignore_index=True)),
             "summary.csv": csv_bytes(pd.concat([summary(t, p) for t, p in zip(timelines, plans)], ignore_index=True)),
             "scenario.toml": scenario.to_toml().encode()}
    try:
        stale = write_output_set(out, files)
    except OutputError as exc:
        raise InputError(f"--out {out}: {exc}") from None
    print(markdown)
    print(f"wrote {out}/" + (f" (removed {', '.join(stale)} of an earlier command)" if stale else ""))
    return 0


def with_comparable(table, plans, timelines):
    """table.csv with `comparable` after speedup: whether each strategy does the baseline's work, by
    simulator/outputs/report.py's rule (`geodt simulate` marks the others *) on the whole run's tokens (not
    tokens_vs_baseline's per round: sync-ddp's round is one step of the same total work); plans[0]: the baseline."""
    tokens = np.array([timeline_metrics(p, t)["tokens"] for p, t in zip(plans, timelines)], dtype=float)
    table.insert(table.columns.get_loc("speedup") + 1, "comparable", does_baseline_work(tokens / tokens[0]))
    return table


def _table_other_work() -> str:
    return (f"*: other work: the run trains on tokens beyond ±{TOKENS_BAND:.0%} of the baseline's (table.csv's "
            "comparable false, as geodt simulate marks it), so its speed-up is not like for like.")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    try:
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # usage errors (one line, status 2) and --help (0) become return codes
        return int(exc.code or 0)
    strategies = list(dict.fromkeys(args.strategy or list(STRATEGIES)))
    args.overrides = [*args.overrides, *key_overrides(args)]  # so the spec (and a resume) records them
    try:
        check_table_options(args, p)
        for name in strategies:
            if name in BARRIERLESS:  # timed by the barrier's arithmetic here
                raise InputError(f"--strategy {name}: a strategy without a barrier; geodt sweep times barrier rounds "
                                 f"only: expected one of {', '.join(STRATEGIES)} (geodt simulate --strategy {name})")
            if name not in STRATEGIES:
                raise InputError(f"--strategy {name}: unknown strategy; expected one of {', '.join(STRATEGIES)}"
                                 f"{did_you_mean(name, STRATEGIES)}")
        if args.table:
            return _table(args, strategies, Path(args.out) if args.out else None)
        if not args.out:  # a sweep resumes from its directory: the user names it
            raise InputError("--out: expected an output directory for the sweep (it resumes from there)")
        return _sweep(args, strategies, Path(args.out))
    except InputError as exc:
        print(f"geodt sweep: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        if not isinstance(exc, ClusterLost):
            raise
        print(f"geodt sweep: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # stdout's reader went away (| head): geodt.cli ends quietly, not a disk's error
        raise
    except OSError as exc:  # a full disk, a quota, a read-only file system met while writing

        print(f"geodt sweep: {write_error(args.out, exc, 'finished chunks are kept (each written whole)')}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"geodt sweep: interrupted; finished chunks are kept in {args.out}; rerun the same command "
              "to resume", file=sys.stderr)
        return 130
