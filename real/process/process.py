"""One process's life: CPU limits, threads, joining the process group, running its node, and
the exit status (0 done, 1 lost peer, 2 bad input, 3 a failure it has named in one line, such
as a full disk; 130 interrupted). The launcher adds nothing to the line of a 2 or a 3."""
from __future__ import annotations

import errno
import io
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from formats.cli import whole_lines
from formats.plan import Plan
from real.checkpoint.checkpoint import CheckpointWriteError
from real.core.config import RunSpec
from real.core.data import make_chain
from real.core.options import ExecOptions, PeerLost, resolve_backend
from real.membership.membership import connect_store
from real.process.worker import Node
from real.wan.wan import lost_message, serve_liveness
from train.children import leave
from train.cpulimit import CpuLimitError, apply_cpu_limits, device_cores

STOPPED_KEY = "geodt/stopped-on-its-own/"
SAID = 3  # exit status of a process that stopped for a failure it has named (real/process/launch.py adds nothing)


def init_process_group(backend: str, rank: int, world: int, timeout_s: float, store_spec: tuple | None):
    """Join the group: ("file", path) or ("tcp", host, port) from the local launcher, or
    env:// (torchrun's MASTER_ADDR/MASTER_PORT) when store_spec is None. Returns the
    launcher's store (None for env://)."""
    timeout = timedelta(seconds=timeout_s)
    if store_spec is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
        return None
    if store_spec[0] == "file":
        store = dist.FileStore(store_spec[1], world)
    else:
        _, host, port = store_spec
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return store


def _say_lost(links: tuple, me: int, store) -> str | None:
    """Whom this node lost (real/wan/wan.py), then leave word in the launcher's store that it
    stops on its own, so that peers who notice its exit later do not blame it."""
    def stopped_itself(node: str) -> bool:
        try:
            return store is not None and store.check([STOPPED_KEY + node])
        except (RuntimeError, OSError):
            return False

    whom = lost_message(links, me, stopped_itself)
    if store is not None:
        try:
            store.set(STOPPED_KEY + links[me].node, "1")
        except (RuntimeError, OSError):
            pass  # the store is gone with the launcher: nobody is left to ask
    return whom


def write_failure(exc: OSError) -> str:
    """One line for a file this process could not write (CheckpointWriteError says it all)."""
    if isinstance(exc, CheckpointWriteError):
        return exc.strerror
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = "no space left on device" if full else (exc.strerror or str(exc))
    return (f"{exc.filename or 'an output file'}: {reason}; its temporary file was removed and the checkpoints "
            f"are intact ({'free space, then ' if full else ''}--resume)")


def _apply_limits(plan: Plan, rank: int):
    """The node's CPU limits for this process (train/cpulimit.py); returns (cleanup, cores)."""
    index = plan.node_of_rank(rank)
    node = plan.nodes[index]
    if node.cpu_cores is None and node.cpu_quota is None:
        return (lambda: None), None

    local = rank - plan.first_rank(index)
    cores = device_cores(node.cpu_cores, node.gpus, local)
    tag = "geodt-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in node.node)[:40] + f"-{local}"
    return apply_cpu_limits(cores, node.cpu_quota, tag), cores


def worker_main(rank: int, world: int, local_rank: int, local_world: int, spec: RunSpec, plan: Plan,
                opts: ExecOptions, store_spec: tuple | None, links: tuple | None = None, joining: bool = False) -> None:
    """Entry of one process; never returns: exits 0 when done, 1 for a lost peer, 2 for bad
    input, 130 when interrupted. `links`: the shaped WAN's nodes (real/wan/wan.py), or None;
    `joining`: a lost node's restarted process (--on-node-loss continue, real/membership/members.py)."""
    sys.stderr.flush()
    sys.stderr = whole_lines(io.FileIO(2, "w", closefd=False))
    name = plan.nodes[plan.node_of_rank(rank)].node if rank < plan.world_size else f"rank {rank}"
    cleanup = lambda: None
    status = 0
    _liveness = store = None  # the liveness socket is held open by this name until the process exits
    try:
        if links is not None and rank == plan.first_rank(plan.node_of_rank(rank)):
            _liveness = serve_liveness(links[plan.node_of_rank(rank)])
        cleanup, cores = _apply_limits(plan, rank)  # before torch starts any work
        threads = opts.threads or (len(cores) if cores else max(1, (os.cpu_count() or 1) // local_world))
        torch.set_num_threads(threads)
        # the run-wide group is each membership epoch's (real/membership/members.py)
        if opts.on_node_loss == "continue":
            store = connect_store(store_spec, opts.collective_timeout_s())
            node = Node(rank, world, local_rank, spec, plan, opts, "gloo", store=store, joining=joining)
        else:
            backend = resolve_backend(opts.backend, local_world)
            store = init_process_group(backend, rank, world, opts.collective_timeout_s(), store_spec)
            node = Node(rank, world, local_rank, spec, plan, opts, backend)
        if rank == 0 and opts.data_path is None and not joining:
            chain = make_chain(spec.seed, node.vocab_size)
            print(f"real: synthetic Markov corpus over {chain.states} tokens: entropy rate "
                  f"{chain.entropy_rate():.4f} nats/token (the best achievable loss)", file=sys.stderr, flush=True)
        node.run()
    except PeerLost as exc:
        whom = None if links is None else _say_lost(links, plan.node_of_rank(rank), store)
        if whom is not None:
            print(f"real: node {name} (rank {rank}): {whom}; stopping", file=sys.stderr, flush=True)
        else:
            print(f"real: node {name} (rank {rank}): lost contact with its peers ({exc}); a peer process "
                  f"died or the network failed; stopping", file=sys.stderr, flush=True)
        status = 1  # no destroy_process_group: it could block on the dead peer
    except KeyboardInterrupt:
        status = 130
    except (ValueError, CpuLimitError) as exc:
        print(f"real: node {name} (rank {rank}): {str(exc).strip().splitlines()[0]}", file=sys.stderr, flush=True)
        status = 2
    except OSError as exc:  # a checkpoint or output that could not be written: a full disk, say
        print(f"real: node {name} (rank {rank}): {write_failure(exc)}", file=sys.stderr, flush=True)
        status = SAID
    cleanup()
    if status == 0 and dist.is_initialized():
        dist.destroy_process_group()
    leave(status)  # without the interpreter's teardown, which can abort after all outputs were written
