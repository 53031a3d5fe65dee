"""benchmarks/bench_gpu.py's CPU-possible parts: its stages, its scenarios, and the analysis of profiles.

The GPU stages need a lent GPU (not run here); the analysis runs on the committed H200 profiles."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gpu  # noqa: E402


def test_the_stages_and_their_limits_fit_the_device_budget(tmp_path, capsys):
    names = [name for name, _, _ in bench_gpu.stages(tmp_path)]
    assert names == ["cuda tests", "calibrate llama-150m eager", "calibrate llama-150m compiled",
                     "calibrate llama-1b eager", "calibrate llama-1b compiled", "validate gpu1", "nccl run"]
    assert bench_gpu.main(["--out", str(tmp_path), "--dry-run"]) == 0
    assert "--compile on" in capsys.readouterr().out


def test_its_scenarios_load(tmp_path):
    from simulator.scenario import load_scenario

    bench_gpu.write_scenarios(tmp_path, "h100-sxm")
    (tmp_path / "llama-150m-eager.csv").write_bytes((ROOT / "benchmarks/estimate/h200/h200-llama-150m-bf16.csv")
                                                    .read_bytes().replace(b"h200", b"h100-sxm"))
    assert load_scenario(str(tmp_path / "gpu1.toml")).training.compile == "off"
    assert len(load_scenario(str(tmp_path / "nccl2.toml")).nodes) == 2


def test_the_analysis_of_the_h200_profiles():
    rows = {r["stage"]: r for r in bench_gpu.analyse(ROOT / "benchmarks/estimate/h200")}
    assert set(rows) == {f"analyse h200-{m}.csv" for m in ("llama-150m-bf16", "llama-1b-bf16", "llama-1b-fp16")}
    assert "largest batch planned 39, measured 42" in rows["analyse h200-llama-1b-bf16.csv"]["figures"]


def test_the_stages_share_one_budget(tmp_path, monkeypatch):
    """A stage gets at most what is left of --budget-s; one that would start with less than
    MIN_STAGE_S is skipped and said so, so the table comes within one device call."""
    monkeypatch.setattr(bench_gpu, "MIN_STAGE_S", 1)
    quick = [sys.executable, "-c", "print('done')"]
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    rows = bench_gpu.run_all([("a", quick, 60), ("b", slow, 60), ("c", quick, 60), ("nccl run", quick, 60)],
                             budget_s=3, gpus=1, log=tmp_path / "log")
    assert [r["stage"] for r in rows] == ["a", "b", "c", "nccl run"]
    assert rows[0]["ok"] and "done" in rows[0]["figures"]
    assert not rows[1]["ok"] and rows[1]["figures"].startswith("exit timeout in")  # cut at the budget, not at 60 s
    assert not rows[2]["ok"] and rows[2]["figures"].startswith("skipped:") and "of --budget-s left" in rows[2]["figures"]
    assert rows[3]["ok"] and rows[3]["figures"].startswith("skipped: one GPU")
