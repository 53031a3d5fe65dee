"""`geodt sweep` plans its nodes' memory layouts as `geodt plan` does (issue 42): a GPU type that
plan fits by sharding is swept, with make_plan's very plans; types that no layout fits are all
named in one line, with suggestions that work when followed."""
from __future__ import annotations

import re

import numpy as np
import pytest

from simulator.engines.engine import simulate
from simulator.models.network import outer_step_s
from simulator.outputs.sweep_table import timeline_metrics
from simulator.scenario import load_scenario
from simulator.strategies import make_plan
from simulator.sweep.sweep import (
    KindTables,
    SweepSpec,
    decide,
    metrics,
    node_kinds,
    scenario_grid,
)
from simulator.sweep.sweep_cli import main as sweep

# llama-1b at batch 4 needs 26 GiB unsharded: an a30 (24 GB) and a titan-xp (12 GB) hold it only sharded
SHARDED = ["model.preset=llama-1b"]


@pytest.fixture(scope="module")
def sharded():
    spec = SweepSpec(nodes=3, gpus_per_node=4, gpu_types=("a30", "titan-xp", "h100-sxm"), mixed_nodes=True,
                     bandwidths_gbps=(0.1, 10.0), strategies=("A",), samples=8, seed=1)
    kinds = node_kinds(spec)
    grid, bw = scenario_grid(spec, len(kinds))
    return KindTables(load_scenario("paper", SHARDED), kinds), grid, bw


@pytest.mark.parametrize("strategy", ["baseline", "A", "B", "hybrid", "streaming"])
def test_sharded_nodes_plan_exactly_as_make_plan(sharded, strategy):
    kt, grid, bw = sharded
    d = decide(kt, grid, bw, strategy)
    comm = np.broadcast_to(d["comm_s"], (len(grid),))
    layouts = set()
    for r in range(len(grid)):
        scenario = kt.scenario(grid[r], bw[r])
        plan = make_plan(scenario, strategy)
        layouts |= {n.sharding for n in plan.nodes}
        assert [n.batch_size for n in plan.nodes] == d["batch"][r].tolist()
        assert [n.local_steps for n in plan.nodes] == d["steps"][r].tolist()
        assert [n.step_s for n in plan.nodes] == d["step_s"][r].tolist()
        assert plan.comm_s == comm[r]
    assert layouts - {"none"}, layouts  # the case at issue: some nodes are sharded


@pytest.mark.parametrize("strategy", ["baseline", "A", "streaming"])
def test_sharded_metrics_match_the_simulated_timeline(sharded, strategy):
    kt, grid, bw = sharded
    d = decide(kt, grid, bw, strategy)
    fast = metrics(d, kt.gpus[grid], kt.base.model.seq_len, outer_step_s(kt.base))
    for r in range(0, len(grid), 2):
        scenario = kt.scenario(grid[r], bw[r])
        plan = make_plan(scenario, strategy)
        ref = timeline_metrics(plan, simulate(scenario, plan, "analytic"))
        for key in ("round_s", "wall_s", "idle_s", "tokens_per_s"):
            assert fast[key][r] == pytest.approx(ref[key], rel=1e-9, abs=1e-9), key  # summation order only


def _args(out, *extra):
    return ["--nodes", "2", "--gpus-per-node", "4", "--bandwidth-gbps", "1", "--strategy", "A",
            "--samples", "4", "--workers", "1", "--no-figures", "--out", str(out), *extra]


def test_sweep_takes_the_types_plan_fits_by_sharding(tmp_path, capsys):
    assert sweep(_args(tmp_path / "o", "--set", SHARDED[0], "--gpu-types", "a30,titan-xp")) == 0
    assert (tmp_path / "o" / "sweep.sha256").exists()


def test_types_no_layout_fits_are_all_named_and_the_suggestions_work(tmp_path, capsys):
    # llama-1b at batch 16 on one GPU per node (nothing to shard over): a30 and titan-rtx fail, h200 holds it
    args = _args(tmp_path / "o", "--set", "model.preset=llama-1b", "--set", "training.batch_size=16",
                 "--gpu-types", "a30,h200,titan-rtx")
    args[args.index("--gpus-per-node") + 1] = "1"
    assert sweep(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--gpu-types a30,titan-rtx:" in err and "batch 16" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    suggestions = re.findall(r"\((--[a-z-]+ [^ )]+)\)", err)
    flags = {s.split()[0] for s in suggestions}
    assert {"--gpu-types", "--set", "--gpus-per-node"} <= flags, err
    for k, suggestion in enumerate(suggestions):
        flag, value = suggestion.split()
        followed = list(args)
        followed[followed.index("--out") + 1] = str(tmp_path / f"s{k}")
        if flag == "--set":
            followed += [flag, value]
        else:
            followed[followed.index(flag) + 1] = value
        assert sweep(followed) == 0, (suggestion, capsys.readouterr().err)
