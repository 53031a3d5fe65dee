"""Whom a node blames when it loses its peers on the shaped WAN (real/wan/wan.py lost_message,
real/process/process.py _say_lost), on loopback addresses: no namespaces or root needed.

The race this pins down (seen in CI): node a notices the killed victim first, reports it and
exits; node c notices only when a's exit breaks its ring connection, and must not name a too.
"""
from __future__ import annotations

import pytest
import torch.distributed as dist

from real.process.process import _say_lost
from real.wan import wan


def _links(*names: str) -> tuple[wan.NodeLink, ...]:
    # 127.0.0.0/8 is all loopback on Linux: one address per node, nothing leaves the machine.
    return tuple(wan.NodeLink(name, f"none-{i}", f"127.0.0.{i + 2}", "lo", 0.05) for i, name in enumerate(names))


@pytest.fixture
def alive_c():
    """Node c's liveness socket is open (its process runs); a and victim listen nowhere."""
    links = _links("a", "victim", "c")
    sock = wan.serve_liveness(links[2])
    yield links
    sock.close()


def test_every_exited_peer_is_named_when_none_said_it_stopped(alive_c):
    assert wan.lost_message(alive_c, 2) == "lost contact with nodes a, victim (its processes exited)"
    assert wan.lost_message(alive_c, 0) == "lost contact with node victim (its processes exited)"


def test_a_peer_that_stopped_on_its_own_is_not_blamed(alive_c):
    message = wan.lost_message(alive_c, 2, stopped_itself=lambda node: node == "a")
    assert message == "lost contact with node victim (its processes exited)"


def test_the_first_to_stop_leaves_word_the_second_reads_it(alive_c, tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 3)
    links = alive_c
    first = _say_lost(links, 0, store)  # a: c is alive, the victim is gone
    assert first == "lost contact with node victim (its processes exited)"
    assert store.check(["geodt/stopped-on-its-own/a"])
    # c knocks after a is gone (a's address listens nowhere: exited) and finds a's word.
    second = _say_lost(links, 2, store)
    assert second == "lost contact with node victim (its processes exited)"


def test_without_a_store_the_message_still_comes(alive_c):
    assert _say_lost(alive_c, 0, None) == "lost contact with node victim (its processes exited)"


def test_a_live_peer_is_not_named():
    links = _links("a", "b")
    sock = wan.serve_liveness(links[1])
    try:
        assert wan.lost_message(links, 0) is None
    finally:
        sock.close()
