"""A resume refused on one process (other settings, another run) is known to every process in the same
all-gather: under torchrun its peers on another machine stopped only at their collective timeout (they
waited in the gather the refusing process never reached)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from real.checkpoint import checkpoint


class Groups:
    """all_gather_ints over fake processes: this process's values, the others' given."""

    def __init__(self, others: dict[int, int], rank: int = 0):
        self.others, self.rank, self.sent = others, rank, []

    def all_gather_ints(self, values):
        self.sent.append(list(values))
        return [list(values) if r == self.rank else [self.others[r]] for r in range(len(self.others) + 1)]


def _checkpointer(groups: Groups) -> checkpoint.Checkpointer:
    nodes = (SimpleNamespace(node="a", gpus=1), SimpleNamespace(node="b", gpus=1), SimpleNamespace(node="c", gpus=1))
    plan = SimpleNamespace(nodes=nodes, node_of_rank=lambda r: r)
    return checkpoint.Checkpointer(SimpleNamespace(groups=groups, plan=plan))


def test_a_peer_that_refused_stops_this_process_naming_it(monkeypatch, tmp_path):
    monkeypatch.setattr(checkpoint.ckpt_set, "load_set", lambda directory: {"set": 1})
    monkeypatch.setattr(checkpoint, "check_settings", lambda *a: None)
    ckpt = _checkpointer(Groups({1: checkpoint.REFUSED, 2: 0}))
    monkeypatch.setattr(ckpt, "load", lambda saved, manifest: 7)
    with pytest.raises(ValueError, match="node b refused to resume from its set"):
        ckpt._loaded(tmp_path, {})


def test_the_refusing_process_joins_the_gather_before_it_refuses(monkeypatch, tmp_path):
    def other_settings(state, saved, source, manifest):
        raise ValueError(f"{source}: batch_size: checkpoint has 4, this run has 8; resume with the same plan")

    monkeypatch.setattr(checkpoint.ckpt_set, "load_set", lambda directory: {"set": 1})
    monkeypatch.setattr(checkpoint, "check_settings", other_settings)
    groups = Groups({1: 0, 2: 0})
    with pytest.raises(ValueError, match="resume with the same plan"):
        _checkpointer(groups)._loaded(tmp_path, {})
    assert groups.sent == [[checkpoint.REFUSED]]


def test_a_set_that_does_not_load_anywhere_is_still_skipped_not_refused(monkeypatch, tmp_path, capsys):
    def unreadable(directory):
        raise RuntimeError("torch.load refused it")

    monkeypatch.setattr(checkpoint.ckpt_set, "load_set", unreadable)
    groups = Groups({1: 0, 2: 1})
    assert _checkpointer(groups)._loaded(tmp_path, {}) is None
    assert groups.sent == [[1]] and "skipped: passes its digests but does not load" in capsys.readouterr().err


def _resuming(groups: Groups, out_dir, index: int) -> checkpoint.Checkpointer:
    ckpt = _checkpointer(groups)
    ckpt.state.opts = SimpleNamespace(out_dir=str(out_dir))
    ckpt.state.groups.index, ckpt.state.groups.is_leader = index, index == 0
    return ckpt


def test_a_peer_holding_an_earlier_geodts_checkpoint_stops_this_process_naming_it(monkeypatch, tmp_path):
    """The old-format refusal was raised on the holding process alone: its peers waited in the next
    collective until their timeout."""
    monkeypatch.setattr(checkpoint, "verified_sets", lambda *a, **k: {})
    monkeypatch.setattr(checkpoint, "_common_round", lambda state, mine: pytest.fail("went on to the next collective"))
    groups = Groups({1: checkpoint.REFUSED, 2: 0})
    with pytest.raises(ValueError, match="node b holds a checkpoint of an earlier geodt"):
        _resuming(groups, tmp_path, 0).resume()
    assert groups.sent == [[0]]


def test_the_process_holding_an_earlier_geodts_checkpoint_joins_the_gather_then_says_which_file(monkeypatch, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "node1.pt").write_bytes(b"old")
    monkeypatch.setattr(checkpoint, "verified_sets", lambda *a, **k: {})
    groups = Groups({0: 0, 2: 0}, rank=1)
    with pytest.raises(ValueError, match=r"node1\.pt: a checkpoint of an earlier geodt"):
        _resuming(groups, tmp_path, 1).resume()
    assert groups.sent == [[checkpoint.REFUSED]]
