"""`geodt calibrate network --wan shaped --scenario S`: the sync measured on the scenario's own links.

One process per node of the scenario, each in its node's network namespace of a shaped WAN
(real/wan/wan.py: tbf both ways at the node's link_gbps, min(network.bandwidth_gbps, uplink_gbps),
as the simulator's simulator/models/network.link_gbps gives it), runs real/core/sync.py's cross-node
average exactly as the executor's node leaders do (under their CPU limits: cpu_cores,
cpu_quota; between two averages each runs its round, the scenario's H inner steps at its batch,
as between two syncs of a run, and with Streaming DiLoCo its fragment schedule, τ of those steps
beside each average on a communication thread: `between_averages`), for every payload dtype and
collective asked, over
payload sizes from 64 KiB to --max-mib of fp32 pseudo-gradient (×4 per size; with Streaming
DiLoCo one fragment's payload too: `measured_sizes`), and times
encode() / decode() per dtype in the same processes. Rows (formats/netprofile.py):
kind all_reduce, backend `gloo+shaped`, size = the fp32 bytes averaged (4 per parameter,
whatever the dtype on the wire), payload_dtype, collective, node (empty: each repeat's slowest
process; a node's name: its own times); kinds encode / decode as plain
`geodt calibrate network` writes them. Then a table of the measured sync against the
simulator's price for it (wire time + encode/decode from these very rows), signed: by the
byte count; the ratio f the simulator prices each size at once the profile is the scenario's
`network.profile` (simulator/models/network.py WireCost); and the price of each size from the other
sizes' rows alone (a held-out check of the interpolation).

`--profiles-out DIR`: the inner steps each CPU node ran between the averages of the size
nearest the payload of one of its syncs (the model's fp32 payload, or one fragment's), timed one
by one, written as its profile DIR/<node>-0.csv (one row, its batch): its device measured beside
the others as they run in the job. `--plan PLAN.csv`: each node runs the plan's b_i and H_i
(and the plan's P and τ) between averages instead of the scenario's.

Lives in geodt/ because it needs both the scenario's links (simulator) and the executor's
sync (real). Needs root (namespaces, veth, tc): without, one line naming what is missing, exit 2.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from calibrate.profile_writer import write_new_profile
from formats.cli import OneLineParser
from formats.errors import InputError
from formats.files import child_path
from formats.netprofile import SHAPED_BACKEND
from formats.plan import PlanError, load_plan, merge_steps
from formats.wire import COLLECTIVES, PAYLOAD_BYTES
from geodt.calibration.links import (
    add_measure_arguments,
    add_profile_out,
    check_network_out,
    codec_summary,
    sizes_bytes,
)
from real.wan.wan import WanError
from simulator.models.netfit import read_network_profile
from simulator.models.network import CodecCost, WireCost, bytes_s, link_gbps, wire_cost
from simulator.models.timing import node_timings
from simulator.scenario import load_scenario
from train.cpulimit import describe_limits, device_cores


def _choices(allowed):
    def parse(text: str) -> list[str]:
        values = [v for v in text.split(",") if v]
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(allowed)}, got {text!r}")
        return list(dict.fromkeys(values))
    return parse


def parser() -> OneLineParser:
    p = OneLineParser(prog="geodt calibrate network --wan shaped", description=__doc__.splitlines()[0])
    p.add_argument("--network", action="store_true", help=argparse.SUPPRESS)  # the spelling before subcommands
    links = p.add_argument_group("the links")
    links.add_argument("--wan", choices=("shaped",), required=True, help="shaped: the scenario's links (root)")
    links.add_argument("--scenario", required=True, help="a scenario TOML file or a built-in name")
    links.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a scenario key, e.g. network.bandwidth_gbps=0.02 (repeatable)")
    measured = p.add_argument_group("what is measured")
    measured.add_argument("--payload-dtypes", type=_choices(tuple(PAYLOAD_BYTES)), default=list(PAYLOAD_BYTES),
                          help="comma-separated (default fp32,fp16,int8)")
    measured.add_argument("--collectives", type=_choices(COLLECTIVES), default=list(COLLECTIVES),
                          help="comma-separated (default ring,partitioned)")
    add_measure_arguments(measured, max_mib=(1024, 4), repeats=(100, 3), payload="fp32 payload")
    steps = p.add_argument_group("the nodes' own steps between the averages")
    steps.add_argument("--plan", metavar="PLAN.csv",
                       help="between averages each node runs this plan's batch, local steps and fragment schedule "
                            "(default: the scenario's): a plan's own neighbourhood for --profiles-out")
    steps.add_argument("--profiles-out", metavar="DIR",
                       help="also write each CPU node's inner steps, timed between the averages of the size "
                            "nearest its model's payload, as a profile DIR/<node>-0.csv at its batch")
    add_profile_out(p.add_argument_group("where the profile goes"))
    return p


def predicted_s(scenario, model, dtype: str, collective: str, fp32_bytes: float, wire=None) -> float:
    """The simulator's price of one average of fp32_bytes / 4 parameters (no outer step): the
    byte count, or through `wire` (simulator.models.network.WireCost) the links as measured."""
    params = fp32_bytes / 4
    wire_s = (wire or WireCost()).seconds_raw(dtype, collective, bytes_s(scenario, collective, dtype, params))
    return float(wire_s) + float(CodecCost(model.codec).seconds_raw(dtype, collective, params, link_gbps(scenario)))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    prog = "geodt calibrate network --wan shaped"
    out = Path(args.out)

    why = check_network_out(out, args.force)
    if why is not None:
        print(f"{prog}: {why}", file=sys.stderr)
        return 2
    if args.profiles_out is not None and not Path(args.profiles_out).is_dir():
        print(f"{prog}: --profiles-out {args.profiles_out}: expected an existing directory", file=sys.stderr)
        return 2

    try:
        scenario = load_scenario(args.scenario, args.overrides)
    except (InputError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if len(scenario.nodes) < 2:
        print(f"{prog}: {args.scenario}: nodes: expected at least 2 nodes to average between", file=sys.stderr)
        return 2
    plan = None
    if args.plan is not None:
        try:
            plan = load_plan(args.plan, scenario.model.seq_len)
        except (PlanError, OSError) as exc:
            print(f"{prog}: {args.plan}: {exc}", file=sys.stderr)
            return 2
        if [n.node for n in plan.nodes] != [n.name for n in scenario.nodes]:
            print(f"{prog}: {args.plan}: node: expected the scenario's nodes {[n.name for n in scenario.nodes]}, "
                  f"got {[n.node for n in plan.nodes]}", file=sys.stderr)
            return 2
        # The plan's own schedule (the `streaming` strategy picks P and τ): sizes and steps follow it.
        scenario = replace(scenario, diloco=replace(scenario.diloco, fragments=plan.fragments,
                                                    sync_delay_steps=plan.sync_delay_steps))
    nodes = list(zip([n.name for n in scenario.nodes], link_gbps(scenario)))
    return _measure_and_write(args, scenario, nodes, out, between_averages(scenario, plan))


def leader_limits(scenario) -> list[tuple]:
    """Per node, the CPU limits of its leader (device 0) as the executor applies them: (cores, quota)."""
    return [(device_cores(n.cpu_cores, n.gpu_count, 0), n.cpu_quota) for n in scenario.nodes]


def between_averages(scenario, plan=None) -> list[dict]:
    """Per node, what its process runs between two averages of the calibration, as the node runs
    its round between two syncs: its real inner steps (the scenario's model at its batch, H steps,
    or the plan's b_i and H_i; each timed: geodt/calibration/links.py InnerSteps) where the node's device is
    this machine's CPU, else a busy loop for H × its step time (a GPU node planned here).

    Why real steps: this machine emulates a scenario's devices on two shared cores, and a device's
    step then depends on what the others run beside it. Calibrated alone, q90 of wan-three took
    39.7 ms a step at batch 4; beside the other two computing, 48-54 ms; in the runs, 41-44 ms,
    for it computes while the slow-linked node is still syncing (results/fidelity-wan/README.md).
    Its steps timed between the calibration's averages see that same neighbourhood. The busy
    loop it replaced (256×256 matmuls for the profile's round) priced the run's compute from a
    calibration in the other neighbourhood: q90's compute 22-42% long in 6 of 8 runs.

    Streaming DiLoCo (P > 1 or τ > 0) runs its schedule instead: each average is one fragment's,
    begun after ⌊H/P⌋ − τ steps, with τ steps beside it on the main thread while a communication
    thread averages ("beside_steps"; overlapped_steps), as in a run, where the classic pattern
    (H steps, then an average alone) priced its compute 11-17% short on some nodes."""
    model, specs = scenario.model, []
    fragments, tau = scenario.diloco.fragments, scenario.diloco.sync_delay_steps
    for k, (node, timing) in enumerate(zip(scenario.nodes, node_timings(scenario))):
        b, h = ((plan.nodes[k].batch_size, plan.nodes[k].local_steps) if plan is not None
                else (scenario.training.batch_size, scenario.training.local_steps))
        before, beside = overlapped_steps(h, fragments, tau)
        if set(node.gpus) == {"cpu"} and model.preset is not None:
            spec = {"steps": {"preset": model.preset, "base_dir": str(scenario.base_dir or ""),
                              "seq_len": model.seq_len, "dtype": model.dtype, "batch": b, "steps": before}}
            specs.append(spec | ({"beside_steps": beside} if beside else {}))
        else:
            spec = {"busy_s": before * timing.step_s(b)}
            specs.append(spec | ({"beside_s": beside * timing.step_s(b)} if beside else {}))
    return specs


def overlapped_steps(local_steps: int, fragments: int, delay_steps: int) -> tuple[int, int]:
    """(steps before an average starts, steps run beside it) as a run's schedule has them: classic
    DiLoCo (P = 1, τ = 0) H steps, then an average that blocks; Streaming DiLoCo one average per
    fragment, ⌊H/P⌋ steps apart (the first fragment's period; real/core/streaming.py), begun τ steps
    before its merge, so ⌊H/P⌋ − τ before and τ beside."""
    if fragments == 1 and delay_steps == 0:
        return local_steps, 0
    period = merge_steps(local_steps, fragments)[0]
    return period - delay_steps, delay_steps


def measured_sizes(scenario, max_mib: int) -> list[int]:
    """The fp32 sizes averaged: 64 KiB to max_mib (×4 per size) and, where the scenario syncs
    P > 1 fragments (Streaming DiLoCo), one fragment's payload, 4 × round(params / P) bytes: the
    size its averages carry, measured rather than interpolated between its neighbours."""
    sizes = sizes_bytes(max_mib)
    if scenario.diloco.fragments > 1:
        sizes.append(sync_bytes(scenario))
    return sorted(set(sizes))


def sync_bytes(scenario) -> int:
    """The fp32 bytes one of the scenario's averages carries: the model's, or one fragment's."""
    return 4 * round(scenario.model.param_count / scenario.diloco.fragments)


def nearest_size(sizes, fp32_bytes: float) -> int:
    """The measured size closest to the run's payload (by ratio): its averages last as the run's."""
    return min(sizes, key=lambda size: abs(math.log(size / fp32_bytes)))


def write_profiles(out_dir: Path, scenario, inner: dict, size: int, batches: list[int]) -> list[str]:
    """Per node with inner steps, out_dir/<node>-0.csv: one profile row at its batch (`batches`,
    per node) from the steps run between the averages of `size` (replacing any earlier file);
    the lines to print."""
    # deferred: calibrate.harness imports torch; --help reads without it
    from calibrate.harness import DeviceInfo, Measurement, profile_row, scenario_device_name  # noqa: PLC0415

    lines = []
    for (cores, quota), node, b in zip(leader_limits(scenario), scenario.nodes, batches):
        cpu, by_size = inner.get(node.name, ("", {}))
        if not by_size:
            continue
        name = scenario_device_name(cpu, describe_limits(cores, quota), scenario.name, node.name, 0, node.gpu_count,
                                    "between shaped-WAN averages")
        row = profile_row(DeviceInfo("cpu", name, None, "cpu", None, None, None), scenario.model.arch.name,
                          scenario.model.seq_len, scenario.model.dtype, Measurement(b, list(by_size[size])))
        path = child_path(out_dir, f"{node.name}-0.csv")  # node names hold no / (formats/limits.py)
        write_new_profile(path, [row])
        lines.append(f"{path}: {node.name}: b{b} {row['step_s_mean'] * 1e3:.1f} ms mean over {row['repeats']} "
                     f"steps between averages of {size >> 10} KiB")
    return lines


def _measure_and_write(args, scenario, nodes, out: Path, between: list[dict]) -> int:
    # deferred: torch and the executor's modules; --help and the scenario's refusals read without them
    from geodt.calibration.link_timing import measure_shaped, to_frame  # noqa: PLC0415

    prog = "geodt calibrate network --wan shaped"
    sizes = measured_sizes(scenario, args.max_mib)
    print(f"{prog}: between averages each node computes its round, as in a run: "
          + ", ".join(f"{name} {_described(spec)}" for (name, _), spec in zip(nodes, between)), file=sys.stderr)
    try:
        with tqdm(total=len(sizes), desc="shaped WAN", unit="size", file=sys.stderr) as bar:
            rows, inner = measure_shaped(nodes, scenario.network.latency_ms, sizes, args.payload_dtypes,
                                         args.collectives, args.repeats, args.threads, bar.update,
                                         lambda text: print(f"{prog}: {text}", file=sys.stderr, flush=True),
                                         leader_limits(scenario), between)
    except WanError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    frame = to_frame({len(nodes): rows}, args.repeats, backend=SHAPED_BACKEND)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False, float_format="%.9g")
    os.replace(tmp, out)
    model = read_network_profile(out)
    print(codec_summary(model))
    print(comparison(scenario, model, frame).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {out}")
    if args.profiles_out is not None:
        size = nearest_size(sizes, sync_bytes(scenario))
        batches = [spec["steps"]["batch"] if "steps" in spec else None for spec in between]
        for line in write_profiles(Path(args.profiles_out), scenario, inner, size, batches):
            print(line)
    return 0


def _described(spec: dict) -> str:
    """What one node runs between averages (and beside them), in words."""
    if "steps" in spec:
        text = f"{spec['steps']['steps']} inner steps at batch {spec['steps']['batch']}"
        beside = spec.get("beside_steps", 0)
        return text + (f", then {beside} more beside each average" if beside else "")
    beside_s = spec.get("beside_s", 0.0)
    return f"{spec['busy_s']:.2f} s busy" + (f", then {beside_s:.2f} s beside each average" if beside_s else "")


def comparison(scenario, model, frame):
    """Per (dtype, collective, size): the measured mean sync against the simulator's byte-count
    price (error_pct, signed), the ratio f it prices that size at from these rows (factor), and
    its price from the other sizes' rows alone (held_out_error_pct: how well the interpolation
    prices a size it did not measure)."""
    rows, wire = [], _wire(scenario, model)
    every = frame[frame.kind == "all_reduce"]
    for row in every[every.node.fillna("") == ""].itertuples():  # each repeat's slowest process
        key = (row.payload_dtype, row.collective)
        others = tuple(r for r in model.shaped if (r[0], r[1]) != key or r[2] != row.size)
        predicted = predicted_s(scenario, model, *key, row.size)
        held_out = predicted_s(scenario, model, *key, row.size, _wire(scenario, replace(model, shaped=others)))
        f = wire.factor_raw(*key, bytes_s(scenario, row.collective, row.payload_dtype, row.size / 4))
        rows.append({"payload_dtype": row.payload_dtype, "collective": row.collective, "fp32_bytes": row.size,
                     "measured_s": row.seconds_mean, "predicted_s": predicted,
                     "error_pct": 100.0 * (row.seconds_mean - predicted) / predicted,
                     "factor": None if f is None else float(f),
                     "held_out_error_pct": 100.0 * (row.seconds_mean - held_out) / held_out})
    return pd.DataFrame(rows)


def _wire(scenario, model):
    """simulator.models.network.wire_cost of the scenario with `model` as its network profile."""
    return wire_cost(replace(scenario, network_model=model))


if __name__ == "__main__":
    raise SystemExit(main())
