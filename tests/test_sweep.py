"""`geodt sweep`: the fast path agrees with make_plan + simulate; runs are reproducible and resumable."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.engines.engine import simulate
from simulator.models.network import outer_step_s
from simulator.outputs.sweep_table import timeline_metrics
from simulator.scenario import load_scenario
from simulator.strategies import STRATEGIES, make_plan
from simulator.sweep.sweep import KindTables, SweepSpec, decide, metrics, node_kinds, scenario_grid
from simulator.sweep.sweep_cli import main as sweep

TYPES = ("rtx-2080-ti", "titan-rtx", "a30", "rtx-3090", "v100", "t4", "a100-80gb", "h100-sxm")


@pytest.fixture(scope="module")
def handful():
    spec = SweepSpec(nodes=4, gpus_per_node=4, gpu_types=TYPES, mixed_nodes=True, bandwidths_gbps=(0.1, 1.0, 10.0),
                     strategies=tuple(STRATEGIES), samples=12, seed=3)
    kinds = node_kinds(spec)
    grid, bw = scenario_grid(spec, len(kinds))
    return KindTables(load_scenario("paper"), kinds), grid, bw


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_fast_path_plans_equal_make_plan_exactly(handful, strategy):
    kt, grid, bw = handful
    d = decide(kt, grid, bw, strategy)
    comm = np.broadcast_to(d["comm_s"], (len(grid),))
    for r in range(len(grid)):
        scenario = kt.scenario(grid[r], bw[r])
        plan = make_plan(scenario, strategy)
        assert [n.batch_size for n in plan.nodes] == d["batch"][r].tolist()
        assert [n.local_steps for n in plan.nodes] == d["steps"][r].tolist()
        assert [n.step_s for n in plan.nodes] == d["step_s"][r].tolist()  # the same floats, not close ones
        assert plan.comm_s == comm[r]
        assert (plan.rounds or scenario.training.rounds) == d["rounds"]
        assert plan.fragments == np.broadcast_to(d["fragments"], (len(grid),))[r]
        assert plan.sync_delay_steps == np.broadcast_to(d["delay"], (len(grid),))[r]


@pytest.mark.parametrize("strategy", ["baseline", "C", "hybrid", "sync-ddp", "network-aware", "streaming"])
def test_fast_path_metrics_match_the_simulated_timeline(handful, strategy):
    kt, grid, bw = handful
    d = decide(kt, grid, bw, strategy)
    fast = metrics(d, kt.gpus[grid], kt.base.model.seq_len, outer_step_s(kt.base))
    for r in range(0, len(grid), 3):
        scenario = kt.scenario(grid[r], bw[r])
        plan = make_plan(scenario, strategy)
        ref = timeline_metrics(plan, simulate(scenario, plan, "analytic"))
        for key in ("round_s", "wall_s", "idle_s", "idle_floor_s", "utilization", "tokens", "tokens_per_s"):
            # the same quantities summed in another order (closed form vs per-round timeline): rounding only
            assert fast[key][r] == pytest.approx(ref[key], rel=1e-9, abs=1e-9), key


def test_enumerates_every_mix_when_it_fits():
    spec = SweepSpec(nodes=3, gpus_per_node=2, gpu_types=("a30", "t4"), mixed_nodes=True, bandwidths_gbps=(1.0, 2.0),
                     strategies=("baseline",), samples=100, seed=0)
    kinds = node_kinds(spec)
    assert kinds == [(("a30", 2),), (("a30", 1), ("t4", 1)), (("t4", 2),)]
    grid, bw = scenario_grid(spec, len(kinds))
    assert len(grid) == 10 * 2  # multisets of 3 nodes over 3 kinds: C(5, 3) = 10, at 2 bandwidths
    assert len({tuple(row) + (b,) for row, b in zip(grid.tolist(), bw)}) == 20


def _args(out, *extra):
    return ["--nodes", "3", "--gpus-per-node", "2", "--gpu-types", "a30,v100,t4,rtx-3090", "--mixed-nodes",
            "--bandwidth-gbps", "0.5,5", "--samples", "60", "--seed", "5", "--chunk", "20", "--workers", "2",
            "--out", str(out), *extra]


def _dataset(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((out / "sweep").iterdir())]


def test_same_seed_same_csv_and_resume(tmp_path, capsys):
    assert sweep(_args(tmp_path / "a", "--no-figures", "--csv")) == 0
    assert sweep(_args(tmp_path / "b", "--csv")) == 0
    first, second = (tmp_path / "a" / "sweep.csv").read_bytes(), (tmp_path / "b" / "sweep.csv").read_bytes()
    assert first == second
    assert len(_dataset(tmp_path / "a")) == 3 and _dataset(tmp_path / "a") == _dataset(tmp_path / "b")
    dataset = pd.read_parquet(tmp_path / "a" / "sweep")  # the same table as sweep.csv, at full precision
    assert list(dataset.columns) == list(pd.read_csv(tmp_path / "a" / "sweep.csv").columns)
    assert all((tmp_path / "b" / f).stat().st_size > 0 for f in ("idle_left.png", "winners.png", "speedup.png"))
    frame = pd.read_csv(tmp_path / "a" / "sweep.csv")
    assert len(frame) == 60 * len(STRATEGIES) and frame["scenario_id"].nunique() == 60
    for column in ("idle_s", "round_s", "utilization", "tokens_per_s", "nodes", "bandwidth_gbps", "strategy"):
        assert column in frame
    assert not list((tmp_path / "a").glob("parts-*"))  # finished: the parts are the dataset sweep/
    capsys.readouterr()
    assert sweep(_args(tmp_path / "a", "--no-figures")) == 0
    assert "nothing redone" in capsys.readouterr().err


def test_an_interrupted_sweep_resumes(tmp_path, capsys, monkeypatch):
    import simulator.sweep.sweep_cli as cli

    real, calls = cli._run_chunk, []

    def dies_on_the_second_chunk(job):
        calls.append(job[0])
        if job[0] == 1:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(cli, "_run_chunk", dies_on_the_second_chunk)
    capsys.readouterr()
    assert sweep(_args(tmp_path / "a", "--no-figures", "--workers", "1")) == 130  # Ctrl-C: one line, 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("geodt sweep: interrupted; finished chunks are kept") and "Traceback" not in "".join(err)
    parts = sorted((tmp_path / "a").glob("parts-*/chunk-*.parquet"))
    assert [p.name for p in parts] == ["chunk-00000.parquet"] and not (tmp_path / "a" / "sweep.sha256").exists()
    monkeypatch.setattr(cli, "_run_chunk", real)
    capsys.readouterr()
    assert sweep(_args(tmp_path / "a", "--no-figures", "--workers", "1")) == 0
    assert "20 already done" in capsys.readouterr().err
    assert sweep(_args(tmp_path / "b", "--no-figures")) == 0
    assert _dataset(tmp_path / "a") == _dataset(tmp_path / "b")


@pytest.mark.parametrize("extra, message", [
    (["--gpu-types", "a30,gtx-9999"], "--gpu-types gtx-9999"),
    (["--bandwidth-gbps", "1,-2"], "--bandwidth-gbps"),
    (["--strategy", "fastest"], "--strategy fastest"),
    (["--samples", "0"], "--samples"),
    (["--set", "training.rounds=-1"], "training.rounds"),
    (["--base", "no-such-scenario"], "no-such-scenario"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert sweep(_args(out) + extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (out / "sweep.csv").exists() and not (out / "sweep").exists()


def test_resume_refuses_other_arguments(tmp_path, capsys):
    assert sweep(_args(tmp_path, "--no-figures")) == 0
    capsys.readouterr()
    assert sweep(_args(tmp_path, "--no-figures", "--seed", "6")) == 2
    assert "other arguments" in capsys.readouterr().err


def test_table_on_paper(tmp_path):
    assert sweep(["--table", "paper", "--strategy", "baseline", "C", "hybrid", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "table.csv").set_index("strategy")
    assert list(table.index) == ["baseline", "C", "hybrid"]
    assert 1.0 <= table.loc["hybrid", "tokens_vs_baseline"] <= 1.01
    assert table.loc["hybrid", "idle_left"] <= 0.10 < table.loc["C", "idle_left"]
    assert (tmp_path / "table.md").read_text().startswith("# Every strategy on `paper`")


def test_a_dataset_cut_short_is_redone_not_taken_as_finished(tmp_path, capsys):
    out = tmp_path / "a"
    assert sweep(_args(out, "--no-figures")) == 0
    whole = _dataset(out)
    part = out / "sweep" / "part-00001.parquet"
    part.write_bytes(whole[1][: len(whole[1]) // 2])  # cut short, as a full disk or a kill leaves it
    capsys.readouterr()
    assert sweep(_args(out, "--no-figures")) == 0
    assert "incomplete or altered" in capsys.readouterr().err
    assert _dataset(out) == whole


def test_two_identical_sweeps_at_once_both_finish_with_one_result(tmp_path):
    import os
    import subprocess
    import sys

    out = tmp_path / "a"
    code = "import sys; from simulator.sweep.sweep_cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    runs = [subprocess.Popen([sys.executable, "-c", code, *_args(out, "--no-figures", "--workers", "1")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    results = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [r[1].decode()[-500:] for r in results]
    assert sweep(_args(tmp_path / "b", "--no-figures")) == 0
    assert _dataset(out) == _dataset(tmp_path / "b")
    assert sorted(p.name for p in out.iterdir()) == ["scenario.toml", "spec.json", "sweep", "sweep.sha256"]


def test_the_one_step_bound_is_named_as_a_bound_above_idle(tmp_path):
    """idle_floor_s (CSV name kept) is R x sum of one step per node: idle stays under it for plans balanced to
    the step (measured-steps, hybrid), so the table must not call it a floor (it did: hybrid idle 7.33 s under a
    "floor" of 28.29 s)."""
    assert sweep(["--table", "paper", "--strategy", "baseline", "measured-steps", "hybrid",
                  "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "table.csv").set_index("strategy")
    scenario = load_scenario("paper")
    for strategy in ("measured-steps", "hybrid"):
        plan = make_plan(scenario, strategy)
        rounds = scenario.training.rounds
        assert table.loc[strategy, "idle_floor_s"] == pytest.approx(rounds * sum(n.step_s for n in plan.nodes))
        assert table.loc[strategy, "idle_s"] < table.loc[strategy, "idle_floor_s"]  # bounded from above
    assert table.loc["baseline", "idle_s"] > table.loc["baseline", "idle_floor_s"]  # not balanced to the step
    text = (tmp_path / "table.md").read_text()
    assert "floor (s)" not in text and "idle / floor" not in text
    assert "| one-step bound (s) | idle / bound |" in text and "a bound from above" in text


def test_sweep_says_how_samples_became_scenarios_and_prints_findings(tmp_path, capsys):
    """--samples 50 over 2 bandwidths with 15 distinct mixes: 30 scenarios, and why."""
    args = ["--nodes", "4", "--gpu-types", "a30,v100,t4", "--bandwidth-gbps", "0.1,1", "--samples", "50",
            "--workers", "1", "--no-figures", "--out", str(tmp_path / "a")]
    assert sweep(args) == 0
    printed = capsys.readouterr()
    assert ("30 scenarios: all 15 distinct mixes of 4 nodes over 3 node kinds (--samples 50 over 2 bandwidths asks "
            "for up to 25 each, and there are no more), each at 2 bandwidths") in printed.err
    frame = pd.read_parquet(tmp_path / "a" / "sweep")
    won = frame.loc[frame.groupby("scenario_id")["tokens_per_s"].idxmax()]
    lines = printed.out.splitlines()
    assert any(line.startswith("Over 30 scenarios, per strategy") for line in lines)
    for bw in (0.1, 1.0):
        counts = won.loc[won["bandwidth_gbps"] == bw, "strategy"].value_counts()
        share = f"{100 * counts.iloc[0] / counts.sum():.0f}% of {counts.sum()}"
        at = frame[(frame["strategy"] == counts.index[0]) & (frame["bandwidth_gbps"] == bw)]
        mark = "" if at["comparable"].all() else "*"  # other work, as geodt simulate marks it
        assert f"at {bw:g} Gbit/s {counts.index[0]}{mark} ({share})" in printed.out
    row = next(line for line in lines if line.startswith("measured-steps"))
    left = frame.loc[frame["strategy"] == "measured-steps", "idle_left"].median()
    assert f"{100 * left:.1f}%" in row
    capsys.readouterr()
    sampled = ["--nodes", "4", "--gpu-types", "a30,v100,t4,rtx-3090", "--samples", "50", "--workers", "1",
               "--no-figures", "--out", str(tmp_path / "b")]
    assert sweep(sampled) == 0
    assert ("51 scenarios: 17 mixes of 4 nodes drawn (seed 0) from the 35 distinct ones over 4 node kinds "
            "(--samples 50 / 3 bandwidths, rounded up), each at 3 bandwidths") in capsys.readouterr().err
    assert len(pd.read_parquet(tmp_path / "b" / "sweep")) == 51 * len(STRATEGIES)


def test_a_sweep_needs_out_and_a_table_has_a_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sweep(["--nodes", "2", "--gpu-types", "a30,t4", "--samples", "3"]) == 2
    assert capsys.readouterr().err.strip() == ("geodt sweep: --out: expected an output directory for the sweep "
                                               "(it resumes from there)")
    assert sweep(["--table", "paper", "--strategy", "baseline"]) == 0
    assert (tmp_path / "out" / "paper" / "table" / "table.csv").is_file()


@pytest.mark.parametrize("strategy", ["baseline", "B", "C"])
def test_fast_path_prices_the_eager_steps_pipeline_as_make_plan_does(strategy):
    """compile = "off": every catalog GPU's step is the host/device pipeline (simulator/models/estimate.py);
    the sweep's vectorised tables take the same floats."""
    spec = SweepSpec(nodes=3, gpus_per_node=2, gpu_types=TYPES, mixed_nodes=True, bandwidths_gbps=(1.0,),
                     strategies=(strategy,), samples=6, seed=5)
    kinds = node_kinds(spec)
    grid, bw = scenario_grid(spec, len(kinds))
    kt = KindTables(load_scenario("paper", ["training.compile=off", "training.batch_size=1"]), kinds)
    assert all(est.host_s > 0 for group in kt.estimates for est in group)  # per layout group
    d = decide(kt, grid, bw, strategy)
    for r in range(len(grid)):
        plan = make_plan(kt.scenario(grid[r], bw[r]), strategy)
        assert [n.step_s for n in plan.nodes] == d["step_s"][r].tolist()


def test_table_marks_other_work_as_simulate_does(tmp_path):
    """sweep --table ranks speed-ups; a strategy training on other tokens than the baseline's (beyond
    ±5%, geodt simulate's *) is marked in table.md and not `comparable` in table.csv, by the same rule
    (sync-ddp's round is one step, so its tokens per round are 1%, its run's the baseline's)."""
    from simulator.outputs.report import answer_table

    strategies = ["baseline", "A", "hybrid", "sync-ddp", "network-aware"]
    assert sweep(["--table", "paper", "--strategy", *strategies, "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table.columns[-3:]) == ["speedup", "comparable", "note"]
    scenario = load_scenario("paper")
    runs = [(plan, simulate(scenario, plan, "analytic")) for plan in (make_plan(scenario, s) for s in strategies)]
    answer, _ = answer_table(runs, runs[0])  # geodt simulate's table, whose * marks other work
    assert table.set_index("strategy")["comparable"].to_dict() == answer.set_index("strategy")["comparable"].to_dict()
    assert table.set_index("strategy")["comparable"].to_dict() == {
        "baseline": True, "A": False, "hybrid": True, "sync-ddp": True, "network-aware": False}
    rows = {line.split(" | ")[0].lstrip("| "): line for line in (tmp_path / "table.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| strategy")}
    assert {s: rows[s].endswith("x* |") for s in strategies} == {
        "baseline": False, "A": True, "hybrid": False, "sync-ddp": False, "network-aware": True}
    assert "*: other work: the run trains on tokens beyond ±5% of the baseline's" in (tmp_path / "table.md").read_text()


def test_sweep_marks_other_work_in_its_dataset_findings_and_figure(tmp_path, capsys, monkeypatch):
    """sweep.csv's `comparable` is simulate's rule per scenario; the findings mark the speed-ups (and a
    winner) of strategies that do other work with *, under a note; speedup.png names them with a *."""
    from simulator.outputs.report import does_baseline_work
    from simulator.sweep import sweep_figures

    args = ["--nodes", "3", "--gpus-per-node", "2", "--gpu-types", "a30,t4", "--bandwidth-gbps", "0.1,10",
            "--samples", "8", "--workers", "1", "--no-figures", "--strategy", "baseline", "A", "hybrid",
            "--out", str(tmp_path / "a")]
    assert sweep(args) == 0
    printed = capsys.readouterr().out
    frame = pd.read_parquet(tmp_path / "a" / "sweep")
    base = frame[frame["strategy"] == "baseline"].set_index("scenario_id")["tokens"]
    assert list(frame.columns[-2:]) == ["speedup", "comparable"]
    assert frame["comparable"].tolist() == does_baseline_work(frame["tokens"] / frame["scenario_id"].map(base)).tolist()
    other = ~frame.set_index(["strategy", "bandwidth_gbps"])["comparable"]
    assert other["A"].groupby(level=0).any().tolist() == [True, True]  # at each bandwidth, somewhere
    assert not other["hybrid"].any() and not other["baseline"].any()
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.split()[:1] in (["A"], ["hybrid"])}
    assert [cell.endswith("x*") for cell in rows["A"][2:4]] == [True, True]
    assert [cell.endswith("x") for cell in rows["hybrid"][2:4]] == [True, True]
    assert "*: other work in some or all of those scenarios (the run's tokens beyond ±5% of the baseline's" in printed
    winners = next(line for line in printed.splitlines() if line.startswith("Most tokens/s"))
    assert " A (" not in winners and " hybrid* (" not in winners  # a winner is marked as its speed-up is
    figures = []
    monkeypatch.setattr(sweep_figures, "_save", lambda fig, path: figures.append(fig) or path)
    sweep_figures.speedup_figure(frame, tmp_path / "speedup.png")
    labels = [t.get_text() for t in figures[0].axes[0].get_xticklabels()]
    assert labels == ["baseline", "A*", "hybrid"] and "other work" in figures[0].axes[0].get_title()


def test_a_part_from_before_comparable_is_redone_on_resume(tmp_path, capsys, monkeypatch):
    """An interrupted sweep's kept part without `comparable` (an older geodt's) is redone, not mixed
    into a dataset of two schemas (sweep.csv would have rows of another width)."""
    import pyarrow.parquet as pq

    import simulator.sweep.sweep_cli as cli
    from simulator.sweep.sweep_dataset import part_bytes, read_part

    real = cli._run_chunk

    def dies_on_the_second_chunk(job):
        if job[0] == 1:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(cli, "_run_chunk", dies_on_the_second_chunk)
    assert sweep(_args(tmp_path / "a", "--no-figures", "--workers", "1")) == 130
    kept = next((tmp_path / "a").glob("parts-*/chunk-00000.parquet"))
    kept.write_bytes(part_bytes(read_part(kept).drop(columns="comparable")))
    monkeypatch.setattr(cli, "_run_chunk", real)
    capsys.readouterr()
    assert sweep(_args(tmp_path / "a", "--no-figures", "--workers", "1", "--csv")) == 0
    assert "0 already done" in capsys.readouterr().err
    assert sweep(_args(tmp_path / "b", "--no-figures", "--csv")) == 0
    assert _dataset(tmp_path / "a") == _dataset(tmp_path / "b")
    assert "comparable" in pq.read_schema(tmp_path / "a" / "sweep" / "part-00000.parquet").names
