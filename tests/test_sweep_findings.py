"""The README's sweep findings: rendered from results/sweep/sweep.csv, and computed as stated."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from geodt.paper import sweep_findings as sf

ROOT = Path(__file__).resolve().parents[1]


def test_readme_section_is_rendered_from_the_committed_sweep():
    frame, dtype = sf.load(ROOT / "results" / "sweep")
    readme = (ROOT / "README.md").read_text()
    assert sf.replace_section(readme, sf.render(frame, dtype)) == readme
    details = (ROOT / "results" / "sweep" / "README.md").read_text()
    assert sf.details_file(details, sf.render_details(frame)) == details
    # the README keeps a summary and a pointer; the long throughput paragraph lives in results/sweep (issue 42)
    section = readme[readme.index(sf.START):readme.index(sf.END)]
    assert max(len(line) for line in section.splitlines()) < 800 and "results/sweep/README.md" in section
    assert "`network-aware`'s payload" in details and "`network-aware`'s payload" not in section
    assert sf.main(["--sweep", str(ROOT / "results" / "sweep"), "--readme", str(ROOT / "README.md"), "--check"]) == 0


def _frame() -> pd.DataFrame:
    """Three scenarios at one bandwidth: s0 and s1 heterogeneous, s2 alike (baseline idle 0)."""
    rows = []
    spec = {  # strategy: (idle_left per scenario, tokens_per_round, speedup, payload)
        "baseline": ((1.0, 1.0, None), 100, (1.0, 1.0, 1.0), "fp32"),
        "B": ((2.0, 3.0, None), 400, (1.5, 0.9, 2.0), "fp32"),
        "measured-steps": ((0.05, 0.20, None), 150, (1.2, 1.1, 1.0), "fp32"),
        "hybrid": ((0.01, 0.02, None), 100, (1.3, 1.2, 1.0), "fp32"),
        "network-aware": ((0.01, 0.5, None), 100, (1.4, 1.3, 1.0), "int8"),
    }
    for sid, ratio in enumerate((3.0, 2.0, 1.0)):
        for name, (left, tokens, speedup, payload) in spec.items():
            rows.append({"scenario_id": sid, "nodes": f"mix{sid}", "bandwidth_gbps": 1.0, "speed_ratio": ratio,
                         "strategy": name, "idle_left": left[sid], "tokens_per_round": tokens,
                         "tokens_per_s": speedup[sid] * 10, "speedup": speedup[sid], "payload_dtype": payload})
    return pd.DataFrame(rows)


def test_findings_by_hand():
    f = sf.findings(_frame())
    assert (f["scenarios"], f["zero"], f["with_idle"], f["zero_alike"]) == (3, 1, 2, True)
    assert f["median_left_pct"]["B"] == pytest.approx(250.0)
    assert f["median_left_pct"]["hybrid"] == pytest.approx(1.5)
    assert f["median_tokens_x"]["measured-steps"] == pytest.approx(1.5)
    # under 10%: of the 2 scenarios with idle, measured-steps 1 (50%), hybrid 2, network-aware 1;
    # over all 3, the alike scenario counts as a miss
    assert f["under_pct"] == pytest.approx({"measured-steps": 50.0, "hybrid": 100.0, "network-aware": 50.0})
    assert f["under_all_pct"]["hybrid"] == pytest.approx(200 / 3)
    # most tokens/s: s0 B (1.5), s1 network-aware (1.3), s2 B (2.0)
    assert f["wins"][1.0] == ("B", pytest.approx(200 / 3))
    assert (f["b_wins"], f["b_wins_alike"]) == (2, 1)
    assert f["na_payloads"][1.0] == {"int8": 3}
    text = sf.render(_frame(), "fp16")
    assert "in 50.0-100.0% of the 2 scenarios whose baseline idles; the other 1 (all nodes equally fast)" in text
    assert "share over all 3 scenarios to 33.3-66.7%" in text


def test_missing_markers_and_files(tmp_path, capsys):
    with pytest.raises(ValueError):
        sf.replace_section("no markers here", "x")
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert sf.main(["--sweep", str(ROOT / "results" / "sweep"), "--readme", str(readme)]) == 2
    assert readme.read_text() == "no markers\n"
    assert sf.main(["--sweep", str(tmp_path / "none"), "--readme", str(readme)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 2


def test_streaming_findings_by_hand():
    """streaming added to the hand frame: s0 it wins (2.0 against B's 1.5), s1 it loses (1.25 < 1.3)."""
    frame = _frame()
    rows = [{"scenario_id": sid, "nodes": f"mix{sid}", "bandwidth_gbps": 1.0, "speed_ratio": ratio,
             "strategy": "streaming", "idle_left": 0.0, "tokens_per_round": 100, "tokens_per_s": sp * 10,
             "speedup": sp, "payload_dtype": "fp32"} for sid, ratio, sp in ((0, 3.0, 2.0), (1, 2.0, 1.25), (2, 1.0, 1.0))]
    frame = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
    s = sf.findings(frame)["streaming"][1.0]
    # s2's best is B (2.0), so streaming wins s0 only; over hybrid: 2.0/1.3, 1.25/1.2, 1.0/1.0 -> median 1.25/1.2
    assert (s["wins"], s["of"], s["runner_up"], s["wins_within_3x"]) == (1, 3, "B", 0)  # s0's spread is 3.0
    assert s["margin"] == pytest.approx(2.0 / 1.5)
    assert s["over_hybrid"] == pytest.approx(1.25 / 1.2)
    assert "at 1 Gbit/s it wins 1 of 3 (0 of them with the slowest node's step within 3× of the fastest's), by a median 33.3% over the next best (most often `B`)" \
        in sf.render_details(frame)
