"""`geodt sweep --scheduler`: the chunks on a Dask cluster give the local sweep's bytes (the cluster extra)."""
from __future__ import annotations

import pytest

distributed = pytest.importorskip("dask.distributed", reason="the cluster extra (pip install 'geodt[cluster]')")

from simulator.sweep.sweep_cli import main as sweep  # noqa: E402

ARGS = ["--nodes", "3", "--gpus-per-node", "2", "--gpu-types", "a30,v100,t4", "--mixed-nodes", "--bandwidth-gbps",
        "0.1,10", "--strategy", "baseline", "C", "streaming", "--samples", "120", "--seed", "3", "--chunk", "25",
        "--csv", "--no-figures"]


@pytest.mark.slow
def test_a_two_worker_cluster_sweeps_the_local_bytes(tmp_path):
    assert sweep([*ARGS, "--workers", "2", "--out", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert sweep([*ARGS, "--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "dask")]) == 0
    local, dask = tmp_path / "local", tmp_path / "dask"
    parts = sorted(p.name for p in (local / "sweep").iterdir())
    assert len(parts) > 2 and parts == sorted(p.name for p in (dask / "sweep").iterdir())
    for name in parts:
        assert (local / "sweep" / name).read_bytes() == (dask / "sweep" / name).read_bytes(), name
    for name in ("sweep.csv", "sweep.csv.sha256", "sweep.sha256"):
        assert (local / name).read_bytes() == (dask / name).read_bytes(), name
