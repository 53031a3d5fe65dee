"""The sets a node keeps cover a peer whose last background write failed (real/checkpoint/ckpt_set.py KEEP).

Seen under load (two suites at once): node a wrote rounds 5 and 6 and dropped 3 and 4, while
node victim's write of round 5 had failed on a full disk, noticed only when round 6's checkpoint
was due (after round 6's sync): the nodes shared no round and --resume refused."""
import torch

from real.checkpoint.checkpoint import verified_sets
from real.checkpoint.ckpt_set import set_rounds, write_set


def _parts(round_: int) -> dict:
    return {"global.pt": {"format": 4, "rounds_done": round_, "outer": {"w": torch.full((4,), float(round_))}},
            "node.pt": {"rounds_done": round_}}


def test_a_peer_whose_write_failed_still_shares_a_round(tmp_path):
    out = tmp_path / "out"
    for round_ in range(1, 7):  # node 0: every write succeeds, through the sync of round 6
        write_set(out, 0, round_, "run", _parts(round_), 0.0)
    for round_ in range(1, 5):  # node 1: rounds 1-4 written; round 5's write fails, it stops at round 6's
        write_set(out, 1, round_, "run", _parts(round_), 0.0)
    common = set(set_rounds(out, 0)) & set(set_rounds(out, 1))
    assert max(common) == 4
    assert all(verified_sets(out, i, report=False) for i in (0, 1))


def test_a_set_written_at_a_lower_round_keeps_itself_and_the_newer_sets(tmp_path):
    """A run started again from round 1 beside an earlier timeline's rounds 3-5 (issue 59): the
    rotation removed the set it had just written (round 1, the lowest of four) and, round by
    round, the earlier timeline's good sets before this run had replaced them."""
    out = tmp_path / "out"
    for round_ in (3, 4, 5):
        write_set(out, 0, round_, "run", _parts(round_), 0.0)
    write_set(out, 0, 1, "run", _parts(1), 0.0)
    assert sorted(verified_sets(out, 0, report=False)) == [1, 3, 4, 5]
    write_set(out, 0, 2, "run", _parts(2), 0.0)
    assert sorted(verified_sets(out, 0, report=False)) == [1, 2, 3, 4, 5]
    write_set(out, 0, 6, "run", _parts(6), 0.0)  # past them all: the newest KEEP
    assert sorted(set_rounds(out, 0)) == [4, 5, 6]


def test_a_set_that_does_not_verify_after_its_write_removes_nothing(tmp_path, monkeypatch):
    """The rotation runs only once the new set verifies as read back: a disk that returns other
    bytes than were written leaves every earlier set in place and fails in one line."""
    import pytest

    import real.checkpoint.ckpt_set as ckpt_set

    out = tmp_path / "out"
    for round_ in (1, 2, 3):
        write_set(out, 0, round_, "run", _parts(round_), 0.0)
    real_verify = ckpt_set.verify

    def rotten(directory, round_, index):
        if round_ == 4:
            raise ValueError("global.pt fails its blake2b digest (a flipped bit or an altered file)")
        return real_verify(directory, round_, index)

    monkeypatch.setattr(ckpt_set, "verify", rotten)
    with pytest.raises(ckpt_set.CheckpointWriteError, match="round-000004: the set just written does not verify"):
        write_set(out, 0, 4, "run", _parts(4), 0.0)
    assert sorted(set_rounds(out, 0)) == [1, 2, 3, 4]


def test_rotation_keeps_the_newest_before_the_written_round_and_the_floor():
    from real.checkpoint.ckpt_set import rotated

    assert rotated([1, 2, 3, 4], 4) == [1]
    assert rotated([1, 2, 3, 4, 7, 8], 4) == [1]
    assert rotated([1, 2, 3, 4], 4, floor=1) == []
    assert rotated([3, 4, 5, 1], 1) == []


def test_unresumable_names_the_node_whose_every_set_fails_and_what_the_others_hold(tmp_path):
    from real.checkpoint.ckpt_set import unresumable

    out = tmp_path / "out"
    for index in range(3):
        for round_ in (2, 3, 4):
            write_set(out, index, round_, "run", _parts(round_), 0.0)
    assert unresumable(out, ["a", "b", "c"]) is None
    for round_ in (2, 3, 4):
        path = out / "checkpoints" / "node1" / f"round-{round_:06d}" / "global.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
    (out / "checkpoints" / "node2" / "round-000004" / "manifest.json").write_text("{}")
    why = unresumable(out, ["a", "b", "c"])
    assert why.startswith(f"--resume: node b has no checkpoint that verifies: {out / 'checkpoints' / 'node1'} holds "
                          "round 2: global.pt fails its blake2b digest")
    assert "sets that verify: a: rounds 2, 3, 4; c: rounds 2, 3; nothing was changed" in why
    assert "\n" not in why
