"""Start the node processes: spawned locally, or this process is one rank under torchrun.

Locally, one process per plan row is spawned (torch.multiprocessing, start method spawn);
with a loopback `host` (the default) they rendezvous through a FileStore in a temporary
directory and gloo is pinned to the loopback interface, so nothing listens on the network;
with another `host` this process serves a TCPStore there at a free port. Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set), this process is one
node and joins with env:// (MASTER_ADDR, MASTER_PORT; 127.0.0.1:29500 if unset). Inputs are
checked here, before any process starts, so bad input fails fast with one line.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from real.config import ConfigError, Plan, RunSpec, load_plan, load_run_spec
from real.data import load_tokens
from real.worker import ExecOptions, worker_main


class LaunchError(ValueError):
    """Inputs that cannot run; str() is the one-line report."""


def check_inputs(plan_path: str | Path, scenario_path: str | Path, opts: ExecOptions) -> tuple[RunSpec, Plan]:
    """Load and cross-check plan, scenario and data; raises ConfigError / LaunchError."""
    from calibrate.presets import PresetError, load_arch

    spec = load_run_spec(scenario_path)
    plan = load_plan(plan_path)
    try:
        arch = load_arch(spec.model.preset, Path(scenario_path).parent)
    except PresetError as exc:
        raise LaunchError(f"{scenario_path}: model.preset: {exc}") from None
    for i, node in enumerate(plan.nodes, start=2):
        expected = node.local_steps * node.batch_size * node.gpus * spec.model.seq_len
        if node.tokens_per_round != expected:
            raise LaunchError(f"{plan_path}: line {i}: tokens_per_round: expected local_steps × batch_size × "
                              f"gpus × seq_len = {expected} (seq_len {spec.model.seq_len} from {scenario_path}), "
                              f"got {node.tokens_per_round}")
    if opts.data_path is not None:
        try:
            load_tokens(opts.data_path, arch.vocab_size)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
    return spec, plan


def under_torchrun() -> bool:
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _pin_gloo_to_loopback() -> None:
    """Gloo otherwise binds to the address the hostname resolves to, which may be public."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def _copy_inputs(plan_path: str | Path, scenario_path: str | Path, out_dir: Path) -> None:
    """The output directory holds the plan and resolved scenario it was made from."""
    for src, name in ((plan_path, "plan.csv"), (scenario_path, "scenario.toml")):
        dst = out_dir / name
        if not (dst.exists() and os.path.samefile(src, dst)):
            tmp = out_dir / f".{name}.tmp{os.getpid()}"
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)


def _spawn_entry(index: int, spec: RunSpec, plan: Plan, opts: ExecOptions, store_spec: tuple) -> None:
    worker_main(index, len(plan.nodes), index, len(plan.nodes), spec, plan, opts, store_spec)


def launch(plan_path: str | Path, scenario_path: str | Path, opts: ExecOptions, host: str = "127.0.0.1") -> int:
    """Run the plan to completion; returns the exit status (0, 1 for a failed node, 2 for bad input)."""
    try:
        spec, plan = check_inputs(plan_path, scenario_path, opts)
    except (ConfigError, LaunchError) as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world != len(plan.nodes):
            print(f"real: {plan_path}: node: the plan has {len(plan.nodes)} nodes but torchrun started "
                  f"WORLD_SIZE={world} processes; expected one process per node", file=sys.stderr)
            return 2
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        if rank == 0:
            _copy_inputs(plan_path, scenario_path, out_dir)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        worker_main(rank, world, int(os.environ["LOCAL_RANK"]), local_world, spec, plan, opts, None)
        return 0

    import torch.distributed as dist
    import torch.multiprocessing as mp

    _copy_inputs(plan_path, scenario_path, out_dir)
    with tempfile.TemporaryDirectory(prefix="geodt-rdzv-") as rdzv:
        store = None
        if _is_loopback(host):
            # One machine: rendezvous through a file, so nothing listens beyond loopback
            # (torch's TCPStore binds every interface whatever host it is given).
            _pin_gloo_to_loopback()
            store_spec: tuple = ("file", os.path.join(rdzv, "store"))
        else:
            # The store counts this process as a client too (world + 1): it serves, children join.
            store = dist.TCPStore(host, 0, len(plan.nodes) + 1, True, timedelta(seconds=opts.timeout_s),
                                  wait_for_workers=False)
            store_spec = ("tcp", host, store.port)
        try:
            mp.start_processes(_spawn_entry, args=(spec, plan, opts, store_spec), nprocs=len(plan.nodes),
                               join=True, start_method="spawn")
        except mp.ProcessExitedException as exc:
            print(f"real: node {plan.nodes[exc.error_index].node} exited with status {exc.exit_code}; "
                  f"the other nodes were stopped", file=sys.stderr)
            return 2 if exc.exit_code == 2 else 1
        except mp.ProcessRaisedException as exc:
            print(f"real: node {plan.nodes[exc.error_index].node} failed: {str(exc).strip().splitlines()[-1]}",
                  file=sys.stderr)
            return 1
        finally:
            del store
    return 0
