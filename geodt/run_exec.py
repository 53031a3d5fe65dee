"""`geodt run` and `geodt validate` once their parser is past: the plan checked by the executor, run, compared.

geodt/run_cmd.py (the commands' parsers and entry points) imports this module after parsing, so
that `geodt run --help` reads without torch; this one imports the executor (real/) and torch at
its top. What the commands do is run_cmd.py's docstring.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from formats.cli import key_overrides
from formats.errors import InputError
from formats.owners import check_owner
from geodt.preflight import PreflightError, available_cores, check_host, check_machine, this_machine
from geodt.validation import predicted_timeline, report
from real.checkpoint.ckpt_set import run_identity, verify
from real.core.config import ConfigError
from real.core.data import STDLIB_CORPUS, corpus_digest
from real.core.options import run_config
from real.process.cli import exec_options
from real.process.launch import LaunchError, check_disk_space, check_inputs, launch, saved_checkpoints
from real.process.outdir import OutDirError, take_lock
from real.rounds.trace import membership_lines, summary
from real.wan.wan import network_note
from simulator.cli import check_work, default_out
from simulator.models.drift import drift_factors
from simulator.models.loss_prediction import loss_setup
from simulator.models.outage import outages
from simulator.outputs.outputs import OutputError, csv_bytes, write_csv, write_output_set, write_text
from simulator.outputs.perfetto import trace_csv_to_json
from simulator.scenario import load_scenario
from simulator.strategies import make_plan
from train.hoststat import cpu_times, host_share


def prepare(prog: str, args: argparse.Namespace):
    """Scenario + plan (simulator), checked by the executor and against this machine, then written
    into DIR under DIR's run lock.

    Returns (scenario, plan, exec options, machine warnings, the lock: the caller releases it, the
    loss model's setup for validate or None) or an exit status. Nothing is written unless every
    input is good and the directory is this run's.
    """

    try:
        # --checkpoint-every and --target-loss as scenario keys: the simulator prices the checkpoints the
        # run will take, and scenario.toml records both
        scenario = load_scenario(args.scenario, args.overrides + key_overrides(args))
        loss = validate_loss_setup(scenario, args) if prog.endswith("validate") else None
        check_work(scenario, args.scenario, [args.strategy], args.large)
        plan = make_plan(scenario, args.strategy)
        if args.out is None:  # each command its own directory: a run never replaces a validation's trace
            args.out = str(default_out(scenario.name, prog.split()[-1], args.strategy))
        opts = injected_outage(scenario, plan, injected_drift(scenario, plan, exec_options(args, args.out)))
        check_emulated_length(scenario, plan, opts)
    except (InputError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    frame, toml_text = plan.to_frame(scenario), scenario.to_toml()
    with tempfile.TemporaryDirectory(prefix="geodt-run-") as tmp:
        write_csv(frame, Path(tmp) / "plan.csv")
        write_text(Path(tmp) / "scenario.toml", toml_text)
        try:
            spec, real_plan = check_inputs(Path(tmp) / "plan.csv", Path(tmp) / "scenario.toml", opts)
            check_resumable(spec, real_plan, opts)
            check_host(args.host, args.allow_any_host)
            warnings = check_machine(scenario, plan, opts.backend, this_machine())
        except (ConfigError, LaunchError) as exc:  # an option's own error names the option first
            lead = "" if str(exc).startswith("--") else "the executor cannot run this scenario: "
            print(f"{prog}: {lead}{exc}", file=sys.stderr)
            return 2
        except PreflightError as exc:
            print(f"{prog}: this machine cannot hold the run: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out)
    lock = _claim(prog, out, args.force, opts.resume)
    if isinstance(lock, int):
        return lock
    try:  # room for the checkpoints, judged before plan.csv and scenario.toml replace anything
        check_disk_space(spec, real_plan, opts, out)
    except OutDirError as exc:
        lock.release()
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:  # plan.csv and scenario.toml as a set: both or neither (simulator/outputs/outputs.py)
        write_output_set(out, {"plan.csv": csv_bytes(frame), "scenario.toml": toml_text.encode()}, owned=())
    except OutputError as exc:
        lock.release()
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return scenario, plan, opts, warnings, lock, loss


def _claim(prog: str, out: Path, force: bool, resume: bool):
    """DIR's run lock, once DIR may take this run; else the exit status, one line said and nothing
    written: another run holds it (real/process/outdir.py), or it holds another command's outputs or an
    earlier run's checkpoints that this run does not resume (formats/owners.py; --force)."""

    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = take_lock(out)
    except (OSError, OutDirError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    why = check_owner(out, prog.split()[-1], force, checkpoints=bool(saved_checkpoints(out)) and not resume)
    if why is not None:
        lock.release()
        print(f"{prog}: {why}", file=sys.stderr)
        return 2
    return lock


def check_resumable(spec, plan, opts) -> None:
    """--resume: the checkpoints in --out were made by this run's plan and settings (their manifests'
    run_identity, real/checkpoint/checkpoint.py), checked before plan.csv and scenario.toml are replaced; a
    LaunchError naming the first set that differs."""

    if not opts.resume:
        return
    nodes = [(n.node, n.gpus, n.batch_size, n.local_steps) for n in plan.nodes]
    mine = run_identity(run_config(spec, plan, opts), nodes)
    theirs = {}
    for manifest in saved_checkpoints(opts.out_dir):
        try:
            theirs[manifest] = json.loads(manifest.read_text()).get("run_identity")
        except (OSError, ValueError, AttributeError):
            theirs[manifest] = None  # a damaged set: the nodes' own checks name it and fall back
    if theirs and mine not in theirs.values():  # one set of this run is enough: the nodes pick what verifies
        manifest, other = next(iter(theirs.items()))
        differs = differing_setting(manifest.parent, run_config(spec, plan, opts), nodes)
        if differs is not None:
            key, was, now = differs
            raise LaunchError(f"--resume: {manifest.parent}: {key}: the checkpoints were made with {was!r}, this run "
                              f"has {now!r}; expected the scenario, strategy, --set and options of the run being "
                              "resumed (or a new --out)")
        raise LaunchError(f"--resume: {manifest}: run_identity: the checkpoints were made by another plan or "
                          f"settings ({other}, this run is {mine}); expected the scenario, strategy, --set and "
                          f"options of the run being resumed (or a new --out)")


def differing_setting(directory, config: dict, nodes: list) -> tuple[str, object, object] | None:
    """(key, the checkpoint's value, this run's) of the first run setting or plan node that differs
    from the set in `directory` (its node.pt's run_config, read once the set verifies, with
    weights_only and mmap: its tensors stay on disk); None when the set cannot tell (it does not
    verify, or nothing differs: the identity's digest is all there is)."""

    try:
        manifest = verify(directory, int(directory.name.removeprefix("round-")), int(directory.parent.name[4:]))
        state = torch.load(directory / "node.pt", map_location="cpu", weights_only=True, mmap=True)
        saved, index = state["run_config"], int(manifest["node"])
        theirs = (state["node"], state["gpus"], state["batch_size"], state["local_steps"])
    except Exception:  # a damaged or foreign set: the digests are all there is to say
        return None
    for key in sorted(set(saved) | set(config)):
        if saved.get(key) != config.get(key):
            return key, saved.get(key), config.get(key)
    if len(nodes) != state["nodes"]:
        return "nodes", state["nodes"], len(nodes)
    if index < len(nodes) and tuple(nodes[index]) != theirs:
        return (f"plan node {index} (name, devices, batch_size, local_steps)", theirs, tuple(nodes[index]))
    return None


def validate_loss_setup(scenario, args):
    """The loss model for comparing with this run (simulator/models/loss_prediction.py), or None where it has no
    curve of this model on this run's corpus; with a target that is an InputError (one line). With a
    target and no --data, the run trains on the profile's corpus where it is the standard library's
    (args.data set, and said)."""
    setup = loss_setup(scenario)
    if setup.target is not None and args.data is None and setup.same_model and setup.corpus.startswith(STDLIB_CORPUS):
        args.data = STDLIB_CORPUS
        print(f"geodt validate: --target-loss: training on the convergence profile's corpus ({STDLIB_CORPUS}: "
              "the Python standard library's sources as bytes)", file=sys.stderr)
    corpus = corpus_digest(args.data)
    if setup.same_model and corpus == setup.corpus:
        return setup
    if setup.target is None:
        return None
    why = (f"was measured on {setup.corpus} and this run trains on {corpus}; expected --data with its corpus "
           f"(python-stdlib)" if setup.same_model else
           f"trained another model; expected one of {scenario.model.preset or 'this model'} at seq_len "
           f"{scenario.model.seq_len} (geodt calibrate convergence SCENARIO, then training.convergence_profile)")
    raise InputError(f"--target-loss {setup.target:g}: the {setup.profile} convergence profile {why}")


MAX_EMULATED_S = 7 * 86400.0  # --emulate pads steps by sleeping: a week is long past any schedule check


def check_emulated_length(scenario, plan, opts) -> None:
    """InputError (one line) when --emulate's padded steps alone would take longer than MAX_EMULATED_S
    (`--time-scale 1e9` was accepted: a run of years); the rounds times the slowest node's padded
    compute, a floor of the run's length (syncs come on top)."""
    # a kind whose loop pads no step (sync-ddp pads in its gradient hook: real/process/worker.py) is not bounded here
    if not opts.emulate or not plan.round_kind.supports("padded_steps"):
        return
    rounds = plan.settings_from(scenario).rounds
    slowest = max(plan.nodes, key=lambda n: n.local_steps * n.step_s)
    floor_s = rounds * slowest.local_steps * slowest.step_s * opts.time_scale
    if floor_s > MAX_EMULATED_S:
        raise InputError(f"--time-scale {opts.time_scale:g}: the emulated run would take at least {_duration(floor_s)} "
                         f"({rounds} rounds x {slowest.node}'s {slowest.local_steps} steps of {slowest.step_s:.3g} s x "
                         f"{opts.time_scale:g}); expected at most {_duration(MAX_EMULATED_S)}: a smaller --time-scale "
                         "or fewer rounds")


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400.0), ("days", 86400.0), ("hours", 3600.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def injected_drift(scenario, plan, opts):
    """opts with the scenario's drift (simulator/models/drift.py) for the executor to inject, per plan node
    and round: padded steps under --emulate, else a node's CPU quota, so a drifting node needs one."""
    factors = drift_factors(scenario, plan)
    if factors is None:
        return opts
    for i, node in enumerate(plan.nodes):
        if not opts.emulate and node.cpu_quota is None and (factors[:, i] != 1).any():
            raise InputError(f"nodes.{node.node}.drift: a real run injects drift through the node's CPU quota; "
                             "expected cpu_quota on the node, or --emulate")

    def per_node(table):
        return tuple(tuple(float(f) for f in table[:, i]) for i in range(len(plan.nodes)))
    divisors = any(e.cpu_quota_factor is not None for node in scenario.nodes for e in node.drift or ())
    return replace(opts, drift=per_node(factors),
                   drift_quota=per_node(drift_factors(scenario, plan, quota=True)) if divisors else None)


def injected_outage(scenario, plan, opts):
    """opts with the scenario's outages (simulator/models/outage.py) for the executor to inject: the node's
    process SIGKILLs itself at the outage's round and rejoins at round + rounds (real/membership/members.py)."""
    lost = [(i, o) for i, o in outages(scenario, plan) if o.round < scenario.training.rounds]
    if not lost:
        return opts
    name = plan.nodes[lost[0][0]].node
    if scenario.simulation.on_node_loss != "continue" or opts.on_node_loss != "continue":
        raise InputError(f"nodes.{name}.outage: a run injects a node's loss only with simulation.on_node_loss = "
                         f"\"continue\" and --on-node-loss continue (the executor's stop ends the run; --resume "
                         f"continues it); got {scenario.simulation.on_node_loss!r} and {opts.on_node_loss}")
    return replace(opts, outage=tuple((i, o.round, o.rounds) for i, o in lost))


def announcer(prog: str, scenario, plan, emulate: bool, machine_warnings: list[str] = ()):
    """launch()'s announce: the reproduction warnings, once the inputs are known to be good, and a
    progress line (the processes build the model before the first round's bar appears)."""

    def announce() -> None:
        for warning in [*([] if emulate else machine_warnings), *reproduction_warnings(scenario, plan, emulate)]:
            print(f"{prog}: warning: {warning}", file=sys.stderr, flush=True)
        print(f"{prog}: starting {plan.world_size} process{'es' if plan.world_size != 1 else ''} of "
              f"{scenario.name}/{plan.strategy}, {plan.settings_from(scenario).rounds} rounds "
              f"({'emulated' if emulate else 'measured'}); each builds the model, then the rounds run", flush=True)

    return announce


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


def run(args, prepared) -> int:
    out = Path(args.out)
    opts = replace(prepared[2], summary=False)  # printed below, with what was measured and what emulated
    status = launch(out / "plan.csv", out / "scenario.toml", opts, host=args.host,
                    announce=announcer("geodt run", prepared[0], prepared[1], args.emulate, prepared[3]), lock=False)
    if status == 0:
        print(run_heading(args.emulate, args.time_scale))
        trace = pd.read_csv(out / "trace.csv")
        print(summary(trace))
        print_membership(trace, prepared[1])
        naming(out / "trace.json", trace_csv_to_json, out / "trace.csv", out / "trace.json", args.emulate)

        print(f"geodt run: wrote {out / 'trace.csv'}, {out / 'trace.json'}; network: {network_note(out)}")
    return status


def naming(path: Path, fn, *args):
    """fn(*args), whose OSError (a full disk) names `path` (a failed write() does not say where)."""
    try:
        return fn(*args)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(exc.filename or path)) from None


def run_heading(emulated: bool, time_scale: float) -> str:
    """The line above `geodt run`'s per-node summary: measured, or emulated (and then what that means)."""
    if not emulated:
        return "per node, summed over rounds (measured: every time is this machine's own):"
    scale = f", times x{time_scale:g}" if time_scale != 1.0 else ""
    return (f"per node, summed over rounds (emulated{scale}: each inner step padded to the plan's step_s and "
            "each sync to its comm_s, so these times are the plan's, not this machine's):")


def validate(args, scenario, plan, opts, machine_warnings, loss=None) -> int:
    opts = replace(opts, summary=False)  # validate prints its own table


    out = Path(args.out)
    timeline = predicted_timeline(scenario, plan, args.engine)
    naming(out / "timeline.csv", write_csv, timeline, out / "timeline.csv")
    before = cpu_times()
    status = launch(out / "plan.csv", out / "scenario.toml", opts, host=args.host,
                    announce=announcer("geodt validate", scenario, plan, args.emulate, machine_warnings), lock=False)
    host = host_share(before, cpu_times())
    if status != 0:
        return status
    trace = pd.read_csv(out / "trace.csv")

    caveat = ("; the warnings above say why this machine cannot reproduce the prediction"
              if reproduction_warnings(scenario, plan, args.emulate) else "")
    report("geodt validate", scenario, plan, timeline, trace, out, args.emulate, args.time_scale, network_note(out),
           caveat, wide=args.wide, loss=loss, host=host)
    print_membership(trace, plan)
    return 0


def print_membership(trace, plan) -> None:
    """--on-node-loss continue: who left and rejoined when (real/rounds/trace.py), after the summary."""
    if "members" in trace:
        for line in membership_lines(trace, [node.node for node in plan.nodes]):
            print(line)
