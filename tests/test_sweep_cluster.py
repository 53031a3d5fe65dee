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


@pytest.mark.slow
def test_a_sweep_whose_only_worker_is_killed_says_so_within_its_timeout_and_resumes_locally(tmp_path, monkeypatch,
                                                                                          capsys):
    """The only worker SIGKILLed after the first part is written: the scheduler would wait for a worker for
    ever; the sweep stops within --worker-timeout-s, one line, exit 1, the parts done kept; a rerun
    without --scheduler finishes the rest, the local sweep's bytes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from simulator.sweep import sweep_cluster

    args = [*ARGS, "--chunk", "5", "--worker-timeout-s", "5"]  # 24 chunks: most still to do at the kill
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
                                   "--no-nanny", "--nthreads", "1", "--no-dashboard"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with distributed.Client(cluster.scheduler_address) as client:
                client.wait_for_workers(1, timeout=120)
            write = sweep_cluster.write_bytes

            def write_then_kill(path, data):
                write(path, data)
                if worker.poll() is None:
                    os.kill(worker.pid, signal.SIGKILL)
                    worker.wait()

            monkeypatch.setattr(sweep_cluster, "write_bytes", write_then_kill)
            capsys.readouterr()
            start = time.monotonic()
            code = sweep([*args, "--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "dask")])
            took_s = time.monotonic() - start
        finally:
            worker.kill()
            worker.wait()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1, err
    assert "no worker for 5 s" in err and "rerun it without --scheduler" in err, err
    assert took_s < 5 + 60, took_s  # the timeout, plus a loaded machine's start-up and polls
    kept = list((tmp_path / "dask").glob("parts-chunk5/chunk-*.parquet"))
    assert 1 <= len(kept) < 24
    monkeypatch.undo()
    assert sweep([*args, "--workers", "1", "--out", str(tmp_path / "dask")]) == 0
    assert sweep([*args, "--workers", "1", "--out", str(tmp_path / "local")]) == 0
    for name in ("sweep.csv", "sweep.sha256"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "dask" / name).read_bytes(), name
