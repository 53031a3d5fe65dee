"""Checkpoints of a quorum run (real/rounds/round_quorum.py, real/checkpoint/checkpoint.py): consistent cuts counted in
arrivals, where a push still waiting for its close is left out and a late push the next close will
merge is kept; --stop-after at a cut, and a --resume that redoes the same pushes.

The two-node runs are emulated so that the order of arrivals is the run's own, not the machine's:
node b (H = 1, 20 ms steps) makes its three pushes before node a (H = 2, 1 s steps) makes its
first. With a quorum of one and no grace window each of b's pushes closes a round on the timer
(b b b); a's first push is late (staleness 3) and rides on the close its second push brings at once,
as does its third (a a a)."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from formats.plan import QuorumSettings

torch = pytest.importorskip("torch")

from real.checkpoint import ckpt_set  # noqa: E402
from real.checkpoint.checkpoint import latest_state  # noqa: E402
from real.core.options import ExecOptions  # noqa: E402
from real.process.launch import launch  # noqa: E402
from real.rounds.round_async import Cuts  # noqa: E402
from real.rounds.round_quorum import Push, QuorumServer, past_stop  # noqa: E402
from tests.test_async_checkpoint import assert_mixed_cut_refused  # noqa: E402
from tests.test_async_real import PLAN_HEADER  # noqa: E402
from tests.test_real_runs import final_weights, scenario_text  # noqa: E402

# node, batch, local steps, emulated step seconds: a's round (2 s) outlasts b's three on a loaded machine
SLOW_FAST = [("a", 2, 2, 1.0), ("b", 2, 1, 0.02)]


def _server(n: int, quorum: float, cuts: Cuts, rounds: int = 3) -> QuorumServer:
    """A server without threads or wire: the tests call its decisions one by one."""
    plan = SimpleNamespace(nodes=[None] * n, quorum=QuorumSettings(quorum, 100.0))
    parts = SimpleNamespace(plan=plan, diloco=SimpleNamespace(averaging="uniform", outer_lr=0.7, outer_momentum=0.9),
                            outer=SimpleNamespace(global_flat=torch.zeros(4)))
    server = QuorumServer(parts, rounds, None, grace_s=100.0, pad_s=0.0)
    server.set_cuts(cuts)
    return server


def _push(server: QuorumServer, node: int, value: float) -> None:
    server._arrive(Push(node, torch.full((4,), value), 0.0))


def test_a_cut_leaves_out_waiting_pushes_and_keeps_late_ones():
    """Node 1 waits at cut 1 (its push left out: its node redoes it); at cut 3 node 0's late push
    (replied: in its snapshot) is kept for the next close. A server restored from cut 3 then makes
    the same close as the one that went on."""
    server = _server(2, 0.5, Cuts(due=(1, 2, 3)))
    _push(server, 1, 1.0)
    assert server.recorded[1]["arrived"] == [0, 0] and server.recorded[1]["late_nodes"] == []
    server._close(2)  # the grace timer: after cut 1, so its reply is marked 2
    assert server.marks == [0, 2] and server.version == 1
    _push(server, 1, 2.0)
    assert server.recorded[2]["arrived"] == [0, 1] and server.recorded[2]["version"] == 1
    server._close(3)
    _push(server, 0, 3.0)  # late: pulled nothing since the start, two closes ago
    cut = server.take_recorded(3)
    assert (cut["arrived"], cut["late_nodes"], cut["marks"], cut["version"]) == ([1, 2], [0], [3, 3], 2)
    assert server.complete == 2  # both nodes' replies show cut 2 taken: both have written it
    restored = _server(2, 0.5, Cuts(due=(), resumed=3))
    restored.load_state_dict(cut)
    for each in (server, restored):
        _push(each, 1, 4.0)
        each._close(5)
    torch.testing.assert_close(restored.state.global_flat, server.state.global_flat, rtol=0, atol=0)
    assert restored.version == server.version == 3


def test_a_node_stopped_at_the_stop_cut_is_no_longer_coming():
    """Nodes 1 and 2 stop at the close after the stop cut, node 0 at its late reply; nobody can
    still come, so its push closes at once and the server is done (none waits for a stopped node)."""
    server = _server(3, 0.5, Cuts(due=(2,), stop=2))
    _push(server, 1, 1.0)
    _push(server, 2, 2.0)
    assert server.recorded[2]["arrived"] == [0, 0, 0]  # both wait at the cut
    server._close(3)
    assert server.stopped == [False, True, True]
    _push(server, 0, 3.0)
    assert server.stopped == [True, True, True] and server.version == 2 and server._finished()


def test_a_node_stops_only_once_the_stop_cut_is_taken():
    cuts = Cuts(due=(4,), stop=4)
    assert not past_stop(cuts, 4) and past_stop(cuts, 5) and not past_stop(Cuts(), 100)
    assert past_stop(Cuts(due=(), stop=4, resumed=4), 0)  # resumed at the stop cut: nothing to do


def write_plan(d, nodes, rounds: int = 3, quorum: float = 0.5, grace_s: float = 0.0):
    d.mkdir()
    rows = [f"t,{name},1,{b},{h},{step_s},{b * h * 32},0.0,quorum,{quorum},{grace_s}" for name, b, h, step_s in nodes]
    (d / "plan.csv").write_text("\n".join([PLAN_HEADER + ",quorum,grace_s", *rows]) + "\n")
    (d / "scenario.toml").write_text(scenario_text(rounds))
    return d


def launch_in(d, **opts) -> pd.DataFrame:
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False, emulate=True, **opts)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return pd.read_csv(d / "out" / "trace.csv")


def test_two_nodes_stopped_twice_and_resumed_equal_a_straight_run(tmp_path):
    """Cut 2 (stop 1): b waits for its second push's close (left out: b's part is its first pull,
    and it redoes the push), a has not pushed. Cut 4 (stop 2): a's first push is late and waits
    for the next close in the server's part; b has finished."""
    straight = write_plan(tmp_path / "straight", SLOW_FAST)
    whole = launch_in(straight)
    assert list(whole.sort_values("round_end_s")["node"]) == list("bbbaaa")
    part = write_plan(tmp_path / "part", SLOW_FAST)
    launch_in(part, stop_after=1, checkpoint_every=1)
    a, b = latest_state(part / "out", 0), latest_state(part / "out", 1)
    assert (a["rounds_done"], b["rounds_done"], a["server"]["arrived"], a["server"]["version"]) == (0, 1, [0, 1], 1)
    launch_in(part, resume=True, stop_after=2, checkpoint_every=1)
    a, b = latest_state(part / "out", 0), latest_state(part / "out", 1)
    assert (a["rounds_done"], b["rounds_done"], a["server"]["arrived"], a["server"]["late_nodes"]) == (1, 3, [1, 3], [0])
    trace = launch_in(part, resume=True, checkpoint_every=1)
    for got, want in zip(final_weights(part), final_weights(straight), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    key = ["node", "round"]
    assert trace.sort_values(key)[[*key, "staleness"]].values.tolist() == \
        whole.sort_values(key)[[*key, "staleness"]].values.tolist()
    assert sorted(ckpt_set.set_rounds(part / "out", 1)) == [2, 4, 6]


def test_resume_refuses_parts_of_two_different_cuts(tmp_path, capfd):
    """Node a's part from a run where b pushed first (b's part: its first pull), node b's from one
    where a did (b's part: the start; the same plan but for step times): each verifies, together
    they are no cut."""
    first = write_plan(tmp_path / "first", SLOW_FAST)
    launch_in(first, stop_after=1)
    # b at 1 s a step: a's four steps come first even where the machine is slower than 20 ms a step
    other = write_plan(tmp_path / "other", [(n, b, h, s) for (n, b, h, _), s in zip(SLOW_FAST, (0.02, 1.0))])
    launch_in(other, stop_after=1)
    assert (latest_state(first / "out", 1)["rounds_done"], latest_state(other / "out", 1)["rounds_done"]) == (1, 0)
    assert_mixed_cut_refused(first, other, capfd)
