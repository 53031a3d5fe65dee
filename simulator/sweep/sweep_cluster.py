"""`geodt sweep --scheduler ADDRESS`: the sweep's chunks on a Dask cluster (the `cluster` extra).

Dask (dask.distributed) rather than Ray: a pure-Python wheel on every platform and Python
version geodt supports, a scheduler and workers started with one command each (`dask scheduler`,
`dask worker tcp://host:8786`) or in-process for a test (LocalCluster), and futures that carry
plain function calls, which is all a sweep needs; Ray brings a large native runtime and its own
object store for the same map. Each task is `sweep_dataset.chunk_bytes(spec, first, kinds, bw)`: the
chunk's Parquet part, the same bytes as on a local process (the workers compute, the client
writes the parts into DIR, so the workers need no shared file system, only geodt installed at
the same version). A rerun resumes from the parts written, as locally.
"""
from __future__ import annotations

from pathlib import Path

from formats.errors import InputError
from simulator.outputs.outputs import write_bytes
from simulator.sweep.sweep_dataset import chunk_bytes

CONNECT_TIMEOUT_S = 10  # a scheduler that does not answer in this long is taken as unreachable


def connect(address: str):
    """A dask Client on the scheduler at `address`, before the sweep writes anything; InputError
    (one line) when Dask is missing or the scheduler cannot be reached."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise InputError("--scheduler: needs Dask (pip install 'geodt[cluster]')") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--scheduler {address}: cannot reach a Dask scheduler there ({reason}); expected the "
                         "address of a running `dask scheduler`, e.g. tcp://host:8786") from None


def run_on_cluster(address, spec, jobs, progress) -> None:
    """Every job (index, first, kinds, bw, path) on the cluster at `address` (or a dask Client);
    each part written as its result arrives; progress(scenarios) after each."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise InputError("--scheduler: needs Dask (pip install 'geodt[cluster]')") from None
    client = address if isinstance(address, Client) else Client(address)
    try:
        futures = {client.submit(chunk_bytes, spec, first, kinds, bw, pure=False): (path, len(kinds))
                   for _, first, kinds, bw, path in jobs}
        for future in as_completed(futures):
            path, size = futures[future]
            write_bytes(Path(path), future.result())
            future.release()
            progress(size)
    finally:
        if client is not address:
            client.close()
