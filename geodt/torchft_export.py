"""`geodt plan SCENARIO --strategy S --export torchft DIR`: a plan, launched on torchft's own DiLoCo.

`geodt plan` writes DIR/plan.csv and DIR/scenario.toml as it does for --out DIR (the plan file is the
contract); this module then reads them back and writes, beside them (torch-free, nothing runs):

- replica-<node>.toml, one per replica group (a plan node): torchft's settings, each value commented
  with where it came from: sync_every (the plan's H_i), the batch (G devices as G accumulated
  micro-batches in one process), Streaming DiLoCo's num_fragments / fragment_sync_delay /
  fragment_update_alpha / should_quantize, the outer optimizer, the lighthouse and replica id, and
  the timeouts derived from the prediction (`timeouts`).
- replica-<node>.sh (runs that replica group), lighthouse.sh (torchft_lighthouse with the derived
  quorum settings) and run_all.sh (the lighthouse and every replica on this machine; stops the
  lighthouse when the replicas end). Every value in them is quoted with shlex.
- train_torchft.py and torchft_recorder.py (copies of train/torchft_train.py and
  train/torchft_recorder.py): the training script imports nothing of geodt; the recorder writes
  DIR/traces/<node>.csv, so `geodt validate --trace DIR` compares the run with this plan.

--emulate [--time-scale X] adds each replica's [emulate] section: steps padded to the plan's step_s and
syncs to its comm_s (× X), a schedule check as `geodt run --emulate` is.

A strategy with no torchft form is refused in one line naming it (NO_TORCHFT_FORM), before anything
is written; so is a plan torchft cannot hold (a collective, averaging or fragment split it lacks).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import tempfile
from pathlib import Path

import pandas as pd

from facts.presets import load_arch
from formats.cli import OneLineParser
from formats.errors import InputError
from formats.owners import check_marked_owner
from formats.plan import load_plan
from geodt.validation import predicted_timeline
from simulator.cli import plan_main
from simulator.models.outage import fetch_s
from simulator.models.provenance import with_provenance
from simulator.outputs.outputs import OutputError, write_output_set
from simulator.scenario import load_scenario

# strategy -> why torchft's DiLoCo (one fixed sync_every per replica, a synchronous quorum) cannot run it
NO_TORCHFT_FORM = {
    "deadline": "its rounds end at a deadline (inner steps cut by time); torchft's sync_every is a fixed step count",
    "rebalance": "it re-plans H_i every round from the last round's steps; torchft's sync_every is fixed",
    "quorum": "its rounds close on half the nodes plus a grace window; torchft's DiLoCo quorum waits for every "
              "live replica",
    "async": "it has no barrier (a parameter server); torchft's DiLoCo syncs every replica together",
    "sync-ddp": "it all-reduces gradients every step: torchft's DDP, not its DiLoCo",
}
DEFAULT_LIGHTHOUSE = "127.0.0.1:29510"  # loopback by default; torchft's own default port
FLOOR_S = 5.0  # no timeout below it: a loaded host's hiccup is not a stopped replica (real rounds are minutes)
CONNECT_TIMEOUT_S = 60.0  # torchft's default: connecting is not predicted
STARTUP_TIMEOUT_S = 600.0  # the first quorum waits for every process to start and build its model
HEARTBEAT_TIMEOUT_MS = 5000  # torchft's default: how long a silent replica stays in the lighthouse's view
EXPORT_MARK = "geodt plan --export torchft"  # in the first lines of every file the export writes
SCRIPT_FILES = {"train_torchft.py": "torchft_train.py", "torchft_recorder.py": "torchft_recorder.py"}


def wants_export(argv: list[str]) -> bool:
    return any(a == "--export" or a.startswith("--export=") for a in argv)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="geodt plan --export", add_help=False)
    parser.add_argument("--export", nargs=2, metavar=("FORMAT", "DIR"), required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--emulate", action="store_true",
                        help="pad steps and syncs to the plan's times (a schedule check)")
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="X")
    parser.add_argument("--lighthouse", default=DEFAULT_LIGHTHOUSE, metavar="HOST:PORT")
    parser.add_argument("--out")
    return parser


def refusal(strategy: str) -> str | None:
    """The one line that refuses a strategy with no torchft form, or None."""
    why = NO_TORCHFT_FORM.get(strategy)
    return None if why is None else f"--export torchft: strategy {strategy} has no torchft form: {why}"


def plan_export_main(argv: list[str]) -> int:
    """geodt plan ... --export torchft DIR: plan (simulator.cli.plan_main), then export; 0, or 2 with one line.
    The plan is made once in a temporary folder first, so that a plan torchft cannot hold is refused
    before anything is written into DIR."""
    args, rest = _parser().parse_known_args(argv)
    fmt, out = args.export
    problem = (f"--export {fmt}: unknown format; expected torchft" if fmt != "torchft" else
               "--out: --export's DIR is the output folder; drop --out" if args.out else
               f"--time-scale {args.time_scale}: expected a finite positive number"
               if not 0 < args.time_scale < float("inf") else
               f"--lighthouse {args.lighthouse}: expected HOST:PORT" if not _host_port(args.lighthouse) else
               refusal(args.strategy))
    if problem:
        print(f"geodt plan: {problem}", file=sys.stderr)
        return 2
    settings = (args.emulate, args.time_scale, args.lighthouse)
    with tempfile.TemporaryDirectory(prefix="geodt-export-") as tmp:
        with contextlib.redirect_stdout(io.StringIO()):
            status = plan_main([*rest, "--strategy", args.strategy, "--out", tmp])
        if status != 0:
            return status
        files = export_files(Path(tmp), *settings)
    if isinstance(files, str):
        print(f"geodt plan: --export torchft: {files}", file=sys.stderr)
        return 2
    # the launch files' names are common ones (run_all.sh): a user's own are never replaced unasked
    problem = check_marked_owner(out, files, EXPORT_MARK, "geodt plan --export torchft", "--force" in rest)
    if problem:
        print(f"geodt plan: {problem}", file=sys.stderr)
        return 2
    status = plan_main([*rest, "--strategy", args.strategy, "--out", out])
    return status if status != 0 else export_dir(Path(out), *settings)


def _host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def export_files(out: Path, emulate: bool, time_scale: float, lighthouse: str) -> dict[str, bytes] | str:
    """The launch files for out/plan.csv and out/scenario.toml (name -> bytes), or why not (one line)."""
    try:
        scenario = load_scenario(str(out / "scenario.toml"))
        plan = load_plan(out / "plan.csv", seq_len=scenario.model.seq_len)
        check_plan(scenario, plan)
        derived = timeouts(scenario, plan, time_scale if emulate else 1.0)
        return launch_files(scenario, plan, derived, emulate, time_scale, lighthouse)
    except (InputError, OSError) as exc:
        return str(exc)


def export_dir(out: Path, emulate: bool, time_scale: float, lighthouse: str) -> int:
    """Read out/plan.csv and out/scenario.toml, write the launch files beside them; 0, or 2 with one line."""

    files = export_files(out, emulate, time_scale, lighthouse)
    try:
        if isinstance(files, str):
            raise OutputError(files)
        write_output_set(out, files, owned=())
        for name in files:
            if name.endswith(".sh"):
                (out / name).chmod(0o755)
    except (OutputError, OSError) as exc:
        print(f"geodt plan: --export torchft: {exc}", file=sys.stderr)
        return 2
    print(f"exported for torchft into {out}/: {', '.join(files)}\n"
          f"run it: {shlex.quote(str(out / 'run_all.sh'))}; then: geodt validate --trace {shlex.quote(str(out))}")
    return 0


def check_plan(scenario, plan) -> None:
    """InputError (one line naming the key) for what torchft's DiLoCo cannot hold."""
    why = refusal(plan.strategy)
    sync, adapt = plan.sync or "diloco", plan.adapt or "none"
    collective = plan.settings_from(scenario).collective
    if why is None and not plan.round_kind.supports("torchft"):
        why = f"sync {sync}: torchft's DiLoCo syncs pseudo-gradients of every replica (sync diloco)"
    if why is None and adapt != "none":
        why = f"adapt {adapt}: the rounds re-plan themselves; torchft's sync_every is fixed"
    if why is None and collective != "ring":
        why = f"collective {collective}: torchft all-reduces with its process group's own (a ring on gloo and NCCL)"
    if why is None and scenario.diloco.averaging != "uniform":
        why = f"[diloco] averaging {scenario.diloco.averaging}: torchft averages pseudo-gradients uniformly"
    if why is None and not scenario.model.preset:
        why = "[model] preset: the training script builds its model from a preset (or a config.json)"
    if why is None and plan.fragment_pattern != "sequential":
        why = f"fragment_pattern {plan.fragment_pattern}: torchft syncs fragments in order"
    for node in plan.nodes if why is None else ():
        if node.local_steps % plan.fragments or plan.sync_delay_steps >= node.local_steps // plan.fragments:
            why = (f"node {node.node}: local_steps {node.local_steps} with fragments {plan.fragments} and "
                   f"sync_delay_steps {plan.sync_delay_steps}: torchft needs sync_every a multiple of num_fragments "
                   "and fragment_sync_delay < sync_every / num_fragments")
            break
    if why is not None:
        raise InputError(f"plan {plan.strategy}: {why}")


def timeouts(scenario, plan, scale: float = 1.0) -> dict:
    """What the prediction says about time (seconds, × scale: an emulated run's time scale): the slowest
    replica's round, its band, the round at the band's edge, a rejoin's cost, and torchft's timeouts and
    lighthouse settings derived from them."""
    timeline = predicted_timeline(scenario, plan, "analytic")
    timeline = timeline.assign(round_s=timeline["compute_s"] + timeline["idle_s"] + timeline["comm_s"])
    round_s = scale * float(timeline.groupby("round")["round_s"].max().max())
    per_node = timeline.groupby("node", sort=False)[["compute_s", "comm_s"]].sum().reset_index()
    band_pct = float(with_provenance(pd.DataFrame(per_node), scenario)["error_band_pct"].iloc[0])
    edge_s = round_s * (1 + band_pct / 100)
    fetch = scale * max(fetch_s(scenario, plan, i) for i in range(len(plan.nodes)))
    rejoin_s = scale * scenario.simulation.restart_s + fetch
    comm_edge_s = scale * plan.comm_s * (1 + band_pct / 100)
    return {
        "scale": scale, "round_s": round_s, "band_pct": band_pct, "edge_s": edge_s, "fetch_s": fetch,
        "rejoin_s": rejoin_s, "comm_edge_s": comm_edge_s,
        "quorum_timeout_s": max(FLOOR_S, edge_s + rejoin_s),
        "timeout_s": max(FLOOR_S, comm_edge_s, fetch * (1 + band_pct / 100)),
        "join_timeout_ms": round(1000 * edge_s),
        "quorum_tick_ms": int(min(100, max(1, round(10 * round_s)))),  # 1% of the round, 1 to 100 ms
        "min_replicas": len(plan.nodes) if scenario.simulation.on_node_loss == "stop" else 1,
    }


def _s(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


def _how(t: dict) -> str:
    scaled = f" × time scale {t['scale']:g}" if t["scale"] != 1 else ""
    return (f"the slowest replica's predicted round {t['round_s']:.3f} s{scaled} + the band "
            f"{t['band_pct']:.1f}% = {t['edge_s']:.3f} s")


def replica_toml(scenario, plan, i: int, t: dict, emulate: bool, time_scale: float, lighthouse: str) -> str:
    """replica-<node>.toml: every torchft setting of replica group i, with where it came from."""
    node, d, m = plan.nodes[i], scenario.diloco, scenario.model
    arch = load_arch(m.preset) if m.preset else None
    run = plan.settings_from(scenario)  # what the plan leaves open, the scenario's
    quantize = run.payload_dtype != "fp32"
    lines = [
        f"# replica group {node.node} of plan {plan.strategy} (plan.csv beside this file), scenario {scenario.name}",
        "# written by geodt plan --export torchft; train_torchft.py reads it",
        "", "[replica]",
        f"node = {_s(node.node)}  # plan.csv node",
        f"index = {i}  # its row in plan.csv (seeds its data)",
        f"replica_id = {_s(node.node)}  # torchft replica_id: the lighthouse's name for the group",
        (f"host = {_s(lighthouse.rpartition(':')[0])}  # this group's TCPStore and advertised address "
         "(loopback by default; --lighthouse HOST:PORT)"),
        "", "[lighthouse]",
        f"address = {_s('http://' + lighthouse)}  # lighthouse.sh binds it",
        f"min_replicas = {t['min_replicas']}  # [simulation] on_node_loss = {scenario.simulation.on_node_loss}: "
        + ("every replica or none (stop)" if t["min_replicas"] > 1 else "the others go on (continue)"),
        "", "[diloco]",
        f"sync_every = {node.local_steps}  # the plan's H_i (local_steps)",
        f"num_fragments = {plan.fragments}  # the plan's fragments (Streaming DiLoCo's P)",
        f"fragment_sync_delay = {plan.sync_delay_steps}  # the plan's sync_delay_steps (τ)",
        f"fragment_update_alpha = {plan.fragment_alpha!r}  # the plan's fragment_alpha (α)",
        f"should_quantize = {'true' if quantize else 'false'}  # the plan's payload_dtype "
        f"{run.payload_dtype}"
        + (" (torchft quantizes with its own kernel, not geodt's encoding)" if quantize else ""),
        f"outer_lr = {d.outer_lr!r}  # [diloco] outer_lr (outer SGD, Nesterov)",
        f"outer_momentum = {d.outer_momentum!r}  # [diloco] outer_momentum",
        f"inner_lr = {d.inner_lr!r}  # [diloco] inner_lr (AdamW)",
        f"weight_decay = {d.weight_decay!r}  # [diloco] weight_decay",
        f"betas = [{d.betas[0]!r}, {d.betas[1]!r}]  # [diloco] betas",
        f"warmup_steps = {d.warmup_steps}  # [diloco] warmup_steps (linear, then constant)",
        "", "[batch]",
        f"batch_size = {node.batch_size}  # the plan's batch_size (per device)",
        f"grad_accum = {node.gpus}  # the node's {node.gpus} device(s) as accumulated micro-batches in one process",
        "", "[model]  # [model] " + (f"preset {m.preset}" if arch else "(a preset is needed to build it)"),
    ]
    lines += _model_and_run_lines(scenario, plan, run, arch, t)
    if emulate:
        lines += ["", "[emulate]  # a schedule check: steps and syncs padded to the plan's times",
                  f"step_s = {node.step_s!r}  # the plan's step_s", f"comm_s = {plan.comm_s!r}  # the plan's comm_s",
                  f"time_scale = {time_scale!r}  # --time-scale"]
    return "\n".join(lines) + "\n"


def _model_and_run_lines(scenario, plan, run, arch, t: dict) -> list[str]:
    """replica-<node>.toml's [model] keys, [timeouts] and [run]."""
    m, lines = scenario.model, []
    if arch is not None:
        lines += [f"{k} = {getattr(arch, k)!r}  # the preset's {k}".replace("True", "true").replace("False", "false")
                  for k in ("vocab_size", "hidden_size", "ffn_size", "num_layers", "num_heads", "num_kv_heads",
                            "tie_embeddings", "rope_theta")]
    lines += [f"seq_len = {m.seq_len}  # [model] seq_len", "", "[timeouts]  # seconds; " + _how(t),
              (f"quorum_timeout_s = {t['quorum_timeout_s']:.3f}  # the round at the band's edge + a rejoin's "
               f"predicted cost {t['rejoin_s']:.3f} s ([simulation] restart_s + the weights' fetch); "
               f"at least {FLOOR_S:g}"),
              (f"timeout_s = {t['timeout_s']:.3f}  # collectives and should_commit: the sync at the band's edge "
               f"{t['comm_edge_s']:.3f} s, a recovery's fetch {t['fetch_s']:.3f} s; at least {FLOOR_S:g}"),
              f"process_group_timeout_s = {t['timeout_s']:.3f}  # gloo's operations: as timeout_s",
              f"connect_timeout_s = {CONNECT_TIMEOUT_S:g}  # torchft's default (connecting is not predicted)",
              f"startup_timeout_s = {STARTUP_TIMEOUT_S:g}  # the first quorum: processes start and build the model",
              "", "[run]",
              f"rounds = {run.rounds}  # the plan's rounds",
              f"seed = {scenario.seed}  # the scenario's seed: every replica starts from the same weights",
              "threads = 1  # torch threads per replica",
              f"strategy = {_s(plan.strategy)}  # the trace's strategy column",
              'run_dir = "."  # traces/<node>.csv go here (beside plan.csv: geodt validate --trace DIR)']
    return lines


def lighthouse_sh(t: dict, lighthouse: str) -> str:
    args = ["torchft_lighthouse", "--bind", lighthouse, "--min_replicas", str(t["min_replicas"]),
            "--join_timeout_ms", str(t["join_timeout_ms"]), "--quorum_tick_ms", str(t["quorum_tick_ms"]),
            "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS)]
    return "\n".join([
        "#!/bin/sh", "# torchft's lighthouse for this plan (geodt plan --export torchft).",
        f"# join_timeout_ms: how long a quorum waits for a live straggler: {_how(t)}",
        "# quorum_tick_ms: 1% of the predicted round (1 to 100 ms): each quorum's wait rounds up to a tick",
        "# heartbeat_timeout_ms: torchft's default; a stopped replica leaves the quorum after it",
        f"exec {shlex.join(args)}", ""])


def replica_sh(node: str) -> str:
    return "\n".join([
        "#!/bin/sh", f"# replica group {node}: torchft's DiLoCo with replica-{node}.toml (run lighthouse.sh first)",
        f"# written by {EXPORT_MARK}",
        'cd "$(dirname "$0")" || exit 2',
        f'exec "${{PYTHON:-python}}" train_torchft.py {shlex.quote(f"replica-{node}.toml")} "$@"', ""])


def run_all_sh(plan) -> str:
    starts = [f"./{shlex.quote(f'replica-{n.node}.sh')} & pids=\"$pids $!\"" for n in plan.nodes]
    return "\n".join([
        "#!/bin/sh", "# the lighthouse and every replica group on this machine; the lighthouse stops with them",
        f"# written by {EXPORT_MARK}",
        'cd "$(dirname "$0")" || exit 2',
        "./lighthouse.sh & lighthouse=$!",
        "trap 'kill $lighthouse 2>/dev/null' EXIT INT TERM",
        "sleep 1  # the lighthouse binds before the replicas ask it for a quorum",
        'pids=""', *starts,
        "status=0",
        'for pid in $pids; do wait "$pid" || status=1; done',
        'exit "$status"', ""])


def launch_files(scenario, plan, t: dict, emulate: bool, time_scale: float, lighthouse: str) -> dict[str, bytes]:
    """Every exported file, name -> bytes (written as one set)."""
    here = Path(__file__).resolve().parents[1] / "train"
    files = {name: (here / source).read_bytes() for name, source in SCRIPT_FILES.items()}
    files["lighthouse.sh"] = lighthouse_sh(t, lighthouse).encode()
    for i, node in enumerate(plan.nodes):
        files[f"replica-{node.node}.toml"] = replica_toml(scenario, plan, i, t, emulate, time_scale,
                                                          lighthouse).encode()
        files[f"replica-{node.node}.sh"] = replica_sh(node.node).encode()
    files["run_all.sh"] = run_all_sh(plan).encode()
    return files
