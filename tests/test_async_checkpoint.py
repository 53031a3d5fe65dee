"""Checkpoints of an async run (real/checkpoint/checkpoint.py, real/rounds/round_async.py): consistent cuts of the
parameter server and every node, --stop-after at a cut, and a --resume that redoes the same pushes.

The two-node runs are emulated so that the order of pushes is the run's own, not the machine's:
node b (H = 1, 20 ms steps) makes its three pushes before node a (H = 2, 300 ms steps) makes its
first, so the server applies b b b a a a in the straight run and in every resumed one."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from real.checkpoint import ckpt_set  # noqa: E402
from real.checkpoint.checkpoint import async_cuts, latest_state  # noqa: E402
from real.core.options import ExecOptions  # noqa: E402
from real.process.launch import launch  # noqa: E402
from real.rounds.round_async import Cuts  # noqa: E402
from tests.test_async_real import PLAN_HEADER, run  # noqa: E402
from tests.test_real_runs import final_weights, scenario_text  # noqa: E402

# node, batch, local steps, emulated step seconds: a's round (2 s) outlasts b's three on a loaded machine
SLOW_FAST = [("a", 2, 2, 1.0), ("b", 2, 1, 0.02)]


def _cut_node(nodes=2, rounds=5, every=None, stop_after=None, final=False, checkpoint=True):
    opts = SimpleNamespace(checkpoint=checkpoint, checkpoint_every=every, stop_after=stop_after,
                           checkpoint_final=final)
    # --checkpoint-every K reaches the spec's [training] checkpoint_every (real/process/launch.py check_inputs)
    return SimpleNamespace(plan=SimpleNamespace(nodes=[None] * nodes, rounds=rounds),
                           spec=SimpleNamespace(training=SimpleNamespace(checkpoint_every=every)), opts=opts)


def test_cuts_are_counted_in_pushes_n_per_round():
    assert async_cuts(_cut_node(every=2)).due == (4, 8)            # every 2·n pushes of 5·n
    assert async_cuts(_cut_node(every=2, final=True)).due == (4, 8, 10)
    stop = async_cuts(_cut_node(every=2, stop_after=3))
    assert stop.due == (4, 6) and stop.stop == 6                   # none after the stop cut
    assert async_cuts(_cut_node(stop_after=9)).due == (10,)        # past the run's end: its last push
    assert async_cuts(_cut_node(every=1), resumed=6).due == (8, 10)
    assert async_cuts(_cut_node(every=1, checkpoint=False, stop_after=2)).due == ()  # stops, writes none
    assert async_cuts(_cut_node()).due == ()                       # no Young/Daly default without a barrier


def test_a_cut_is_complete_when_every_node_pulled_past_it():
    cuts = Cuts(due=(4, 8, 12), stop=None, resumed=0)
    assert cuts.between(4, 12) == [8, 12] and cuts.between(0, 3) == []
    assert cuts.complete([9, 4, 20]) == 4 and cuts.complete([3, 20, 20]) == 0
    assert not cuts.stopped(100)
    assert Cuts(due=(6,), stop=6, resumed=0).stopped(6) and not Cuts(due=(6,), stop=6).stopped(5)
    assert Cuts(due=(), stop=6, resumed=6).stopped(0)  # resumed at the stop cut: nothing to do


def test_a_floor_keeps_the_sets_a_slow_node_may_still_need(tmp_path):
    parts = {"global.pt": {"x": torch.zeros(1)}, "node.pt": {"y": torch.zeros(1)}}
    for cut in (2, 4, 6, 8, 10):
        ckpt_set.write_set(tmp_path, 0, cut, "id", parts, 0.0, floor=4)
    assert sorted(ckpt_set.set_rounds(tmp_path, 0)) == [4, 6, 8, 10]  # beyond KEEP, but not before the floor
    ckpt_set.write_set(tmp_path, 0, 12, "id", parts, 0.0, floor=12)
    assert sorted(ckpt_set.set_rounds(tmp_path, 0)) == [8, 10, 12]


def write_plan(d, nodes, rounds: int = 3):
    d.mkdir()
    rows = [f"t,{name},1,{b},{h},{step_s},{b * h * 32},0.0,async" for name, b, h, step_s in nodes]
    (d / "plan.csv").write_text("\n".join([PLAN_HEADER, *rows]) + "\n")
    (d / "scenario.toml").write_text(scenario_text(rounds))
    return d


def assert_mixed_cut_refused(first, other, capfd) -> None:
    """Node b's part of `first`'s newest cut replaced by `other`'s: --resume refuses in one line."""
    node_b = ckpt_set.node_dir(first / "out", 1)
    shutil.rmtree(node_b)
    shutil.copytree(ckpt_set.node_dir(other / "out", 1), node_b)
    capfd.readouterr()
    options = ExecOptions(out_dir=str(first / "out"), threads=1, progress=False, resume=True, emulate=True)
    assert launch(first / "plan.csv", first / "scenario.toml", options) == 2
    err = capfd.readouterr().err
    assert "cut 2: node b holds another state than the server's record of it" in err and "refusing to resume" in err


def assert_same_weights(a, b) -> None:
    for got, want in zip(final_weights(a), final_weights(b), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_one_node_resumed_at_a_cut_equals_a_straight_run(tmp_path):
    nodes = [("a", 2, 3, 0.01)]
    straight = write_plan(tmp_path / "straight", nodes)
    run(straight)
    part = write_plan(tmp_path / "part", nodes)
    assert len(run(part, stop_after=1)) == 1
    assert latest_state(part / "out", 0)["server"]["version"] == 1
    trace = run(part, resume=True)
    assert list(trace["round"]) == [0, 1, 2] and list(trace["staleness"]) == [0, 0, 0]
    assert_same_weights(part, straight)


def test_two_nodes_stopped_twice_and_resumed_equal_a_straight_run(tmp_path):
    """Cut 2 (stop 1): b has pushed twice, a not yet (a's part: the start); cut 4 (stop 2): a has
    pushed once, b has finished (its part, its last pull, written at its end)."""
    straight = write_plan(tmp_path / "straight", SLOW_FAST)
    whole = run(straight, emulate=True)
    assert list(whole.sort_values("round_end_s")["node"]) == list("bbbaaa")
    part = write_plan(tmp_path / "part", SLOW_FAST)
    run(part, emulate=True, stop_after=1, checkpoint_every=1)
    a, b = latest_state(part / "out", 0), latest_state(part / "out", 1)
    assert (a["rounds_done"], a["async"]["pulled_version"], b["rounds_done"], b["async"]["pulled_version"]) == (0, 0, 2, 2)
    assert a["server"]["pulled"] == [0, 2] and a["server"]["version"] == 2
    run(part, emulate=True, resume=True, stop_after=2, checkpoint_every=1)
    a, b = latest_state(part / "out", 0), latest_state(part / "out", 1)
    assert (a["rounds_done"], b["rounds_done"], a["server"]["pushes"]) == (1, 3, [1, 3])
    trace = run(part, emulate=True, resume=True, checkpoint_every=1)
    assert_same_weights(part, straight)
    key = ["node", "round"]
    assert trace.sort_values(key)[[*key, "staleness"]].values.tolist() == \
        whole.sort_values(key)[[*key, "staleness"]].values.tolist()
    for _, rows in trace.sort_values(key).groupby("node"):  # the resumed timeline continues
        assert (rows["round_start_s"].to_numpy()[1:] >= rows["round_end_s"].to_numpy()[:-1]).all()
    assert sorted(ckpt_set.set_rounds(part / "out", 1)) == [2, 4, 6]


def test_resume_refuses_parts_of_two_different_cuts(tmp_path, capfd):
    """Node a's part from a run where b pushed first, node b's from one where a did (the same
    plan but for step times): each verifies, together they are no cut."""
    first = write_plan(tmp_path / "first", SLOW_FAST)
    run(first, emulate=True, stop_after=1)
    other = write_plan(tmp_path / "other", [(n, b, h, s) for (n, b, h, _), s in zip(SLOW_FAST, (0.02, 1.0))])
    run(other, emulate=True, stop_after=1)
    assert_mixed_cut_refused(first, other, capfd)
