"""results/what-if-1b/: its README and the repository README's section are rendered from the committed CSVs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from geodt.paper import whatif

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "what-if-1b"


def test_readmes_are_rendered_from_the_committed_tables():
    assert whatif.main(["--dir", str(FOLDER), "--readme", str(ROOT / "README.md"), "--check"]) == 0


def test_hand_written_readme_figures_follow_the_csvs():
    """The figures docs/MODELS.md's prose on these cases quotes, recomputed."""
    text = " ".join((ROOT / "docs" / "MODELS.md").read_text().split())
    frames = whatif.load(FOLDER)
    plan = frames["modern-1b-1g"][1].query("strategy == 'baseline'").set_index("node")["step_s"]
    assert f"differ up to {plan.max() / plan.min():.1f}×" in text
    assert f"({plan.min():.2f} s on H100 against {plan.max():.2f} s on RTX 4090 for the 1B)" in text
    facts = {name: whatif.case_facts(*frames[name]) for name, _, _ in whatif.CASES}
    gains = [facts[n]["streaming_tps"] / facts[n]["hybrid_tps"] for n in facts if n.startswith("modern")]
    assert f"adds {(min(gains) - 1) * 100:.0f}-{(max(gains) - 1) * 100:.0f}% over `hybrid`" in text
    assert f"against {facts['paper']['streaming_tps'] / facts['paper']['hybrid_tps']:.2f}× on the paper's" in text


def test_case_facts_by_hand():
    table = pd.DataFrame({"strategy": ["baseline", "hybrid", "streaming", "network-aware"],
                          "tokens_vs_baseline": [1.0, 1.01, 1.01, 4.0], "tokens_per_s": [10.0, 20.0, 25.0, 30.0],
                          "speedup": [1.0, 2.0, 2.5, 3.0], "note": ["", "", "bound", ""]})
    plan = pd.DataFrame({"strategy": ["baseline", "baseline"], "node": ["a", "b"], "sharding": ["fsdp", "none"],
                         "activation_checkpointing": ["full", "none"]})
    f = whatif.case_facts(table, plan)
    assert f["layout"] == "a fsdp+recompute, b none"
    assert (f["best_same"], f["best_same_x"], f["best"], f["best_x"], f["best_tokens"]) == (
        "streaming", 2.5, "network-aware", 3.0, 4.0)
    assert f["streaming_note"] == "bound"
