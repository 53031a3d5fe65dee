"""Failures on the shaped WAN: a node's link cut, or the node killed, in the middle of a sync.

The other nodes stop with one line naming the node they lost; every node keeps the last
complete round's checkpoint; `--resume` then completes the run with final weights bitwise
equal to an uninterrupted run's. Ctrl-C and failures leave no namespace behind.

Needs root and the kernel's netns, veth, bridge and tbf (skipped otherwise). Slow: each case
starts the executor two or three times (about a minute each on a shared 2-core machine).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from real.checkpoint.checkpoint import verified_sets, weights_digest
from real.checkpoint.ckpt_set import load_set, set_rounds
from real.wan import wan
from tests.proctree import ctrl_c_reaches_it, launcher_env
from tests.tiny_run import tiny_scenario

MISSING = wan.missing_support()
pytestmark = [pytest.mark.wan, pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

TIMEOUT_S = 10.0
SCENARIO = tiny_scenario("wan-failure", 5, network="latency_ms = 0.0\n")
# The victim's 8 Mbit/s link makes each sync about 1.4 s (1.4 MB per node in a ring of 3),
# long enough to cut it in the middle; the compute of a round is a few milliseconds.
PLAN = """strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,link_gbps
baseline,a,1,1,2,0.1,32,0.0,0.05
baseline,victim,1,1,2,0.1,32,0.0,0.008
baseline,c,1,1,2,0.1,32,0.0,0.05
"""


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "plan.csv").write_text(PLAN)
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    return tmp_path / "plan.csv", tmp_path / "scenario.toml"


def _start(tmp_path: Path, out: Path, *extra: str) -> subprocess.Popen:
    plan, scenario = _inputs(tmp_path)
    cmd = [sys.executable, "-m", "real", "--plan", str(plan), "--scenario", str(scenario), "--out", str(out),
           "--timeout-s", str(TIMEOUT_S), "--threads", "1", "--no-progress",
           "--checkpoint-every", "1", *extra]  # a set every round: how these tests see the run under way
    return subprocess.Popen(cmd, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_reaches_it)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run's final weights (on loopback: the arithmetic does not depend on
    the transport, which the resumed shaped runs below confirm bitwise)."""
    tmp = tmp_path_factory.mktemp("reference")
    proc = _start(tmp, tmp / "out")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return torch.load(tmp / "out" / "final_weights.pt", weights_only=True)


def _victim_link(pid: int) -> wan.NodeLink:
    deadline = time.monotonic() + 120
    while True:
        names = [n for n in wan.owned_namespaces(pid) if n.endswith("-n1")]
        if names:
            return wan.NodeLink("victim", names[0], "10.213.0.2", wan.NODE_IFNAME, 0.008)
        assert time.monotonic() < deadline, "the shaped WAN did not appear"
        time.sleep(0.2)


def _wait_mid_sync(proc: subprocess.Popen, out: Path, link: wan.NodeLink) -> int:
    """Once two rounds are checkpointed, wait until the victim's link is carrying a sync
    (two polls in a row at over 3 Mbit/s); returns the bytes sent so far in that burst."""
    deadline = time.monotonic() + 300
    while len(set_rounds(out, 1)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    last, busy, burst = wan.link_bytes(link)[0], 0, 0
    while busy < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
        now = wan.link_bytes(link)[0]
        flowing = now - last > 20_000  # 20 kB in 50 ms: over 3 Mbit/s, a sync; barriers are bytes
        busy, burst = (busy + 1, burst + now - last) if flowing else (0, 0)
        last = now
    return burst


def _pids_in(netns_name: str) -> list[int]:
    inode = os.stat(f"/var/run/netns/{netns_name}").st_ino
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == f"net:[{inode}]":
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _check_checkpoints(out: Path) -> int:
    """The last round every node completed is intact on every node (a set that verifies,
    loadable with weights_only) with the same global weights; returns that round count.

    A node can finish a sync (and checkpoint) before the others have received their last
    segments, so the nodes' latest files may differ by one round: resume takes the common one."""
    candidates = [verified_sets(out, i, report=False) for i in range(3)]
    common = max(set.intersection(*(set(c) for c in candidates)))
    states = [load_set(c[common][0]) for c in candidates]
    digests = {weights_digest(s["outer"]["global_flat"], s["outer"]["momentum"]) for s in states}
    assert len(digests) == 1, digests
    return common


def _resume_and_compare(tmp_path: Path, out: Path, reference: dict) -> None:
    proc = _start(tmp_path, out, "--wan", "shaped", "--resume")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    final = torch.load(out / "final_weights.pt", weights_only=True)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in final)  # bitwise
    assert wan.owned_namespaces(proc.pid) == []


def _finish(proc: subprocess.Popen, timeout_s: float) -> str:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return err


def test_a_cut_link_stops_the_others_naming_the_node_and_resume_completes(tmp_path, reference, capsys):
    out = tmp_path / "out"
    proc = _start(tmp_path, out, "--wan", "shaped")
    link = _victim_link(proc.pid)
    burst = _wait_mid_sync(proc, out, link)
    wan.set_link(link, up=False)  # the victim's cable pulled, mid-sync
    cut_at = time.monotonic()
    err = _finish(proc, TIMEOUT_S + 60)
    stopped_s = time.monotonic() - cut_at
    with capsys.disabled():
        print(f"\ncut after {burst} bytes of the sync; the run stopped {stopped_s:.1f} s later")
    assert proc.returncode == 1, err
    for survivor, rank in (("a", 0), ("c", 2)):
        assert (f"real: node {survivor} (rank {rank}): lost contact with node victim (no answer on the WAN "
                f"within {wan.LIVENESS_TIMEOUT_S:g} s: link down); stopping") in err.splitlines(), err
    # The collectives time out SHAPED_STOP_BUDGET_S early, which pays for the knock naming the
    # victim (2 s), printing and teardown: the run is over within --timeout-s of the cut.
    assert stopped_s < TIMEOUT_S
    assert not (out / "trace.csv").exists()
    assert wan.owned_namespaces(proc.pid) == []
    assert _check_checkpoints(out) >= 1
    _resume_and_compare(tmp_path, out, reference)  # a new WAN: the link is back


def test_a_node_killed_mid_sync_stops_the_others_naming_it_and_resume_completes(tmp_path, reference):
    out = tmp_path / "out"
    proc = _start(tmp_path, out, "--wan", "shaped")
    link = _victim_link(proc.pid)
    _wait_mid_sync(proc, out, link)
    victims = _pids_in(link.netns)
    assert len(victims) == 1  # the victim node's one process
    os.kill(victims[0], signal.SIGKILL)
    killed_at = time.monotonic()
    err = _finish(proc, TIMEOUT_S + 60)
    assert proc.returncode == 1, err
    assert "real: node victim (rank 1) was killed by SIGKILL" in err and "out-of-memory" not in err
    for survivor, rank in (("a", 0), ("c", 2)):
        line = f"real: node {survivor} (rank {rank}): lost contact with node victim (its processes exited); stopping"
        assert line in err.splitlines(), err
    assert time.monotonic() - killed_at < TIMEOUT_S + 20
    assert wan.owned_namespaces(proc.pid) == []
    assert _check_checkpoints(out) >= 1
    _resume_and_compare(tmp_path, out, reference)


def test_ctrl_c_removes_the_wan(tmp_path):
    out = tmp_path / "out"
    proc = _start(tmp_path, out, "--wan", "shaped")
    deadline = time.monotonic() + 300
    while not set_rounds(out, 1):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    assert len(wan.owned_namespaces(proc.pid)) == 4  # bridge + 3 nodes
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    err = _finish(proc, 60)
    assert proc.returncode == 130, err
    assert "real: interrupted; outputs of completed rounds are in the checkpoints (--resume continues)" in err
    assert wan.owned_namespaces(proc.pid) == []
