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


def run_on_cluster(address, spec, jobs, progress) -> None:
    """Every job (index, first, kinds, bw, path) on the cluster at `address` (or a dask Client);
    each part written as its result arrives; progress(scenarios) after each."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        from formats.errors import InputError

        raise InputError("--scheduler: needs Dask (pip install 'geodt[cluster]')") from None
    from simulator.outputs import write_bytes
    from simulator.sweep_dataset import chunk_bytes

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
