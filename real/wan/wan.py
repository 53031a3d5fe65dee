"""The shaped WAN (`--wan shaped`): every node in a network namespace of its own, its link
shaped to the plan's `link_gbps` both ways, all nodes joined by a bridge.

Layout (all built with netlink through pyroute2; nothing is shelled out):

    namespace geodt-<pid>-<k>-wan        bridge br0, veth ends n0 .. n{N-1} (no address)
    namespace geodt-<pid>-<k>-n<i>       lo, and wan0 = the other end of n<i>: 10.213.0.<i+1>/24

The namespaces and their addresses exist only inside geodt: 10.213.0.0/24 is on no host
interface, no namespace has a default route, and the bridge namespace has no address, so
nothing reaches out of the WAN or into it. A node's processes enter its namespace before
they create any socket (enter()); gloo binds to wan0 there (GLOO_SOCKET_IFNAME). Traffic
between processes of one node goes to the node's own address, which the kernel routes
over the namespace's loopback: it never touches wan0 or its shaping. Traffic between nodes
leaves through wan0 and arrives through the bridge.

Shaping: a token bucket (tbf) of rate link_gbps on each node's wan0 (its egress) and on its
bridge-side end n<i> (whose egress is the node's ingress), so each node's uplink and
downlink are its link, as the simulator models them. What is real: bandwidth, queueing in
the bucket's queue, TCP's congestion control and retransmission, the CPU cost of the
kernel's network stack. What is not: latency, unless the kernel has the netem qdisc; then
each direction also gets netem delay latency_ms / 2 under the bucket (a packet crosses two
shaped interfaces, so the one-way delay is latency_ms). This module probes for netem and
says which in describe().

Lifecycle: ShapedWan is a context manager; leaving it (normal exit, error, Ctrl-C) deletes
its namespaces, which takes the veth pairs, the bridge and every qdisc with them once no
process is left inside. Names carry the owning process id: remove_stale() deletes what a
killed run left (prefix match, owner no longer alive) and runs before every build.
"""
from __future__ import annotations

import csv
import ctypes
import ipaddress
import itertools
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from formats.owners import pid_alive

PREFIX = "geodt-"
SUBNET = ipaddress.ip_network("10.213.0.0/24")
NODE_IFNAME = "wan0"
BRIDGE = "br0"
LIVENESS_PORT = 29399      # each node leader listens here in its namespace (see lost_nodes)
LIVENESS_TIMEOUT_S = 2.0   # how long a peer's link may stay silent before it counts as down
MAX_NODES = SUBNET.num_addresses - 3
_STALE = re.compile(rf"^{re.escape(PREFIX)}(\d+)-\d+-")
_serial = itertools.count()


class WanError(RuntimeError):
    """The shaped WAN cannot be built here; str() is the one-line report (what is missing)."""


@dataclass(frozen=True)
class NodeLink:
    """Where one node's processes live on the shaped WAN."""

    node: str
    netns: str       # namespace name (under /var/run/netns)
    address: str     # its IPv4 address on wan0
    ifname: str      # the interface gloo binds to inside the namespace
    link_gbps: float


def _pyroute2():
    try:
        import pyroute2  # noqa: PLC0415  deferred: pyroute2 (the real extra) only with --wan shaped
        from pyroute2 import netns  # noqa: PLC0415  deferred: pyroute2 (the real extra) only with --wan shaped
    except ImportError:
        raise WanError("--wan shaped: needs pyroute2 (pip install 'geodt[real]')") from None
    return pyroute2, netns


def remove_stale() -> list[str]:
    """Delete geodt namespaces whose owning process is gone; returns their names."""
    _, netns = _pyroute2()
    removed = []
    for name in sorted(netns.listnetns()):
        match = _STALE.match(name)
        if match and not pid_alive(int(match.group(1))):
            try:
                netns.remove(name)
            except OSError:
                continue  # another run removed it first
            removed.append(name)
    return removed


def owned_namespaces(pid: int) -> list[str]:
    """The namespaces a geodt process `pid` holds now (for tests and for cleanup checks)."""
    _, netns = _pyroute2()
    return sorted(n for n in netns.listnetns() if n.startswith(f"{PREFIX}{pid}-"))


def _step(what: str, fn, *args, **kwargs):
    """Run one netlink step; a failure becomes one line naming the kernel feature."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # NetlinkError, OSError: either way the feature is missing
        reason = getattr(exc, "strerror", None) or (str(exc).strip() or type(exc).__name__)
        raise WanError(f"--wan shaped: cannot {what} ({reason}); this kernel or container lacks it") from None


def _token_bucket(rate_bps: float) -> dict:
    """tbf settings for a rate: a burst of 2 ms (at least 32 KiB: a TSO segment must fit) and a
    queue of 20 ms (at least 4 bursts), like a modest router's buffer."""
    rate_bytes = rate_bps / 8
    burst = max(32 * 1024, int(rate_bytes * 0.002))
    return {"rate": f"{int(rate_bps)}bit", "burst": burst, "limit": max(4 * burst, int(rate_bytes * 0.02))}


def _shape(ns, ifname: str, rate_bps: float, delay_ms: float) -> None:
    index = ns.link_lookup(ifname=ifname)[0]
    _step(f"add a tbf qdisc on {ifname} (tc tbf)", ns.tc, "add", "tbf", index=index, handle="1:",
          **_token_bucket(rate_bps))
    if delay_ms > 0:
        _step(f"add a netem qdisc under tbf on {ifname}", ns.tc, "add", "netem", index=index, parent="1:1",
              handle="10:", delay=round(delay_ms * 1000))


class ShapedWan:
    """Build the shaped WAN for nodes [(name, link_gbps)], remove it on leaving.

    `latency_ms` (the scenario's one-way latency) is emulated only where netem exists."""

    def __init__(self, nodes: list[tuple[str, float]], latency_ms: float = 0.0):
        if not 1 <= len(nodes) <= MAX_NODES:
            raise WanError(f"--wan shaped: expected 1 to {MAX_NODES} nodes, got {len(nodes)}")
        self.nodes = list(nodes)
        self.latency_ms = float(latency_ms)
        self.netem = False
        base = f"{PREFIX}{os.getpid()}-{next(_serial)}"
        self.bridge_ns = f"{base}-wan"
        hosts = list(SUBNET.hosts())
        self.links = tuple(NodeLink(name, f"{base}-n{i}", str(hosts[i]), NODE_IFNAME, float(gbps))
                           for i, (name, gbps) in enumerate(nodes))
        self._created: list[str] = []

    # --- building -------------------------------------------------------------------------
    def __enter__(self) -> ShapedWan:
        if os.geteuid() != 0:
            raise WanError("--wan shaped: needs root (network namespaces, veth, bridge and tc); "
                           "run as root or use --wan loopback")
        remove_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create_ns(self, name: str) -> None:
        _step("create a network namespace (netns)", _in_thread, _new_namespace, name)
        self._created.append(name)

    def _build(self) -> None:
        self._create_ns(self.bridge_ns)
        for link in self.links:
            self._create_ns(link.netns)
        self.netem = self.latency_ms > 0 and _in_thread(_inside, self.bridge_ns, _has_netem)
        delay_ms = self.latency_ms / 2 if self.netem else 0.0
        _in_thread(_inside, self.bridge_ns, _build_bridge, self.links, delay_ms)
        for link in self.links:
            _in_thread(_inside, link.netns, _build_node, link, delay_ms)

    def close(self) -> None:
        """Delete every namespace this WAN created (idempotent)."""
        if not self._created:
            return
        _, netns = _pyroute2()
        for name in reversed(self._created):
            try:
                netns.remove(name)
            except OSError:
                pass
        self._created = []

    # --- reporting ------------------------------------------------------------------------
    @property
    def latency_note(self) -> str:
        if self.netem:
            return f"latency emulated (netem, {self.latency_ms:g} ms one way)"
        if self.latency_ms > 0:
            return (f"latency not emulated (no netem qdisc in this kernel; the scenario's {self.latency_ms:g} ms "
                    f"is absent)")
        return "latency not emulated (the scenario's latency is 0 ms)"

    def describe(self) -> str:
        links = ", ".join(f"{link.node} {link.link_gbps * 1e3:g} Mbit/s" for link in self.links)
        return f"shaped WAN (tbf each way): {links}; {self.latency_note}"


def _in_thread(fn, *args):
    """fn(*args) in a thread of its own, which may change network namespace and then ends.

    Namespace work happens in threads, not forked children (pyroute2's way): forking a
    process that runs threads (torch's, tqdm's) can deadlock the child on a lock some other
    thread held. A thread's network namespace is its own (setns/unshare act per thread)."""
    result: dict = {}

    def body():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the caller
            result["error"] = exc

    thread = threading.Thread(target=body, name="geodt-netns", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _new_namespace(name: str) -> None:
    """Create a network namespace and name it (bind-mounted under /var/run/netns)."""
    _, netns = _pyroute2()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(netns.CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    netns.attach(name, "thread-self")  # this thread's namespace, not the process's


def _inside(name: str, fn, *args):
    """fn(ipr, *args) with an IPRoute socket opened inside namespace `name` (call in a thread)."""
    pyroute2, netns = _pyroute2()
    netns.setns(name, flags=0)
    with pyroute2.IPRoute() as ipr:
        return fn(ipr, *args)


def _build_bridge(br, links, delay_ms: float) -> None:
    _step("create a bridge (bridge)", br.link, "add", ifname=BRIDGE, kind="bridge")
    bridge = br.link_lookup(ifname=BRIDGE)[0]
    br.link("set", index=bridge, state="up")
    for i, link in enumerate(links):
        end = f"n{i}"
        _step("create a veth pair into a namespace (veth)", br.link, "add", ifname=end, kind="veth",
              peer={"ifname": link.ifname, "net_ns_fd": link.netns})
        index = br.link_lookup(ifname=end)[0]
        br.link("set", index=index, master=bridge)
        br.link("set", index=index, state="up")
        _shape(br, end, link.link_gbps * 1e9, delay_ms)  # the node's ingress


def _build_node(ns, link, delay_ms: float) -> None:
    ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
    index = ns.link_lookup(ifname=link.ifname)[0]
    ns.addr("add", index=index, address=link.address, prefixlen=SUBNET.prefixlen)
    ns.link("set", index=index, state="up")
    _shape(ns, link.ifname, link.link_gbps * 1e9, delay_ms)  # the node's egress


def _has_netem(ns) -> bool:
    """Whether the kernel has the netem qdisc: add one on the bridge namespace's lo, remove it."""
    lo = ns.link_lookup(ifname="lo")[0]
    try:
        ns.tc("add", "netem", index=lo, handle="1:", delay=1000)
    except Exception:  # ENOENT: no such qdisc kind
        return False
    ns.tc("del", index=lo, handle="1:")
    return True


# --- inside the namespaces ---------------------------------------------------------------
def enter(link: NodeLink) -> None:
    """Move this process into the node's namespace; call before any socket is created (and
    before threads that will make sockets start: the namespace is per thread)."""
    _, netns = _pyroute2()
    netns.setns(link.netns, flags=0)
    os.environ["GLOO_SOCKET_IFNAME"] = link.ifname


def serve_liveness(link: NodeLink) -> socket.socket:
    """A listening socket on the node's address: while it is open, peers' connects succeed
    (the kernel answers the handshake; nothing is read), so they can tell a live node from a
    dead one (refused) or from one whose link is down (no answer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((link.address, LIVENESS_PORT))
    sock.listen(64)
    return sock


def _knock(address: str, timeout_s: float) -> str:
    try:
        with socket.create_connection((address, LIVENESS_PORT), timeout=timeout_s):
            return "alive"
    except ConnectionRefusedError:
        return "exited"
    except OSError:  # timeout, unreachable: the link does not answer
        return "silent"


def lost_nodes(links: tuple[NodeLink, ...], me: int, timeout_s: float = LIVENESS_TIMEOUT_S) -> tuple[list, list]:
    """(nodes whose link does not answer, nodes whose processes are gone), knocking on every
    other node at once."""
    answers: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, _knock(links[i].address, timeout_s)))
               for i in range(len(links)) if i != me]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    silent = [links[i].node for i in sorted(answers) if answers[i] == "silent"]
    exited = [links[i].node for i in sorted(answers) if answers[i] == "exited"]
    return silent, exited


def lost_message(links: tuple[NodeLink, ...], me: int,
                 stopped_itself: Callable[[str], bool] = lambda node: False) -> str | None:
    """What a node that lost its peers says about whom it lost, or None if all still answer.
    `stopped_itself(node)`: whether that node left on its own after losing a peer (it says so
    before it exits), so that its exit is not blamed for the failure it reported."""
    silent, exited = lost_nodes(links, me)
    exited = [node for node in exited if not stopped_itself(node)]
    if silent:
        return (f"lost contact with node{'s' if len(silent) > 1 else ''} {', '.join(silent)} "
                f"(no answer on the WAN within {LIVENESS_TIMEOUT_S:g} s: link down)")
    if exited:
        return f"lost contact with node{'s' if len(exited) > 1 else ''} {', '.join(exited)} (its processes exited)"
    return None


def set_link(link: NodeLink, up: bool) -> None:
    """Bring a node's wan0 down (its cable pulled) or up again, inside its namespace."""
    def flip(ns):
        ns.link("set", index=ns.link_lookup(ifname=link.ifname)[0], state="up" if up else "down")

    _in_thread(_inside, link.netns, flip)


# --- measuring a link --------------------------------------------------------------------
def _receive(link: NodeLink, port: int, ready: threading.Event, out: dict) -> None:
    """Count what one connection brings; bits/s between the first and the last read."""
    _, netns = _pyroute2()
    netns.setns(link.netns, flags=0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind((link.address, port))
        srv.listen(1)
        ready.set()
        conn, _ = srv.accept()
        with conn:
            total, first, last = 0, None, None
            while data := conn.recv(1 << 20):
                now = time.perf_counter()
                first = now if first is None else first
                total, last = total + len(data), now
    out["bits_per_s"] = 8 * total / (last - first) if first is not None and last > first else 0.0


def _send(link: NodeLink, address: str, port: int, seconds: float) -> None:
    _, netns = _pyroute2()
    netns.setns(link.netns, flags=0)
    payload = b"\0" * (1 << 16)
    with socket.create_connection((address, port), timeout=10) as s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(payload)


def measure_mbit(wan: ShapedWan, src: int, dst: int, seconds: float = 3.0) -> float:
    """Goodput of one TCP stream from node src to node dst over the shaped WAN, Mbit/s (bytes
    the receiver got between its first and last read). Sender and receiver are threads, each
    in its node's namespace."""
    port, ready, out = LIVENESS_PORT - 1, threading.Event(), {}
    receiver = threading.Thread(target=_receive, args=(wan.links[dst], port, ready, out), daemon=True)
    receiver.start()
    if not ready.wait(10):
        raise WanError("--wan shaped: the throughput probe's receiver did not start")
    _in_thread(_send, wan.links[src], wan.links[dst].address, port, seconds)
    receiver.join(timeout=seconds + 20)
    return out.get("bits_per_s", 0.0) / 1e6


# --- a run on the shaped WAN -------------------------------------------------------------
WAN_COLUMNS = ["node", "address", "link_gbps", "shaping", "latency_ms", "latency_emulated"]


def write_description(wan: ShapedWan, path) -> None:
    """wan.csv: what the run's network was, per node (whole or not at all); latency_ms is the
    scenario's one-way latency, latency_emulated whether netem added it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(WAN_COLUMNS)
        for link in wan.links:
            writer.writerow([link.node, link.address, f"{link.link_gbps:g}", "tbf egress+ingress",
                             f"{wan.latency_ms:g}", str(wan.netem).lower()])
    os.replace(tmp, path)


def network_note(out_dir) -> str:
    """How a run's network is described in its outputs: loopback, or shaped with or without latency."""
    path = Path(out_dir) / "wan.csv"
    if not path.exists():
        return "loopback"
    with open(path, newline="") as f:
        emulated = {row["latency_emulated"] for row in csv.DictReader(f)} == {"true"}
    return f"shaped WAN (latency {'emulated' if emulated else 'not emulated'})"


def shaped_run(spec, plan, out_dir, run) -> int:
    """Build the WAN for the plan, run(links) inside it, remove it on every way out (normal
    exit, error, Ctrl-C, SIGTERM); returns run's status, 2 when the WAN cannot be built."""
    wan = ShapedWan([(node.node, node.link_gbps) for node in plan.nodes], latency_ms=spec.network.latency_ms)
    previous = None
    try:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        wan.__enter__()
        print(f"real: {wan.describe()}", file=sys.stderr, flush=True)
        write_description(wan, os.path.join(out_dir, "wan.csv"))
        return run(wan.links)
    except WanError as exc:
        print(f"real: {exc}", file=sys.stderr)
        return 2
    finally:
        wan.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # the launcher stops its children, then the WAN is removed


def link_bytes(link: NodeLink) -> tuple[int, int]:
    """(bytes sent, bytes received) on the node's wan0 so far."""
    def read(ns):
        stats = ns.get_links(ns.link_lookup(ifname=link.ifname)[0])[0].get("IFLA_STATS64")
        return int(stats["tx_bytes"]), int(stats["rx_bytes"])

    return _in_thread(_inside, link.netns, read)


def missing_support() -> str | None:
    """None if a shaped WAN can be built here, else the one-line reason (for skips)."""
    try:
        with ShapedWan([("probe", 0.01)]):
            return None
    except WanError as exc:
        return str(exc)
