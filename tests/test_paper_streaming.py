"""results/streaming/: its README and timeline.png are rendered from the committed run's CSVs, as computed."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from geodt.paper import streaming as ps

ROOT = Path(__file__).resolve().parents[1]


def test_committed_folder_is_rendered_from_its_csvs():
    assert ps.main(["--dir", str(ROOT / "results" / "streaming"), "--check"]) == 0


def test_facts_by_hand():
    """Two nodes, one strategy, P = 2, two rounds of 10 s: tokens/s, bound and exposed wait per node and round."""
    timeline = pd.DataFrame({"strategy": ["s"] * 4, "node": ["a", "b", "a", "b"], "round": [0, 0, 1, 1],
                             "compute_s": [8.0, 6.0, 8.0, 6.0], "idle_s": 0.0, "comm_s": 1.0,
                             "round_start_s": [0, 0, 10, 10], "round_end_s": [10, 10, 20, 20]})
    summary = pd.DataFrame({"strategy": ["s", "s"], "node": ["a", "b"], "compute_s": [16.0, 12.0],
                            "tokens": [1000, 3000]})
    plan = pd.DataFrame({"strategy": ["s", "s"], "node": ["a", "b"], "comm_s": [3.0, 3.0], "fragments": [2, 2],
                         "sync_delay_steps": [1, 1], "local_steps": [10, 5]})
    syncs = pd.DataFrame({"strategy": ["s"] * 8, "exposed_s": [0.0, 0.4, 0.0, 0.0, 0.2, 0.2, 0.0, 0.0]})
    f = ps.facts({"timeline": timeline, "summary": summary, "plan": plan, "syncs": syncs})["s"]
    assert f["tokens_per_s"] == pytest.approx(4000 / 20)
    assert (f["compute_s"], f["sync_s"], f["bound_s"]) == (8.0, 6.0, 8.0)
    assert f["exposed_s"] == pytest.approx(0.8 / 2 / 2)
    assert (f["round_s"], f["fragments"], f["tau"], f["steps"]) == (10.0, 2, 1, "10 5")
