"""`geodt simulate` / `geodt plan` end to end: files, columns, the resolved scenario, no torch."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from simulator.cli import plan_main, simulate_main
from simulator.scenario import load_scenario


def test_simulate_paper_writes_all_outputs(tmp_path, capsys):
    assert simulate_main(["paper", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in ("baseline", "== A ==", "== B ==", "== C =="):
        assert name in printed
    plan = pd.read_csv(tmp_path / "plan.csv")
    assert list(plan.columns)[:7] == ["strategy", "node", "gpus", "batch_size", "local_steps", "step_s",
                                      "tokens_per_round"]
    c = plan[plan.strategy == "C"]
    assert list(c.local_steps) == [100, 104, 145, 117]
    timeline = pd.read_parquet(tmp_path / "timeline.parquet")  # the default; --csv: timeline.csv
    rounds = timeline.groupby("strategy")["round"].nunique()
    assert rounds["baseline"] == 10 and rounds["C"] == 10
    assert len(timeline) == (plan.groupby("strategy").size() * rounds).sum()
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns) == ["strategy", "node", "compute_s", "idle_s", "comm_s", "tokens", "utilization",
                                     "loss_end", "loss_band", "time_to_target_s", "time_band_s", "step_source",
                                     "network_source", "error_band_pct", "staleness_mean", "staleness_p90"]
    # no target: the time to the baseline's predicted loss at its last token, which the baseline reaches at its end
    per = summary.groupby("strategy").first()
    assert summary["loss_end"].notna().all() and np.isfinite(summary["time_to_target_s"]).all()
    end_s = timeline[timeline.strategy == "baseline"]["round_end_s"].max()
    assert per.loc["baseline", "time_to_target_s"] == pytest.approx(end_s, rel=1e-9)
    # the resolved scenario reproduces the run on its own
    again = load_scenario(str(tmp_path / "scenario.toml"))
    assert again == load_scenario("paper")


def test_overrides_and_engine(tmp_path):
    args = ["paper", "--out", str(tmp_path), "--strategy", "baseline", "C", "--engine", "analytic", "--csv",
            "--set", "training.rounds=3", "--set", "nodes.node3.step_time_s=0.5"]
    assert simulate_main(args) == 0
    timeline = pd.read_csv(tmp_path / "timeline.csv")
    assert sorted(timeline.strategy.unique()) == ["C", "baseline"]
    assert timeline["round"].max() == 2
    node3 = timeline[(timeline.node == "node3") & (timeline.strategy == "baseline")]
    assert node3.compute_s.iloc[0] == 50.0
    assert "step_time_s = 0.5" in (tmp_path / "scenario.toml").read_text()


def test_plan_writes_plan_only(tmp_path, capsys):
    assert plan_main(["paper", "--strategy", "A", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idle.png", "plan.csv", "scenario.toml"]
    assert list(pd.read_csv(tmp_path / "plan.csv").batch_size) == [4, 4, 6, 5]


def test_simulator_never_imports_torch():
    code = ("import sys; import simulator.cli, simulator.engines.engine, simulator.strategies, simulator.models.timing; "
            "from simulator.cli import simulate_main; import tempfile; "
            "simulate_main(['paper', '--out', tempfile.mkdtemp()]); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_geodt_command_runs():
    result = subprocess.run([sys.executable, "-m", "geodt", "plan", "paper", "--strategy", "C", "--out", "/dev/null/x"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--out" in result.stderr


def test_outputs_are_ordinary_files(tmp_path):
    import os
    assert plan_main(["paper", "--strategy", "A", "--out", str(tmp_path)]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "plan.csv").stat().st_mode & 0o777 == 0o666 & ~mask


def test_every_node_a_different_gpu_count_simulates(tmp_path):
    """The README's own cluster (berlin 8 × h100-sxm, tokyo 4 × a30) and a one-node scenario: the node →
    GPU count map was categorical when every count differed, and the loss model's multiply raised."""
    cluster = tmp_path / "my-cluster.toml"
    cluster.write_text('name = "my-cluster"\n[model]\npreset = "llama-150m"\nseq_len = 1024\ndtype = "bf16"\n'
                       '[training]\nrounds = 10\nlocal_steps = 100\nbatch_size = 4\n'
                       '[network]\nbandwidth_gbps = 1.0\npayload_dtype = "fp16"\n'
                       '[[nodes]]\nname = "berlin"\ngpus = { "h100-sxm" = 8 }\n'
                       '[[nodes]]\nname = "tokyo"\ngpus = { "a30" = 4 }\n')
    assert simulate_main([str(cluster), "--out", str(tmp_path / "two")]) == 0
    summary = pd.read_csv(tmp_path / "two" / "summary.csv")
    assert summary["loss_end"].notna().all()
    one = tmp_path / "one.toml"
    one.write_text(cluster.read_text().split("[[nodes]]\nname = \"tokyo\"")[0])
    assert simulate_main([str(one), "--out", str(tmp_path / "one")]) == 0
    assert pd.read_csv(tmp_path / "one" / "summary.csv")["loss_end"].notna().all()
