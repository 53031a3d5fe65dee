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
