"""--host is resolved first, then judged (real/process/launch.py resolve_host, check_host_policy):
the any-address in every spelling, broadcast and multicast are refused before anything binds.

Issue 59: `--host ::ffff:0.0.0.0` was only warned about and the unauthenticated rendezvous store
then listened on 0.0.0.0; issue 58: `--host 255.255.255.255` and `224.0.0.1` warned, then hung."""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("torch")  # the executor's modules below import it (core install: skipped)

from geodt.preflight import check_host
from real.process.launch import LaunchError, check_host_policy, resolve_host

ANY = ["0.0.0.0", "0", "0x0", "0.0", "000.000.000.000", "::", "[::]", "0:0:0:0:0:0:0:0", "::0",
       "::ffff:0.0.0.0", "[::ffff:0.0.0.0]", "::ffff:0:0", "0:0:0:0:0:ffff:0.0.0.0"]
BROADCAST = ["255.255.255.255", "4294967295", "0xffffffff", "::ffff:255.255.255.255"]
MULTICAST = ["224.0.0.1", "239.255.255.250", "::ffff:224.0.0.1", "ff02::1", "ff05::2"]


@pytest.fixture
def no_binds(monkeypatch):
    """Any bind in a test is a failure: a refusal is decided before a socket exists."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"bound a socket: {args}")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    monkeypatch.setattr(socket.socket, "listen", refuse)


@pytest.mark.parametrize("host", ANY)
def test_every_spelling_of_the_any_address_is_refused_without_binding(host, no_binds):
    with pytest.raises(LaunchError, match=r"binds every interface of this machine .* or --allow-any-host$"):
        check_host(host)
    assert "unauthenticated" in check_host_policy(host, resolve_host(host), allow_any=True)


@pytest.mark.parametrize("host, kind", [(h, "broadcast") for h in BROADCAST] + [(h, "multicast") for h in MULTICAST])
def test_broadcast_and_multicast_are_refused_even_with_allow_any_host(host, kind, no_binds):
    for allow in (False, True):
        with pytest.raises(LaunchError, match=rf"^--host {host.replace('[', '.').replace(']', '.')}.*: a {kind} "
                                              r"address, which no rendezvous can listen on"):
            check_host(host, allow)


def test_an_ipv4_mapped_address_is_judged_as_the_ipv4_address_it_binds():
    assert resolve_host("::ffff:0.0.0.0") == "0.0.0.0"
    assert resolve_host("::ffff:127.0.0.1") == "127.0.0.1"
    assert resolve_host("0") == "0.0.0.0"
    assert check_host_policy("::ffff:127.0.0.1", resolve_host("::ffff:127.0.0.1"), allow_any=False) is None
    with pytest.raises(LaunchError, match=r"^--host ::ffff:0\.0\.0\.0 \(0\.0\.0\.0\): binds every interface"):
        check_host_policy("::ffff:0.0.0.0", resolve_host("::ffff:0.0.0.0"), allow_any=False)
