"""Issue 10's planner classes: memory respected by every strategy, bounded searches, NVLink inside
nodes, one rule per strategy for make_plan and the sweep, 10,000 nodes, outputs as a set."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from simulator.cli import plan_main, simulate_main
from simulator.models.timing import node_timings
from simulator.scenario import load_scenario
from simulator.strategies import STRATEGIES, make_plan, register

ROOT = Path(__file__).resolve().parents[1]


def cluster(path: Path, nodes: list[tuple[str, dict]], batch: int = 4, extra: str = "") -> Path:
    """A llama-1b, seq 2048 scenario file with the given (name, gpus) nodes."""
    lines = ['name = "mem"', "[model]", 'preset = "llama-1b"', "seq_len = 2048", "[training]", "rounds = 2",
             "local_steps = 10", f"batch_size = {batch}", extra]
    for name, gpus in nodes:
        table = ", ".join(f'"{k}" = {v}' for k, v in gpus.items())
        lines += ["[[nodes]]", f'name = "{name}"', f"gpus = {{ {table} }}"]
    path.write_text("\n".join(lines) + "\n")
    return path


REPRODUCER = [("h100", {"h100-sxm": 8}), ("t4", {"t4": 2}), ("v100", {"v100": 4})]


UNSHARDED = 'sharding = "none"\nactivation_checkpointing = "none"'


def test_issue_reproducer_a_node_that_cannot_hold_batch_1_is_one_line(tmp_path, capsys):
    path = cluster(tmp_path / "s.toml", REPRODUCER, extra=UNSHARDED)
    assert simulate_main([str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"geodt simulate: {path}: nodes[1]: node 't4' cannot hold even batch 1: t4: batch 1 needs "
                   "20.2 GiB, the GPU gives a step 14.3 GiB of its 16.0; expected GPUs with more memory, a smaller model or a shorter seq_len")
    assert not (tmp_path / "o").exists()
    from simulator.sweep.sweep_cli import main as sweep
    assert sweep(["--table", str(path), "--out", str(tmp_path / "t")]) == 2  # no more "A: 10.6x"
    assert "cannot hold even batch 1" in capsys.readouterr().err


def test_a_baseline_batch_that_does_not_fit_is_one_line(tmp_path, capsys):
    path = cluster(tmp_path / "s.toml", [("h100", {"h100-sxm": 8}), ("v100", {"v100": 4})], extra=UNSHARDED)
    assert simulate_main([str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for needle in ("training.batch_size", "node 'v100'", "v100: batch 4 needs 38.3 GiB, the GPU gives a step 29.5 GiB of its 32.0",
                   "at most 2"):
        assert needle in err


def test_a_refused_baseline_batch_names_the_largest_any_layout_holds(tmp_path, capsys):
    """llama-3.1-8b at seq 8192 on 8 H100s: no layout holds batch 4; zero2 + recomputation holds 1,
    fsdp + recomputation 3. The refusal named zero2 and "at most 1" (the first layout holding
    batch 1); it names the layout that holds the most and its largest batch."""
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\npreset = "llama-3.1-8b"\nseq_len = 8192\ndtype = "bf16"\n[training]\n'
                    'batch_size = 4\n[[nodes]]\nname = "a"\ngpus = { "h100-sxm" = 8 }\n')
    assert plan_main([str(path), "--strategy", "baseline", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "(fsdp over 8 devices, full recomputation)" in err and err.endswith("(at most 3 here)"), err
    assert plan_main([str(path), "--strategy", "baseline", "--set", "training.batch_size=3",
                      "--out", str(tmp_path / "o")]) == 0


def test_every_strategy_keeps_every_batch_within_memory(tmp_path):
    # b = 3 fits the V100s (with recomputation, auto); A would scale the H100s' batch to round(3 x 989 / 125) = 24,
    # but 10 fit (geodt's traced step, facts/step_memory.csv).
    path = cluster(tmp_path / "s.toml", [("h100", {"h100-sxm": 8}), ("v100", {"v100": 4})], batch=3)
    scenario = load_scenario(str(path))
    timings = node_timings(scenario)
    assert [t.max_batch() for t in timings] == [10, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # network-aware printed a divide RuntimeWarning and "utilisation nan"
        plans = {name: make_plan(scenario, name) for name in STRATEGIES}
    for name, plan in plans.items():
        for timing, node in zip(timings, plan.nodes):
            assert timing.fits(node.batch_size), (name, node)
            assert np.isfinite(node.step_s) and node.step_s > 0
        assert "nan" not in plan.note
    assert [n.batch_size for n in plans["A"].nodes] == [10, 3]  # cut to what fits
    assert [n.batch_size for n in plans["B"].nodes] == [6, 3]  # 3, 6 fit; 12 does not


def test_strategy_b_ends_where_nothing_bounds_memory():
    # two CPU profiles without memory figures: B used to double forever (the command never exited)
    code = subprocess.run([sys.executable, "-m", "geodt", "plan", "profiles/two-cpus.toml", "--strategy", "B",
                           "--out", "/dev/null/x"], cwd=ROOT, capture_output=True, timeout=60)
    scenario = load_scenario(str(ROOT / "profiles" / "two-cpus.toml"))
    plan = make_plan(scenario, "B")
    assert [n.batch_size for n in plan.nodes] == [128, 128]  # b = 8 doubled up to 16 x b
    assert code.returncode == 2  # /dev/null/x is not a directory: planned, then refused in one line
    assert len(code.stderr.decode().strip().splitlines()) == 1


def test_nvlink_inside_sxm_nodes_pcie_elsewhere_and_the_key_overrides(tmp_path):
    nodes = [("sxm", {"h100-sxm": 8}), ("pcie", {"h100-pcie": 8}), ("mixed", {"h100-sxm": 4, "h100-pcie": 4})]
    scenario = load_scenario(str(cluster(tmp_path / "s.toml", nodes, batch=1)))
    from simulator.models.timing import intra_node_allreduce_s, node_intra_gbps
    assert [node_intra_gbps(n) for n in scenario.nodes] == [3600.0, 100.0, 100.0]
    grad_bits = 4 * scenario.model.param_count * 8
    sxm = intra_node_allreduce_s(scenario, scenario.nodes[0])
    assert sxm == pytest.approx(2 * 7 / 8 * grad_bits / 3600e9, rel=1e-12)
    slow = load_scenario(str(tmp_path / "s.toml"), ["nodes.sxm.intra_node_gbps=100"])
    assert intra_node_allreduce_s(slow, slow.nodes[0]) == pytest.approx(36 * sxm, rel=1e-12)


def test_ten_thousand_nodes_plan(tmp_path):
    kinds = ["a30", "v100", "rtx-3090", "t4"]
    lines = ['name = "big"', "[model]", 'preset = "llama-150m"', "[training]", "rounds = 2"]
    for i in range(10_000):
        lines += ["[[nodes]]", f'name = "n{i}"', f'gpus = {{ "{kinds[i % 4]}" = 2 }}']
    path = tmp_path / "big.toml"
    path.write_text("\n".join(lines) + "\n")
    scenario = load_scenario(str(path))
    for name in ("baseline", "A", "measured-batch", "hybrid", "network-aware", "sync-ddp"):
        plan = make_plan(scenario, name)
        assert len(plan.nodes) == 10_000 and plan.nodes[-1].node == "n9999"


def test_a_newly_registered_strategy_sweeps_and_plans_alike(monkeypatch):
    from simulator import strategies
    from simulator.sweep.sweep import KindTables, SweepSpec, chunk_frame, decide, node_kinds, scenario_grid

    def half_steps(tables, net):
        batch = np.full(tables.gpus.shape, tables.batch_size, dtype=np.int64)
        return {"batch": batch, "steps": np.maximum(1, batch * 0 + tables.local_steps // 2)}

    registry = dict(strategies.STRATEGIES)  # a copy: `half` is registered for this test only
    for module in (strategies.registry, strategies, sys.modules["simulator.sweep.sweep"]):
        monkeypatch.setattr(module, "STRATEGIES", registry)
    register("half")(half_steps)
    spec = SweepSpec(nodes=3, gpus_per_node=2, gpu_types=("a30", "v100"), mixed_nodes=True,
                     bandwidths_gbps=(1.0,), strategies=("baseline", "half"), samples=4, seed=0)
    kt = KindTables(load_scenario("paper"), node_kinds(spec))
    kinds, bw = scenario_grid(spec, len(kt.kinds))
    frame = chunk_frame(kt, kinds, bw, spec.strategies, 0)
    assert sorted(frame["strategy"].unique()) == ["baseline", "half"]
    d = decide(kt, kinds[:1], bw[:1], "half")
    plan = strategies.make_plan(kt.scenario(kinds[0], bw[0]), "half")
    assert [n.local_steps for n in plan.nodes] == d["steps"][0].tolist() == [50, 50, 50]
    assert [n.step_s for n in plan.nodes] == d["step_s"][0].tolist()
    assert plan.comm_s == d["comm_s"][0]


def test_sweep_refuses_a_gpu_type_that_cannot_hold_the_batch(tmp_path, capsys):
    from simulator.sweep.sweep_cli import main as sweep
    # one GPU per node: nothing to shard over (with 4, plan and sweep both shard the t4 and fit it)
    args = ["--gpu-types", "a100-80gb,t4", "--set", 'model.preset="llama-1b"', "--set", "model.seq_len=2048",
            "--gpus-per-node", "1", "--samples", "4", "--out", str(tmp_path / "o")]
    assert sweep(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpu-types t4: 1 of 2 GPU types cannot hold" in err and "t4: batch 4 needs" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["inf", "nan", "1e-30", "1e300"])
def test_sweep_bandwidth_must_be_finite_and_in_range(tmp_path, capsys, value):
    from simulator.sweep.sweep_cli import main as sweep
    assert sweep(["--bandwidth-gbps", value, "--samples", "4", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--bandwidth-gbps" in err


# ---- outputs: a set, or nothing; stale outputs removed and named; Ctrl-C ----

SMALL_ARGS = ["hetero-cpu", "--set", "training.rounds=2"]


def test_plan_after_simulate_removes_and_names_the_stale_outputs(tmp_path, capsys):
    out = tmp_path / "o"
    assert simulate_main([*SMALL_ARGS, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["idle.png", "loss.png", "plan.csv", "scenario.toml", "summary.csv",
                                                      "syncs.parquet", "timeline.parquet", "trace.json"]
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert plan_main([*SMALL_ARGS, "--strategy", "C", "--out", str(out)]) == 2  # simulate's folder: --force
    assert "holds another command's outputs" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert plan_main([*SMALL_ARGS, "--strategy", "C", "--out", str(out), "--force"]) == 0
    assert ("removed summary.csv, trace.json, timeline.parquet, syncs.parquet, loss.png of an earlier command"
            in capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["idle.png", "plan.csv", "scenario.toml"]


def test_a_directory_where_a_file_goes_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    (out / "timeline.parquet").mkdir(parents=True)
    assert simulate_main([*SMALL_ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "timeline.parquet: exists and is not a regular file" in err
    assert [p.name for p in out.iterdir()] == ["timeline.parquet"]
    assert [p.name for p in tmp_path.iterdir()] == ["o"]  # no staging directory left


def test_a_full_disk_replaces_nothing(tmp_path, capsys, monkeypatch):
    import builtins
    import errno

    out = tmp_path / "o"
    assert simulate_main([*SMALL_ARGS, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_open, opened = builtins.open, []

    def fills_up(path, mode="r", *args, **kwargs):
        if "w" in mode and ".tmp" in str(path):
            opened.append(path)
            if len(opened) == 3:  # the third output of the set does not fit
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fills_up)
    assert simulate_main([*SMALL_ARGS, "--set", "training.rounds=3", "--out", str(out)]) == 2
    monkeypatch.setattr(builtins, "open", real_open)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "nothing was replaced" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["o"]


def test_ctrl_c_in_simulate_is_one_line_130_and_nothing_written(tmp_path, capsys, monkeypatch):
    import simulator.cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulator.cli, "make_plan", interrupted)
    assert simulate_main([*SMALL_ARGS, "--out", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err == "geodt simulate: interrupted; nothing was written\n"
    assert not (tmp_path / "o").exists()


def test_the_scenario_name_cannot_leave_the_output_root(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert simulate_main([*SMALL_ARGS, "--set", 'name="../escape"']) == 2
    assert "not a path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("preset, baseline, other, planned, measured_largest", [
    ("llama-150m", 12, "t4", 96, 133), ("llama-1b", 3, "v100", 24, 42)])
def test_b_never_plans_a_batch_the_h200_could_not_hold(tmp_path, preset, baseline, other, planned, measured_largest):
    # issue 29: the eager step (compile = "off") on an H200 ran out of memory above batch 133
    # (llama-150m) and 42 (llama-1b), seq 1024 bf16 (benchmarks/estimate/h200/); B scales the
    # baseline batch by FLOPS where memory allows, and must stay under what the H200 held
    path = tmp_path / "b.toml"
    path.write_text(f'name = "b"\n[model]\npreset = "{preset}"\nseq_len = 1024\ndtype = "bf16"\n'
                    f'[training]\nbatch_size = {baseline}\ncompile = "off"\n'
                    f'[[nodes]]\nname = "h200"\ngpus = {{ h200 = 1 }}\n[[nodes]]\nname = "other"\ngpus = {{ {other} = 1 }}\n')
    plan = make_plan(load_scenario(str(path)), "B")
    assert plan.nodes[0].batch_size == planned <= measured_largest
