"""Checkpoints that cost what they must: the Young/Daly cadence (formats/scenario.py), no final
set unless asked, digests named in the manifest, and a resume that falls back past a set that
verifies but does not load (real/checkpoint/checkpoint.py, real/checkpoint/ckpt_set.py)."""
from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from formats.rounds import KINDS, round_kind
from formats.scenario import rounds_between_checkpoints, young_daly_interval_s
from formats.sections import MTBF_S_DEFAULT
from real.checkpoint import checkpoint, ckpt_set


def test_the_young_daly_interval_by_arithmetic():
    # sqrt(2 * 2 * 3600) - 2 = 120 - 2
    assert young_daly_interval_s(2.0, 3600.0) == pytest.approx(118.0, abs=1e-12)
    assert young_daly_interval_s(0.5, MTBF_S_DEFAULT) == pytest.approx(math.sqrt(86400.0) - 0.5, abs=1e-9)
    assert young_daly_interval_s(8000.0, 3600.0) == 3600.0  # Daly: a checkpoint of >= 2 MTBF, one per MTBF
    # 118 s of work in 10 s rounds: 11.8 -> 12 rounds; a round longer than the interval: every round
    assert rounds_between_checkpoints(2.0, 3600.0, 10.0) == 12
    assert rounds_between_checkpoints(2.0, 3600.0, 500.0) == 1


def test_the_simulator_prices_the_same_cadence():
    from simulator.models.checkpoints import CheckpointCost

    cost = CheckpointCost(every=None, snapshot_s=0.5, write_s=1.5, note="", mtbf_s=3600.0)
    rounds = np.full(30, 10.0)
    assert cost.rounds_every(rounds) == 12  # as above: 2 s a checkpoint, 10 s a round
    assert np.flatnonzero(cost.due(rounds)).tolist() == [11, 23]  # every 12th round


class _Groups:
    def __init__(self):
        self.maxed, self.node_maxed = [], []

    def max_float(self, value):
        self.maxed.append(value)
        return value

    def node_max(self, value):
        self.node_maxed.append(value)
        return value


def _node(every=None, stop_after=None, final=False, mtbf_s=3600.0, sync="diloco", on_node_loss="stop"):
    """A node's checkpointer on a stand-in of its state (real/rounds/state.py NodeState)."""
    opts = SimpleNamespace(checkpoint=True, checkpoint_every=every, checkpoint_final=final, stop_after=stop_after,
                           on_node_loss=on_node_loss)
    # --checkpoint-every K reaches the spec's [training] checkpoint_every (real/process/launch.py check_inputs)
    spec = SimpleNamespace(training=SimpleNamespace(checkpoint_every=every),
                           simulation=SimpleNamespace(mtbf_s=mtbf_s))
    return checkpoint.Checkpointer(SimpleNamespace(opts=opts, spec=spec, rounds_done=0, is_leader=False, rank=1,
                                                   groups=_Groups(),
                                                   plan=SimpleNamespace(round_kind=round_kind(sync), sync=sync)))


def _due_rounds(node, last):
    due = []
    for done in range(node.state.rounds_done + 1, last + 1):
        node.state.rounds_done = done
        if node.due_here(last):
            due.append(done)
    return due


def test_a_quorum_run_snapshots_every_round_while_a_cut_is_due():
    """Its nodes end rounds apart: its sets are cuts counted in arrivals (tests/test_quorum_checkpoint.py),
    each node snapshotting at every pull until it has written its part of the last one."""
    from real.rounds.round_async import Cuts

    node = _node(every=1, final=True, sync="quorum")
    node.cuts, node.written = Cuts(due=(2, 4)), 0
    assert _due_rounds(node, 5) == [1, 2, 3, 4, 5]
    node.state.rounds_done, node.written = 0, 4
    assert _due_rounds(node, 5) == []


def test_a_fixed_cadence_writes_no_final_set_unless_asked_or_stopping_early():
    assert _due_rounds(_node(every=3), 7) == [3, 6]
    assert _due_rounds(_node(every=3, final=True), 7) == [3, 6, 7]
    assert _due_rounds(_node(every=3, stop_after=5), 5) == [3, 5]


def test_the_default_cadence_follows_young_daly_from_the_second_round(monkeypatch):
    clock = iter([100.0, 110.0])  # the first round's end, then the next: 10 s a round
    monkeypatch.setattr(checkpoint.time, "perf_counter", lambda: next(clock))
    node = _node()
    node.state.rounds_done = 4  # resumed after round 4: the cadence counts from the first round run here
    # a non-leader brings 0 s; the leader's timed 2 s checkpoint wins the max: stand it in directly
    node.state.groups.max_float = lambda value: {0.0: 2.0}.get(value, value)
    assert _due_rounds(node, 40) == [17, 29]
    assert node.every == 12
    node = _node(stop_after=30)
    node.state.groups.max_float = lambda value: {0.0: 2.0}.get(value, value)
    clock = iter([100.0, 110.0])
    assert _due_rounds(node, 30) == [13, 25, 30]  # and the round --stop-after stops at


def test_under_continue_each_node_chooses_its_cadence_alone(monkeypatch):
    """--on-node-loss continue: no collective over the run in the choice (a joiner times its first round
    later than the members, so a max over the group would pair with none); the node's own cost and
    round, agreed over its processes (a sharded node's all take part in each set), in nanoseconds."""
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(checkpoint.time, "perf_counter", lambda: next(clock))
    node = _node(on_node_loss="continue")
    node.state.is_leader = True
    node.writer = SimpleNamespace(wait=lambda: (None, 2.0), submit=lambda fn, row: None)  # its own 2 s probe
    assert _due_rounds(node, 40) == [13, 25, 37]
    assert node.every == 12 and node.state.groups.maxed == []
    assert node.state.groups.node_maxed == [2_000_000_000, 10_000_000_000]


@pytest.mark.parametrize("kind", ["diloco", "streaming"])
def test_a_checkpoint_cost_is_timed_on_a_stand_in_and_scaled_by_bytes(tmp_path, monkeypatch, kind):
    seen = []

    def timed(params, repeats, device, directory):
        seen.append((params, repeats, directory))
        return [0.25], [0.75]

    monkeypatch.setattr(checkpoint, "time_checkpoint", timed)
    node = SimpleNamespace(layout=None, outer=SimpleNamespace(global_flat=torch.empty(3 * checkpoint.PROBE_PARAMS)),
                           opts=SimpleNamespace(out_dir=str(tmp_path)), index=1, device=torch.device("cpu"),
                           kind=KINDS[kind])
    cost = checkpoint.probe_cost_s(node)
    assert seen == [(checkpoint.PROBE_PARAMS, 1, ckpt_set.node_dir(tmp_path, 1))]
    # a streaming node's set holds the model's own weights too: its whole set is the bigger
    big = ckpt_set.set_bytes(3 * checkpoint.PROBE_PARAMS, kind == "streaming")
    small = ckpt_set.set_bytes(checkpoint.PROBE_PARAMS, False)
    assert cost == pytest.approx(1.0 * big / small, rel=1e-12)


def test_sets_digested_with_sha256_before_blake2b_still_verify(tmp_path):
    parts = {"global.pt": {"format": 4, "rounds_done": 1, "outer": {"w": torch.ones(3)}}, "node.pt": {"rounds_done": 1}}
    ckpt_set.write_set(tmp_path, 0, 1, "run", parts, 0.0)
    directory = ckpt_set.set_dir(tmp_path, 0, 1)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["digest"] == "blake2b" and set(manifest["files"]["node.pt"]) == {"blake2b", "bytes"}
    del manifest["digest"]  # as an older geodt wrote it: sha256, and no `digest`
    for name in ckpt_set.PARTS:
        manifest["files"][name] = {"sha256": ckpt_set.file_digest(directory / name, "sha256")[0],
                                   "bytes": (directory / name).stat().st_size}
    manifest["manifest_sha256"] = ckpt_set._manifest_digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert ckpt_set.verify(directory, 1, 0)["files"]["global.pt"]["sha256"]
    data = bytearray((directory / "node.pt").read_bytes())
    data[len(data) // 2] ^= 0x10
    (directory / "node.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"node.pt fails its sha256 digest"):
        ckpt_set.verify(directory, 1, 0)


class _NotAWeight:
    pass


def _reseal(directory) -> None:
    """Rewrite the manifest so that every file passes its digest again."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for name in ckpt_set.PARTS:
        digest, size = ckpt_set.file_digest(directory / name, manifest["digest"])
        manifest["files"][name] = {manifest["digest"]: digest, "bytes": size}
    manifest["manifest_sha256"] = ckpt_set._manifest_digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))


@pytest.mark.parametrize("kind", ["unpickles", "restores"])
def test_a_set_that_verifies_but_does_not_load_falls_back_to_the_previous_bitwise(tmp_path, capfd, kind):
    from tests.test_faults import _inputs, _launch, _same, _weights

    d = _inputs(tmp_path / "in", rounds=4)
    assert _launch(d, tmp_path / "whole") == 0
    out = tmp_path / "out"
    assert _launch(d, out, stop_after=3) == 0
    victim = ckpt_set.set_dir(out, 1, 3)
    state = torch.load(victim / "node.pt", weights_only=True)
    if kind == "unpickles":  # torch.load(weights_only=True) refuses it
        state["trace"] = _NotAWeight()
    else:  # loads, but the optimizer state does not fit the model
        state["inner_optimizer"]["state"] = {0: {"exp_avg": torch.zeros(1)}}
    torch.save(state, victim / "node.pt")
    _reseal(victim)
    assert sorted(checkpoint.verified_sets(out, 1, report=False)) == [1, 2, 3]  # every digest passes
    capfd.readouterr()
    assert _launch(d, out, resume=True) == 0
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "does not load" in line]
    assert len(lines) == 1 and lines[0].startswith(f"real: {victim}: skipped: passes its digests but does not "
                                                   "load (") and lines[0].endswith("; trying the previous set")
    assert _same(_weights(out), _weights(tmp_path / "whole"))
    shutil.rmtree(tmp_path / "whole")
