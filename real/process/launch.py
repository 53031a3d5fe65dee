"""Start the processes of a plan: forked locally from a forkserver, or this process is one rank under torchrun.

Processes: a node with G devices runs G processes (real/process/worker.py); ranks go to nodes in
plan order, G_i consecutive ranks each, so a plan of nodes (2, 1, 3 devices) is ranks
0-1 | 2 | 3-5, and rank 0 (the first node's leader) writes trace.csv.

Locally, all Σ G_i processes are started here (torch.multiprocessing, start method forkserver:
each is forked from a server that imported the executor and torch once, so a process starts in
a fraction of a second instead of the seconds a fresh interpreter takes to import torch; it takes
the launcher's environment, folder and output streams at its start, as a spawned one would: worker_start).
With a loopback `host` (the default) they rendezvous through a FileStore in a temporary
directory and gloo is pinned to the loopback interface, so nothing listens on the network.
With another `host` (an address of this machine, or a name resolving to one) this process
serves a TCPStore on a socket bound to that address only (not every interface), and gloo
is pinned to the interface holding it (GLOO_SOCKET_IFNAME).

Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set) this process is one rank and joins
with env:// (MASTER_ADDR, MASTER_PORT; 127.0.0.1:29500 if unset). Run one torchrun per
machine with `--nproc-per-node G_i` and `--node-rank i` in plan order: torch's elastic agent
numbers ranks cumulatively over the machines, which is the plan's order. WORLD_SIZE must be
Σ G_i. torchrun's own store binds every interface; `--local-addr`/`--rdzv-endpoint`
choose where peers connect, and GLOO_SOCKET_IFNAME which interface gloo uses.

With `--wan shaped` (opts.wan; root) each node's processes run in a network namespace of
their own, joined by a bridge, each node's link shaped both ways to its link_gbps
(real/wan/wan.py). The rendezvous stays a FileStore (a file is reachable from every namespace
and carries no training traffic); gloo binds to each node's address inside its namespace.
The launcher builds the WAN before spawning and removes it on every way out.

The rendezvous has no authentication (anyone who reaches the port can join or disrupt a
run): use it on trusted networks. A `host` other than the loopback prints a one-line warning
saying so; the any-address (every interface, in any spelling: 0, ::, ::ffff:0.0.0.0) is refused
unless --allow-any-host, broadcast and multicast always (resolved first, then judged: check_host_policy).
It carries no pickles: everything exchanged is tensors.
Inputs are checked here, before any process starts, so bad input fails fast with one line.
"""
from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
from dataclasses import replace
from datetime import timedelta
from multiprocessing import reduction
from multiprocessing import util as mp_util
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from facts.presets import PresetError, load_arch
from formats.plan import Plan
from formats.rounds import RoundKind, runs_in_fragments
from real.checkpoint.ckpt_set import unresumable
from real.core.config import ConfigError, RunSpec, load_plan, load_run_spec
from real.core.data import ArrayShard, load_tokens
from real.core.options import ExecOptions, run_kind
from real.core.streaming import StreamingSpec
from real.membership.membership import open_store
from real.process.outdir import (
    RDZV_PREFIX,
    OutDirError,
    check_space,
    remove_orphan_rendezvous,
    remove_stale_outputs,
    rendezvous_dir,
    take_lock,
)
from real.process.process import worker_main
from real.process.respawn import Respawner
from real.process.supervise import INTERRUPTED, SIGNALLED, Terminated, on_sigterm, stop, supervise
from real.wan.wan import enter, shaped_run
from train.children import die_with
from train.cpulimit import cpu_quota_supported

SOCKET_PATH_BYTES = 107  # a unix socket's path on Linux (sun_path, less its terminating NUL)
LIVENESS_GRACE_S = 6.0  # > real.wan.wan.LIVENESS_TIMEOUT_S, plus the time to print and exit
# After a worker lost contact, how long its peers get to time out too before the processes still
# running are named as the ones that stopped answering (peers wait in the same collective, so
# they time out within a fraction of a second of each other; a loaded machine adds some).
HUNG_GRACE_S = 3.0


class LaunchError(ValueError):
    """Inputs that cannot run; str() is the one-line report."""


def check_inputs(plan_path: str | Path, scenario_path: str | Path, opts: ExecOptions) -> tuple[RunSpec, Plan]:
    """Load and cross-check plan, scenario and data; raises ConfigError / LaunchError.

    Returns the run spec (rounds from the plan) and the plan with every default resolved."""
    spec = load_run_spec(scenario_path)
    plan = load_plan(plan_path, seq_len=spec.model.seq_len).resolved(
        spec.training.rounds, spec.network.collective, spec.network.payload_dtype, outer_state=spec.diloco.outer_state)
    if opts.checkpoint_every is not None:  # --checkpoint-every K: the scenario's key, given on the command line
        spec = replace(spec, training=replace(spec.training, checkpoint_every=opts.checkpoint_every))
    try:
        arch = load_arch(spec.model.preset, Path(scenario_path).parent)
    except PresetError as exc:
        raise LaunchError(f"{scenario_path}: model.preset: {exc}") from None
    streaming = opts.streaming or StreamingSpec.from_plan(plan)
    try:
        streaming.check(plan.nodes, arch.num_layers)
    except ValueError as exc:
        raise LaunchError(f"{plan_path}: {exc}") from None
    kind = run_kind(plan, opts)
    check_runnable_layout(plan, plan_path, kind)
    check_async(plan, plan_path, opts, kind)
    if opts.on_node_loss == "continue":
        check_continue(opts)
    check_resume(opts, [node.node for node in plan.nodes])
    if opts.data_path is not None:
        try:  # a corpus too short for a window per node: refused here, not after the processes started
            tokens = load_tokens(opts.data_path, arch.vocab_size)
            ArrayShard(tokens, spec.model.seq_len, 0, 1 if opts.replicate_data else len(plan.nodes),
                       str(opts.data_path))
        except ValueError as exc:  # DataError: not a regular file, too large, a garbled .npy, too short, ...
            raise LaunchError(f"--data {exc}") from None
    return spec, plan


def check_runnable_layout(plan: Plan, plan_path, kind: RoundKind) -> None:
    """A sharded node (real/core/sharding.py) runs the kinds of round that support it (formats/rounds.py:
    classic DiLoCo rounds); sync-ddp's per-step gradient average and Streaming DiLoCo's fragments work on
    whole replicas, so those are refused (a round without a barrier: check_async)."""
    if kind.supports("sharding") or not kind.barrier:
        return
    for i, node in enumerate(plan.nodes, start=2):
        if node.sharding not in (None, "none") and node.gpus > 1:
            raise LaunchError(f"{plan_path}: line {i}: sharding: {node.sharding} with {kind.refusals['sharding']} "
                              "is not run by this executor; expected none")


def check_async(plan: Plan, plan_path, opts: ExecOptions, kind: RoundKind) -> None:
    """A round without a barrier (real/rounds/round_server.py: async and quorum) pushes whole replicas and
    checkpoints consistent cuts (real/checkpoint/checkpoint.py): what its kind does not support
    (formats/rounds.py) is refused in one line, the first asked for of sharding, the streaming loop
    (ExecOptions.streaming) and --on-node-loss continue."""
    if kind.barrier:
        return
    asked = {"sharding": (any(node.sharding not in (None, "none") and node.gpus > 1 for node in plan.nodes),
                          f"{plan_path}: sharding: ", "; expected none"),
             # the streaming loop forced (ExecOptions.streaming): a plan's own are refused as it loads (kind_problem)
             "fragments": (runs_in_fragments(forced=opts.streaming), "Streaming DiLoCo's fragments: ", ""),
             "continue": (opts.on_node_loss == "continue", "--on-node-loss continue: ", "")}
    for capability, (wanted, where, tail) in asked.items():
        if wanted and not kind.supports(capability):
            raise LaunchError(f"strategy {plan.strategy} (sync {plan.sync}): {where}{kind.refusals[capability]}{tail}")


def check_continue(opts: ExecOptions) -> None:
    """--on-node-loss continue runs every round kind, collective and payload (real/membership/members.py); what it
    cannot run is refused in one line, saying why (the README's table has the same reasons)."""
    why = None
    if under_torchrun():
        why = ("runs under the local launcher only: torchrun's elastic agent restarts every process of the "
               "group when one dies, so there is no survivor to continue")
    elif opts.backend == "nccl":
        why = ("runs on gloo only, got --backend nccl: an nccl communicator cannot be rebuilt over the "
               "survivors here (no GPU to test it on)")
    if why is not None:
        raise LaunchError(f"--on-node-loss continue {why}")


def check_cpu_limits(plan: Plan, plan_path) -> None:
    """Local runs: every node's cores exist here, and a quota can be set where one is asked."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    for i, node in enumerate(plan.nodes, start=2):
        if node.cpu_cores is not None and not set(node.cpu_cores) <= allowed:
            raise LaunchError(f"{plan_path}: line {i}: cpu_cores: expected core indices among {sorted(allowed)}, "
                              f"got {list(node.cpu_cores)}")
        if node.cpu_quota is not None and not cpu_quota_supported():
            raise LaunchError(f"{plan_path}: line {i}: cpu_quota: this machine offers no writable cgroup cpu "
                              f"controller (needs root and cgroup cpu); remove the quota or run as root")


def under_torchrun() -> bool:
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def resolve_host(host: str) -> str:
    """The address `host` names, resolved before it is judged (check_host_policy): an IPv4 address
    in any spelling inet_aton takes ("0", "0x0", "4294967295"), an IPv6 one (brackets allowed), an
    IPv4-mapped IPv6 one as its IPv4 address (::ffff:0.0.0.0 binds 0.0.0.0), or a name's first IPv4
    address; LaunchError (one line) when it does not resolve."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address is not None:
        return address.exploded if address.version == 4 else str(address)
    if not host or len(host) > 253:
        raise LaunchError(f"--host: expected an address or host name, got {host!r}")
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise LaunchError(f"--host: cannot resolve {host!r} ({exc})") from None
    return infos[0][4][0]


def check_host_policy(host: str, ip: str, allow_any: bool) -> str | None:
    """--host, judged on the address it resolved to (resolve_host): LaunchError for the any-address
    (every interface, in every spelling) unless allowed, and for a broadcast or multicast address
    (no listener can be one: a run warned, then waited for peers forever); the warning line a
    non-loopback address gets (the rendezvous has no authentication), None on the loopback."""
    address = ipaddress.ip_address(ip.split("%")[0])
    shown = host if host == ip else f"{host} ({ip})"
    if address.is_unspecified and not allow_any:
        raise LaunchError(f"--host {shown}: binds every interface of this machine and the rendezvous is "
                          f"unauthenticated; give one address of a trusted network, or --allow-any-host")
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        kind = "multicast" if address.is_multicast else "broadcast"
        raise LaunchError(f"--host {shown}: a {kind} address, which no rendezvous can listen on; expected one "
                          f"address of this machine on a trusted network")
    if address.is_loopback:
        return None
    return (f"--host {host}: the rendezvous is unauthenticated: any process that can reach {ip} can join or "
            f"disrupt this run; use a trusted network only")


def _interface_of(ip: str) -> str | None:
    """Name of the network interface holding IPv4 address `ip` (Linux SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return None


def pin_gloo(ip: str) -> None:
    """Gloo otherwise binds to the address the hostname resolves to, which may be public."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    name = _interface_of(ip)
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def _copy_inputs(plan_path: str | Path, scenario_path: str | Path, out_dir: Path) -> None:
    """The output directory holds the plan and resolved scenario it was made from, as a set:
    both copied to temporary names first, then both renamed (a full disk replaces neither)."""
    copies = [(src, out_dir / name) for src, name in ((plan_path, "plan.csv"), (scenario_path, "scenario.toml"))
              if not ((out_dir / name).exists() and os.path.samefile(src, out_dir / name))]
    staged = []
    try:
        for src, dst in copies:
            tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
            staged.append(tmp)
            shutil.copyfile(src, tmp)
    except OSError as exc:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise LaunchError(f"{out_dir}: cannot write plan.csv and scenario.toml ({exc.strerror or exc}); "
                          f"nothing was replaced") from None
    for (_, dst), tmp in zip(copies, staged):
        os.replace(tmp, dst)


class _Streams:
    """The launcher's stdout and stderr as they are now, for a forkserver's child (which otherwise
    writes where they went when the server started): their descriptors travel with the process."""

    def __reduce__(self):
        return _streams, (reduction.DupFd(1), reduction.DupFd(2))


def _streams(out, err) -> tuple[int, int]:
    return out.detach(), err.detach()


def worker_start() -> tuple:
    """What a worker takes from its launcher at its start (_spawn_entry): the launcher's pid, folder,
    environment and output streams now (the forkserver may have been started by an earlier run)."""
    return os.getpid(), os.getcwd(), dict(os.environ), _Streams()


def workers() -> mp.context.BaseContext:
    """The start method of a local run's processes: a forkserver whose server has imported what a
    worker runs (real/process/forkserver_preload.py) before it forks any."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["real.process.forkserver_preload"])
    _server_folder()
    return context


_SERVER_FOLDER: dict[str, str] = {}  # this process's folder for the forkserver's socket, once made


def _server_folder() -> None:
    """The forkserver listens on a unix socket in multiprocessing's temporary folder, made once per
    process: it is made here inside a rendezvous folder of this launcher's, so that a launcher that
    leaves without Python's teardown (`python -m real`'s os._exit) or is killed leaves nothing
    (remove_server_folder; the next launch's remove_orphan_rendezvous). Under a $TMPDIR too long for
    a socket's path (107 bytes) it goes to the first writable of /tmp, /var/tmp, /dev/shm."""
    if _SERVER_FOLDER:
        return
    base = tempfile.gettempdir()
    if len(base) + len("/geodt-rdzv-4194304-xxxxxxxx/pymp-xxxxxxxx/listener-xxxxxxxx") > SOCKET_PATH_BYTES:
        base = next((d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.access(d, os.W_OK | os.X_OK)), base)
        remove_orphan_rendezvous(base)
    folder = tempfile.mkdtemp(prefix=f"{RDZV_PREFIX}{os.getpid()}-", dir=base)
    saved, tempfile.tempdir = tempfile.tempdir, folder
    try:
        mp_util.get_temp_dir()  # multiprocessing's, inside ours, kept for this process's life
    finally:
        tempfile.tempdir = saved
    _SERVER_FOLDER["path"] = folder
    # at exit after multiprocessing's own folder inside it (its finalizer, exit priority -100)
    mp_util.Finalize(None, remove_server_folder, exitpriority=-101)


def remove_server_folder() -> None:
    """Remove this process's forkserver folder (its socket), if it made one: at exit, or right before an
    os._exit (which skips multiprocessing's own finalizers)."""
    folder = _SERVER_FOLDER.pop("path", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def take_launchers_place(start: tuple) -> None:
    """In a worker: end with the launcher, and take its folder, environment and output streams as
    worker_start found them."""
    launcher_pid, cwd, environ, (out_fd, err_fd) = start
    die_with(launcher_pid)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    for fd, std in ((out_fd, 1), (err_fd, 2)):
        os.dup2(fd, std)
        os.close(fd)


def _spawn_entry(rank: int, spec: RunSpec, plan: Plan, opts: ExecOptions, store_spec: tuple,
                 links: tuple | None, start: tuple, joining: bool = False) -> None:
    # Ctrl-C reaches the whole process group: the launcher alone handles it (stops the
    # children), so no child prints a traceback or a lost-peer message on the way down. That
    # also drops the SIGINT torch asks for when the launcher dies: a killed launcher's workers
    # ran on until their collectives timed out (--timeout-s, 300 s); now they go with it (die_with).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM to the whole group (a scheduler, systemd) likewise: the launcher ends the run (real/process/supervise.py).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    take_launchers_place(start)
    if links is not None:  # --wan shaped: into the node's namespace before any socket exists
        enter(links[plan.node_of_rank(rank)])
    worker_main(rank, plan.world_size, rank, plan.world_size, spec, plan, opts, store_spec, links=links,
                joining=joining)


def _run_torchrun(plan_path, scenario_path, spec: RunSpec, plan: Plan, opts: ExecOptions, out_dir: Path) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != plan.world_size:
        print(f"real: {plan_path}: gpus: the plan's nodes have {plan.world_size} devices in all but torchrun "
              f"started WORLD_SIZE={world} processes; expected one process per device", file=sys.stderr)
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if rank == 0:
        _copy_inputs(plan_path, scenario_path, out_dir)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    worker_main(rank, world, int(os.environ["LOCAL_RANK"]), local_world, spec, plan, opts, None)
    return 0  # not reached: worker_main exits


def check_wan(plan: Plan, plan_path, opts: ExecOptions, host: str) -> None:
    """--wan shaped: a local run with every node's link known."""
    if opts.wan == "loopback":
        return
    if under_torchrun():
        raise LaunchError("--wan shaped: builds every node's network on this machine; not used under torchrun")
    if not ipaddress.ip_address(resolve_host(host)).is_loopback:
        raise LaunchError(f"--host {host}: not used with --wan shaped (processes bind inside the WAN's namespaces)")
    for i, node in enumerate(plan.nodes, start=2):
        if node.link_gbps is None:
            raise LaunchError(f"{plan_path}: line {i}: link_gbps: --wan shaped shapes each node's link to it; "
                              f"expected a value on every row")


def check_disk_space(spec: RunSpec, plan: Plan, opts: ExecOptions, out_dir: Path) -> None:
    """Room in DIR for the checkpoints of the nodes this machine runs (real/process/outdir.py); OutDirError
    otherwise."""
    if under_torchrun():
        local = [plan.node_of_rank(int(os.environ["RANK"]))]
    else:
        local = list(range(len(plan.nodes)))
    streams = run_kind(plan, opts).supports("fragments")  # a streaming node's set holds the model's own weights too
    check_space(out_dir, local, load_arch(spec.model.preset).params, streams, opts.checkpoint)


def launch(plan_path: str | Path, scenario_path: str | Path, opts: ExecOptions, host: str = "127.0.0.1",
           announce=None, lock: bool = True) -> int:
    """Run the plan to completion; returns the exit status (0, 1 for a failed node, 2 for bad
    input or a busy or too small --out, 130 when interrupted, 143 on SIGTERM). Rank 0 prints the
    per-node summary (opts.summary). announce(), if given, is called once every input is
    checked, right before the processes start (warnings about the run go there, so that bad
    input stays one line). `lock`: take DIR's run lock (real/process/outdir.py); False when the caller
    (geodt run) holds it already."""
    ip = unauthenticated = None
    try:
        spec, plan = check_inputs(plan_path, scenario_path, opts)
        check_wan(plan, plan_path, opts, host)
        if not under_torchrun():
            check_cpu_limits(plan, plan_path)
            ip = resolve_host(host)
            unauthenticated = check_host_policy(host, ip, opts.allow_any_host)
    except (ConfigError, LaunchError) as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    if ip is not None and unauthenticated is not None:
        print(f"real: {unauthenticated}", file=sys.stderr, flush=True)
    out_dir = Path(opts.out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        held = take_lock(out_dir) if lock and _first_on_machine() else None
    except (OSError, OutDirError) as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    try:
        return _launch(plan_path, scenario_path, spec, plan, opts, out_dir, ip, host, announce,
                       lock_held=held is not None or not lock)
    finally:
        if held is not None:
            held.release()


def _first_on_machine() -> bool:
    """The local launcher, or under torchrun the machine's first process (LOCAL_RANK 0)."""
    return not under_torchrun() or os.environ.get("LOCAL_RANK") == "0"


def _launch(plan_path, scenario_path, spec: RunSpec, plan: Plan, opts: ExecOptions, out_dir: Path, ip, host,
            announce, lock_held: bool) -> int:
    """launch() once DIR is this run's: stale temporaries out, room checked, the processes run."""
    try:
        if lock_held:
            remove_stale_outputs(out_dir)
        check_disk_space(spec, plan, opts, out_dir)
    except OutDirError as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    if under_torchrun():
        return _run_torchrun(plan_path, scenario_path, spec, plan, opts, out_dir)
    if opts.wan == "shaped":
        return shaped_run(spec, plan, out_dir, lambda links: _run_local(plan_path, scenario_path, spec, plan, opts,
                                                                       out_dir, ip, host, links, announce))
    (out_dir / "wan.csv").unlink(missing_ok=True)  # a shaped run's description, not this run's
    return _run_local(plan_path, scenario_path, spec, plan, opts, out_dir, ip, host, None, announce)


def _run_local(plan_path, scenario_path, spec: RunSpec, plan: Plan, opts: ExecOptions, out_dir: Path, ip: str,
               host: str, links: tuple | None, announce=None) -> int:
    """Spawn every process here and wait for them (links: the shaped WAN's nodes, or None)."""
    loopback = ipaddress.ip_address(ip).is_loopback
    if loopback or opts.on_node_loss == "continue":
        # One machine: rendezvous through a file, so nothing listens on the network; under continue
        # the membership store is that file too, which only this user can open (real/membership/membership.py).
        pin_gloo(ip)
        if loopback:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        listener = None
    else:
        listener = _listen(ip, host)
        if listener is None:
            return 2
        pin_gloo(ip)
    if announce is not None:
        announce()
    try:
        _copy_inputs(plan_path, scenario_path, out_dir)
    except LaunchError as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    return _run_spawned(spec, plan, opts, ip, listener, links)


def _listen(ip: str, host: str) -> socket.socket | None:
    """A listening socket bound to `ip` alone for the TCPStore; None (said in one line) if it cannot bind."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((ip, 0))
    except OSError as exc:
        listener.close()
        print(f"real: --host: cannot bind to {host} ({ip}): {exc.strerror}; expected an address of this machine",
              file=sys.stderr)
        return None
    listener.listen()
    return listener


def _run_spawned(spec: RunSpec, plan: Plan, opts: ExecOptions, ip: str, listener: socket.socket | None,
                 links: tuple | None) -> int:
    """Spawn every process of the plan and watch them (real/process/supervise.py); returns the exit status."""
    # torch logs a line per child it stops after a failure; our own one line says it all.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    store = None
    context = None
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM ends the run as Ctrl-C does (only the main thread may set a handler)
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    try:
        with rendezvous_dir() as rdzv:
            try:
                if listener is not None:
                    store, store_spec = _serve_store(ip, listener, plan, opts)
                else:
                    store_spec = ("file", os.path.join(rdzv, "store"))
                if opts.on_node_loss == "continue":
                    store = open_store(store_spec[1], opts.timeout_s)  # the launcher's handle outlives the workers
                    context = _respawner(spec, plan, opts, store, store_spec, links)  # its .processes for Ctrl-C
                    return context.run()
                workers()  # sets up the forkserver start_processes uses
                context = mp.start_processes(_spawn_entry, args=(spec, plan, opts, store_spec, links, worker_start()),
                                             nprocs=plan.world_size, join=False, start_method="forkserver")
                # On the shaped WAN a node that loses a peer finds out whom (real/wan/wan.py) before it
                # stops: the others get that long to say so themselves before they are stopped.
                grace_s = HUNG_GRACE_S if links is None else LIVENESS_GRACE_S
                return supervise(context, plan, grace_s, opts.timeout_s, settle_on_death=links is not None)
            except KeyboardInterrupt as exc:
                if context is not None:
                    stop(context.processes)
                print(interrupted_note(opts.out_dir), file=sys.stderr)
                return SIGNALLED + signal.SIGTERM if isinstance(exc, Terminated) else 130
            finally:
                del store
                if listener is not None:
                    listener.close()
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _serve_store(ip: str, listener: socket.socket, plan: Plan, opts: ExecOptions) -> tuple:
    """The rendezvous TCPStore this launcher serves on `listener`, and its spec for the children."""
    # The store counts this process as a client too (world + 1): it serves, children join.
    clients = None if opts.on_node_loss == "continue" else plan.world_size + 1  # restarts join later
    store = dist.TCPStore(ip, listener.getsockname()[1], clients, True, timedelta(seconds=opts.timeout_s),
                          wait_for_workers=False, master_listen_fd=listener.fileno())
    spec = ("tcp", ip, listener.getsockname()[1])
    listener.detach()  # the store owns (and closes) the socket now
    return store, spec


def _respawner(spec: RunSpec, plan: Plan, opts: ExecOptions, store, store_spec: tuple, links):
    """--on-node-loss continue: the node processes under a Respawner, which restarts a lost one."""
    context = workers()

    def start(rank: int, joining: bool):
        proc = context.Process(target=_spawn_entry, args=(rank, spec, plan, opts, store_spec, links,
                                                          worker_start(), joining))
        proc.start()
        return proc

    # an injected outage's node restarts at once and waits to be admitted at its round
    rejoin_s = 0.0 if opts.outage and opts.rejoin_after_s is None else opts.rejoin_after_s
    return Respawner(start, plan, store, rejoin_s)


INTERRUPTED_EARLY = "real: interrupted before any round was checkpointed; nothing to resume (rerun without --resume)"


def saved_checkpoints(out_dir) -> list[Path]:
    """The checkpoint sets a run in out_dir left (real/checkpoint/ckpt_set.py: checkpoints/node<i>/round-<R>/)."""
    folder = Path(out_dir) / "checkpoints"
    return sorted(folder.glob("node*/round-*/manifest.json")) if folder.is_dir() else []


def interrupted_note(out_dir) -> str:
    """Ctrl-C's one line: where the completed rounds are, or that none was saved yet."""
    return INTERRUPTED if saved_checkpoints(out_dir) else INTERRUPTED_EARLY


def check_resume(opts: ExecOptions, names: list[str]) -> None:
    """--resume: there is something to resume in --out (else say so instead of starting afresh silently),
    and no node of the plan (`names`, in order) holds only sets that fail their checks (a resume from
    the start would replace every other node's good sets: ckpt_set.unresumable)."""
    if not opts.resume:
        return
    if not saved_checkpoints(opts.out_dir):
        raise LaunchError(f"--resume: {Path(opts.out_dir) / 'checkpoints'} holds no checkpoint; expected the --out of "
                          "a run that stopped (--stop-after, Ctrl-C); drop --resume to start from the beginning")
    why = unresumable(opts.out_dir, names)
    if why is not None:
        raise LaunchError(why)
