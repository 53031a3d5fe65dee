"""`geodt sweep --scheduler ADDRESS`: the sweep's chunks on a Dask cluster (the `cluster` extra).

Dask (dask.distributed) rather than Ray: a pure-Python wheel on every platform and Python
version geodt supports, a scheduler and workers started with one command each (`dask scheduler`,
`dask worker tcp://host:8786`) or in-process for a test (LocalCluster), and futures that carry
plain function calls, which is all a sweep needs; Ray brings a large native runtime and its own
object store for the same map. Each task is `sweep_dataset.chunk_bytes(spec, first, kinds, bw)`: the
chunk's Parquet part, the same bytes as on a local process (the workers compute, the client
writes the parts into DIR, so the workers need no shared file system, only geodt installed at
the same version). A rerun resumes from the parts written, as locally.

A cluster can lose its workers mid-sweep (a worker killed, a machine gone): the scheduler keeps the
tasks waiting for a worker that never comes. While tasks are pending the client asks the scheduler
for its workers every POLL_S; none for `worker_timeout_s` (or the scheduler gone, or a task that
killed worker after worker) ends the sweep with ClusterLost, one line naming it, the parts already
written kept for a rerun (with --scheduler, or without it to run the rest locally).
"""
from __future__ import annotations

import time
from concurrent.futures import CancelledError
from pathlib import Path

from formats.errors import InputError
from simulator.outputs.outputs import write_bytes
from simulator.sweep.sweep_dataset import chunk_bytes

CONNECT_TIMEOUT_S = 10  # a scheduler that does not answer in this long is taken as unreachable
WORKER_TIMEOUT_S = 60.0  # --worker-timeout-s: how long a sweep waits with no worker (a worker restarting takes seconds)
POLL_S = 1.0  # how often the workers are counted while tasks are pending


class ClusterLost(RuntimeError):
    """The cluster cannot finish the sweep (no worker, no scheduler); str() is the one line to print."""


def connect(address: str):
    """A dask Client on the scheduler at `address`, before the sweep writes anything; InputError
    (one line) when Dask is missing or the scheduler cannot be reached."""
    try:
        from dask.distributed import Client  # noqa: PLC0415  deferred: dask (the cluster extra) only with --scheduler
    except ImportError:
        raise InputError("--scheduler: needs Dask (pip install 'geodt[cluster]')") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--scheduler {address}: cannot reach a Dask scheduler there ({reason}); expected the "
                         "address of a running `dask scheduler`, e.g. tcp://host:8786") from None


def run_on_cluster(address, spec, jobs, progress, worker_timeout_s: float = WORKER_TIMEOUT_S) -> None:
    """Every job (index, first, kinds, bw, path) on the cluster at `address` (or a dask Client);
    each part written as its result arrives; progress(scenarios) after each. ClusterLost when no
    worker is there for worker_timeout_s while tasks are pending."""
    try:
        from dask.distributed import Client  # noqa: PLC0415  deferred: dask (the cluster extra) only with --scheduler
    except ImportError:
        raise InputError("--scheduler: needs Dask (pip install 'geodt[cluster]')") from None
    client = address if isinstance(address, Client) else Client(address)
    try:
        futures = {client.submit(chunk_bytes, spec, first, kinds, bw, pure=False): (path, len(kinds))
                   for _, first, kinds, bw, path in jobs}
        _collect(client, futures, progress, worker_timeout_s)
    finally:
        if client is not address:
            client.close()


def _collect(client, futures: dict, progress, worker_timeout_s: float) -> None:
    """Each future's part written as it arrives, the workers watched while any is pending."""
    from dask.distributed import wait  # noqa: PLC0415  deferred: dask (the cluster extra) only with --scheduler
    from distributed import KilledWorker  # noqa: PLC0415  deferred: dask (the cluster extra) only with --scheduler

    pending, alone_since = set(futures), None
    while pending:
        try:
            done, pending = wait(pending, timeout=POLL_S, return_when="FIRST_COMPLETED")
        except TimeoutError:
            done = set()
        for future in done:
            path, size = futures[future]
            try:  # bounded: a result held by a worker that died meanwhile is recomputed, not fetched
                data = future.result(timeout=worker_timeout_s)
            except TimeoutError:
                pending.add(future)
                continue
            except (KilledWorker, CancelledError) as exc:  # a chunk that killed its workers, a scheduler restart
                raise ClusterLost(_lost(client, futures, pending,
                                        f"a chunk's task was lost ({type(exc).__name__})")) from None
            write_bytes(Path(path), data)
            future.release()
            progress(size)
        if not pending:
            return
        if _workers(client) > 0:
            alone_since = None
        elif alone_since is None:
            alone_since = time.monotonic()
        elif time.monotonic() - alone_since >= worker_timeout_s:
            raise ClusterLost(_lost(client, futures, pending, f"no worker for {worker_timeout_s:g} s"))


def _workers(client) -> int:
    """The scheduler's workers now; 0 when the scheduler cannot be asked (it is gone too)."""
    try:
        return len(client.nthreads())
    except (OSError, TimeoutError):  # distributed's CommClosedError is an OSError
        return 0


def _lost(client, futures: dict, pending: set, why: str) -> str:
    address = getattr(client.scheduler, "address", None) or "the scheduler"
    folder = Path(next(iter(futures.values()))[0]).parent
    return (f"--scheduler {address}: {why}; stopped with {len(pending)} of {len(futures)} chunks not done (the "
            f"{len(futures) - len(pending)} done are kept in {folder}); start workers and rerun the same command, or "
            "rerun it without --scheduler to finish locally")
