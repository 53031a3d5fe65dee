"""The shaped WAN (real/wan/wan.py): link rates, what stays inside a node, and that geodt removes
every namespace it made (normal exit, a failed build, stale leftovers of a killed run).

These need root and the kernel's netns, veth, bridge and tbf; without them they skip with
the reason real.wan.wan.missing_support() gives. Runs of the executor on the WAN (a cut link,
a killed node, Ctrl-C) are in tests/test_real_wan_failures.py.
"""
from __future__ import annotations

import os
import sys

import pytest

from real.wan import wan

MISSING = wan.missing_support()
pytestmark = [pytest.mark.wan, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

# TCP goodput over Ethernet: a 1514-byte frame carries 1448 bytes of payload (MSS with TCP
# timestamps); tbf counts whole frames, so the goodput of a shaped link is rate × 1448/1514.
FRAME_EFFICIENCY = 1448 / 1514


def _goodput(net, src: int, dst: int) -> list[float]:
    """Up to 3 measurements, stopping at the first that fills the link to within 3%.

    A shaped link only caps the rate: on a machine whose CPUs are busy (other runs) the sender
    can fall short of it, never exceed it, so a shortfall is retried and every try is kept."""
    tries = []
    for _ in range(3):
        tries.append(wan.measure_mbit(net, src, dst, seconds=3.0))
        if tries[-1] >= 0.97 * net.links[dst].link_gbps * 1e3 * FRAME_EFFICIENCY:
            break
    return tries


def test_a_50_mbit_link_carries_50_mbit(capsys):
    with wan.ShapedWan([("a", 0.05), ("b", 0.05), ("slow", 0.02)]) as net:
        up, down = _goodput(net, 0, 1), _goodput(net, 1, 0)
        slow = _goodput(net, 0, 2)  # a's 50 Mbit/s into slow's 20 Mbit/s downlink
    with capsys.disabled():
        show = lambda tries: "/".join(f"{t:.2f}" for t in tries)
        print(f"\nshaped goodput (Mbit/s, every try): a->b {show(up)}, b->a {show(down)} at 50; "
              f"a->slow {show(slow)} at 20")
    # The brief's bound (10% of the link); and, tighter, the frame-corrected goodput to within
    # 3%; no try may exceed it (the measurement's own noise is well under 3%).
    for tries, link in ((up, 50), (down, 50), (slow, 20)):
        assert abs(tries[-1] - link) <= 0.10 * link
        assert abs(tries[-1] - link * FRAME_EFFICIENCY) <= 0.03 * link * FRAME_EFFICIENCY
        assert max(tries) <= 1.03 * link * FRAME_EFFICIENCY


def test_traffic_inside_a_node_is_not_shaped():
    """Processes of one node talk to the node's own address: over its loopback, not wan0."""
    with wan.ShapedWan([("a", 0.05), ("b", 0.05)]) as net:
        before = wan.link_bytes(net.links[0])
        inside = wan.measure_mbit(net, 0, 0, seconds=1.0)
        after = wan.link_bytes(net.links[0])
    assert inside > 10 * 50  # far beyond the 50 Mbit/s link
    assert after[0] - before[0] < 10_000 and after[1] - before[1] < 10_000  # none of it crossed wan0


def test_addresses_and_names():
    with wan.ShapedWan([("a", 1.0), ("b", 0.5)], latency_ms=3.0) as net:
        names = wan.owned_namespaces(os.getpid())
        assert [link.address for link in net.links] == ["10.213.0.1", "10.213.0.2"]
        assert sorted(names) == sorted([net.bridge_ns] + [link.netns for link in net.links])
        assert all(name.startswith(f"geodt-{os.getpid()}-") for name in names)
        assert "latency not emulated" in net.describe() or "latency emulated (netem" in net.describe()
    assert wan.owned_namespaces(os.getpid()) == []


def test_a_build_that_fails_leaves_nothing_and_names_the_feature(monkeypatch):
    """A qdisc the kernel refuses: one line naming it, and the namespaces made so far are gone."""
    monkeypatch.setattr(wan, "_token_bucket", lambda rate_bps: {"rate": "1bit", "burst": 0, "limit": 0})
    with pytest.raises(wan.WanError) as info:
        with wan.ShapedWan([("a", 0.05), ("b", 0.05)]):
            pass
    assert str(info.value).startswith("--wan shaped: cannot add a tbf qdisc on n0 (tc tbf)")
    assert "\n" not in str(info.value)
    assert wan.owned_namespaces(os.getpid()) == []


def test_without_root_one_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(wan.WanError, match=r"^--wan shaped: needs root \(network namespaces, veth, bridge and tc\)"):
        with wan.ShapedWan([("a", 0.05)]):
            pass


def test_a_killed_runs_namespaces_are_removed_by_the_next_run():
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is now free: the owner of a stale namespace
    stale = f"geodt-{child.pid}-0-n0"
    live = f"geodt-{os.getpid()}-999-n0"  # owned by a live process: left alone
    for name in (stale, live):
        wan._in_thread(wan._new_namespace, name)
    try:
        with wan.ShapedWan([("a", 0.05)]):
            from pyroute2 import netns

            present = set(netns.listnetns())
            assert stale not in present and live in present
    finally:
        from pyroute2 import netns

        for name in (stale, live):
            if name in netns.listnetns():
                netns.remove(name)
