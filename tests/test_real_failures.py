"""A node process that dies makes its peers stop with a clear message and a non-zero status.

The two nodes run as separate processes joined through env:// exactly as torchrun starts
them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so one can be killed from
outside.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real.checkpoint.ckpt_set import set_rounds
from tests.tiny_run import tiny_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = tiny_scenario("dead-peer", 50)
PLAN = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s
baseline,survivor,1,1,2,0.1,32,0.0
baseline,victim,1,1,2,0.1,32,0.0
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_peer_stops_the_others_with_a_message(tmp_path):
    (tmp_path / "plan.csv").write_text(PLAN)
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario",
               str(tmp_path / "scenario.toml"), "--out", str(tmp_path / f"out{rank}"), "--emulate",
               "--timeout-s", "30", "--threads", "1", "--no-progress",
               "--checkpoint-every", "1"]  # a set every round: how the test sees the run under way
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    survivor, victim = procs
    deadline = time.monotonic() + 120
    while not set_rounds(tmp_path / "out1", 1):  # the run is under way: one round done
        assert time.monotonic() < deadline and survivor.poll() is None and victim.poll() is None, \
            survivor.stderr.read() if survivor.poll() is not None else "no round finished in time"
        time.sleep(0.1)
    killed_at = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    try:
        _, err = survivor.communicate(timeout=60)  # well inside the 30 s group timeout + start-up
    finally:
        survivor.kill()
    assert survivor.returncode == 1
    assert "node survivor (rank 0): lost contact with its peers" in err
    assert time.monotonic() - killed_at < 45
    assert not (tmp_path / "out0" / "trace.csv").exists()  # no half-finished trace


def _local_run(tmp_path: Path, scenario: str, out: Path, *extra: str) -> tuple[list[str], dict]:
    """`python -m real` launching PLAN on `scenario` (both written to tmp_path) on this machine,
    and its environment: no torchrun variables, so it spawns its own workers."""
    (tmp_path / "plan.csv").write_text(PLAN)
    (tmp_path / "scenario.toml").write_text(scenario)
    cmd = [sys.executable, "-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario",
           str(tmp_path / "scenario.toml"), "--out", str(out), "--threads", "1", "--no-progress",
           "--checkpoint-every", "1", *extra]  # a set every round: how these tests see the run under way
    from tests.proctree import launcher_env

    return cmd, launcher_env()


def test_ctrl_c_exits_130_with_one_line_and_no_trace(tmp_path):
    from tests.proctree import ctrl_c_reaches_it

    out = tmp_path / "out"
    cmd, env = _local_run(tmp_path, SCENARIO, out)

    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 120
    while not set_rounds(out, 1):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    lines = [line for line in err.splitlines() if not line.startswith("real: synthetic Markov corpus")]
    assert lines == ["real: interrupted; outputs of completed rounds are in the checkpoints (--resume continues)"]
    assert not (out / "trace.csv").exists()


def _lan_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, if any."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing interface
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def test_host_binds_the_store_to_that_address_only(tmp_path):
    ip = _lan_address()
    if ip is None:
        pytest.skip("no non-loopback IPv4 address")
    from real.process.launch import launch
    from real.process.worker import ExecOptions

    (tmp_path / "plan.csv").write_text(PLAN)
    (tmp_path / "scenario.toml").write_text(SCENARIO.replace("rounds = 50", "rounds = 1"))
    seen = []
    import torch.distributed as dist

    real_store = dist.TCPStore

    def spy(host, port, *args, **kwargs):
        store = real_store(host, port, *args, **kwargs)
        fd = kwargs.get("master_listen_fd")
        if fd is not None:
            with socket.socket(fileno=os.dup(fd)) as sock:
                seen.append(sock.getsockname()[0])
        return store

    dist.TCPStore = spy
    try:
        opts = ExecOptions(out_dir=str(tmp_path / "out"), threads=1, progress=False, summary=False)
        assert launch(tmp_path / "plan.csv", tmp_path / "scenario.toml", opts, host=ip) == 0
    finally:
        dist.TCPStore = real_store
    assert seen == [ip]  # the listening socket is bound to the address asked, not 0.0.0.0


def test_torchrun_ranks_map_to_nodes_by_cumulative_devices(tmp_path):
    """Three processes as torchrun starts them (nodes of 2 and 1 devices): ranks 0-1 are node
    `pair`, rank 2 node `single`; rank 0 writes one trace row per node and round."""
    (tmp_path / "plan.csv").write_text(
        "strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s\n"
        "baseline,pair,2,1,2,0.1,64,0.0\nbaseline,single,1,2,1,0.1,32,0.0\n")
    (tmp_path / "scenario.toml").write_text(SCENARIO.replace("rounds = 50", "rounds = 2"))
    port = _free_port()
    local = {0: (0, 2), 1: (1, 2), 2: (0, 1)}  # rank: (LOCAL_RANK, LOCAL_WORLD_SIZE)
    procs = []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(local[rank][0]),
               "LOCAL_WORLD_SIZE": str(local[rank][1]), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": str(ROOT)}
        out = tmp_path / ("out_a" if rank < 2 else "out_b")  # one --out per machine
        cmd = [sys.executable, "-m", "real", "--plan", str(tmp_path / "plan.csv"), "--scenario",
               str(tmp_path / "scenario.toml"), "--out", str(out), "--timeout-s", "60", "--threads", "1",
               "--no-progress", "--checkpoint-every", "1", "--checkpoint-final"]  # the sets asserted below
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [r[1] for r in results]
    import pandas as pd

    trace = pd.read_csv(tmp_path / "out_a" / "trace.csv")
    assert list(trace["node"]) == ["pair", "single", "pair", "single"]
    assert list(trace["tokens"][:2]) == [64, 32]
    assert "final_loss" in results[0][0]  # rank 0 prints the summary
    assert set_rounds(tmp_path / "out_a", 0) and set_rounds(tmp_path / "out_b", 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, prctl)")
def test_a_killed_launcher_takes_its_workers_with_it(tmp_path):
    """The local launcher's workers ignore SIGINT (it alone handles Ctrl-C), which drops the SIGINT
    torch asks the kernel for when their parent dies: a SIGKILLed launcher left them training
    until their collectives timed out (--timeout-s, 300 s here). Now they go with it."""
    from tests.proctree import kill_parent_once_ready

    cmd, env = _local_run(tmp_path, SCENARIO.replace("rounds = 50", "rounds = 500"), tmp_path / "out",
                          "--emulate", "--timeout-s", "300")
    parent = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left = kill_parent_once_ready(parent, 2, lambda pids: bool(set_rounds(tmp_path / "out", 1)))  # a round done: training
    assert left == [], f"workers {left} outlived their killed launcher"
