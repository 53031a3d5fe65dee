"""The simulator prices the executor's checkpoints: every k rounds and after the last, a snapshot
that blocks, a write in the background (simulator/models/checkpoints.py)."""
import numpy as np
import pandas as pd
import pytest

from simulator.models.checkpoints import CheckpointCost
from tests.test_netprofile import SCENARIO as CPU_SCENARIO
from tests.test_netprofile import _rows

# The same nodes as GPUs: a GPU node trains beside its background write (on a CPU node the write
# takes the training's cores and is priced as blocking: test_on_a_cpu_node_the_write_blocks).
SCENARIO = (CPU_SCENARIO.replace('gpus = { "cpu" = 1 }', 'gpus = { "t4" = 1 }')
            .replace('gpus = { "cpu" = 2 }\nstep_time_s = 0.1\ncpu_quota = 0.5\ncpu_cores = [1]',
                     'gpus = { "t4" = 2 }\nstep_time_s = 0.1'))


def test_a_checkpoint_blocks_for_its_snapshot_and_for_a_write_still_running():
    cost = CheckpointCost(every=3, snapshot_s=0.1, write_s=1.0, note="")
    assert cost.due(np.full(7, 0.2)).tolist() == [False, False, True, False, False, True, False]  # no final set
    block = cost.block_s(np.full(7, 0.2))
    # round 2: the first write; round 5: 0.6 s of rounds since, 0.4 s of it left
    assert block == pytest.approx([0, 0, 0.1, 0, 0, 0.5, 0], abs=1e-12)
    assert CheckpointCost(1, 0.0, 0.0, "").block_s(np.ones(3)).tolist() == [0.0, 0.0, 0.0]


def _snapshot_rows(fixed_s=2e-4, copy_bps=80e9):
    rows = _rows()
    snap = rows[rows.kind == "checkpoint"].copy()
    snap["kind"] = "snapshot"
    seconds = fixed_s + 8 * snap["size"] / copy_bps
    for column in ("seconds_median", "seconds_p10", "seconds_p90"):
        snap[column] = seconds
    return pd.concat([rows, snap])


@pytest.mark.parametrize("engine", ["simpy", "analytic"])
def test_checkpoint_every_k_rounds_delays_only_those_rounds(tmp_path, write_scenario, engine):
    from simulator.engines.engine import simulate
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    _snapshot_rows().to_csv(tmp_path / "net.csv", index=False)
    text = SCENARIO.replace("rounds = 2\n", "rounds = 5\ncheckpoint_every = 2\n")
    scenario = load_scenario(str(write_scenario(text)))
    cost = checkpoint_cost(scenario)
    size = CHECKPOINT_BYTES_PER_PARAM * scenario.model.param_count
    assert cost.snapshot_s == pytest.approx(2e-4 + 8 * size / 80e9, rel=1e-9)
    assert cost.write_s == pytest.approx(1e-3 + 8 * size / 4e9, rel=1e-9)
    timeline = simulate(scenario, make_plan(scenario, "baseline"), engine=engine)
    by_round = timeline.groupby("round")
    gaps = (by_round.round_start_s.min().iloc[1:].to_numpy() - by_round.round_end_s.max().iloc[:-1].to_numpy())
    # after rounds 2 and 4 (1-based) a snapshot; the write hides behind the rounds (they are seconds long)
    assert gaps == pytest.approx([0.0, cost.snapshot_s, 0.0, cost.snapshot_s], abs=1e-12)


def test_on_a_cpu_node_the_write_blocks(tmp_path, write_scenario):
    """A CPU node's background write takes the cores its training uses: snapshot and write block."""
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.scenario import load_scenario

    _snapshot_rows().to_csv(tmp_path / "net.csv", index=False)
    gpu = checkpoint_cost(load_scenario(str(write_scenario(SCENARIO))))
    cpu = checkpoint_cost(load_scenario(str(write_scenario(CPU_SCENARIO))))
    assert gpu.write_s > 0 and (cpu.snapshot_s, cpu.write_s) == (pytest.approx(gpu.snapshot_s + gpu.write_s), 0.0)
    assert cpu.note.endswith("on a CPU node it takes the cores training uses")


def test_a_profile_without_snapshot_rows_prices_the_write_as_blocking(tmp_path, write_scenario):
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.scenario import load_scenario

    _rows().to_csv(tmp_path / "net.csv", index=False)
    cost = checkpoint_cost(load_scenario(str(write_scenario(SCENARIO))))
    assert cost.write_s == 0.0 and cost.snapshot_s > 0 and cost.every is None and "blocking" in cost.note


def test_the_predicted_wall_clock_waits_for_the_last_write(tmp_path, write_scenario):
    from simulator.engines.engine import simulate
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.models.wallclock import predicted_wall_clock
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    _snapshot_rows().to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(write_scenario(SCENARIO.replace("rounds = 2\n", "rounds = 4\ncheckpoint_every = 2\n"))))
    timeline = simulate(scenario, make_plan(scenario, "baseline"), engine="analytic")
    wall = predicted_wall_clock(scenario, timeline)
    cost = checkpoint_cost(scenario)
    assert wall.rounds_s == pytest.approx(timeline.round_end_s.max())
    assert wall.last_checkpoint_s == pytest.approx(cost.snapshot_s + cost.write_s, rel=1e-9)


def test_checkpoint_every_is_checked_like_every_training_key(write_scenario):
    from formats.errors import InputError
    from simulator.scenario import load_scenario

    text = SCENARIO.replace('profile = "net.csv"\n', "").replace("rounds = 2\n", "rounds = 2\ncheckpoint_every = 0\n")
    with pytest.raises(InputError, match=r"training.checkpoint_every: expected a positive integer"):
        load_scenario(str(write_scenario(text)))


@pytest.mark.parametrize("strategy", ["baseline", "streaming"])
def test_checkpoints_every_k_rounds_chunk_exactly_and_agree_across_engines(tmp_path, write_scenario, strategy):
    """Per-round checkpoints (every 3rd of 7, and a write long enough that the next one waits for
    it) through the chunked paths: the whole run's tables bit for bit; SimPy and analytic agree."""
    from simulator.engines.engine import simulate_chunks, simulate_syncs
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    text = SCENARIO.replace("rounds = 2\n", "rounds = 7\ncheckpoint_every = 3\n") + "[simulation]\njitter_cv = 0.1\n"
    _snapshot_rows().to_csv(tmp_path / "net.csv", index=False)
    size = CHECKPOINT_BYTES_PER_PARAM * load_scenario(str(write_scenario(text))).model.param_count
    rows = _snapshot_rows()
    slow_write = rows["size"] / size * 4.0  # 4 s for the checkpoint: longer than 3 rounds
    for column in ("seconds_median", "seconds_p10", "seconds_p90"):
        rows[column] = np.where(rows.kind == "checkpoint", slow_write, rows[column])
    rows.to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(write_scenario(text)))
    assert checkpoint_cost(scenario).write_s == pytest.approx(4.0, rel=0.01)
    plan = make_plan(scenario, strategy)
    results = {}
    for engine in ("simpy", "analytic"):
        timeline, _syncs = simulate_syncs(scenario, plan, engine)
        for chunk in (1, 3, 100):
            parts = []
            simulate_chunks(scenario, plan, engine, lambda t, s, parts=parts: parts.append((t, s)), chunk)
            pd.testing.assert_frame_equal(pd.concat([t for t, _ in parts], ignore_index=True), timeline,
                                          check_exact=True)
        results[engine] = timeline
    pd.testing.assert_frame_equal(results["simpy"], results["analytic"], rtol=1e-12)
    by_round = results["analytic"].groupby("round")
    gaps = by_round.round_start_s.min().iloc[1:].to_numpy() - by_round.round_end_s.max().iloc[:-1].to_numpy()
    assert (gaps[[0, 1, 3, 4]] == 0).all() and gaps[2] > 0 and gaps[5] > gaps[2]  # the 2nd waits for the 1st write


def _profile_with_checkpoint(path, snapshot_ns="0.5", write_ns="2.0"):
    path.write_text(
        "device_name,device_index,gpu_key,model,seq_len,dtype,batch_size,step_s_median,step_s_mean,step_s_p10,"
        "step_s_p90,repeats,peak_mem_bytes,mem_total_bytes,oom,tokens_per_s,sm_util_pct,mem_util_pct,power_w,"
        "torch_version,cuda_version,driver_version,host,measured_at,compiled,ckpt_snapshot_ns_per_byte,"
        "ckpt_write_ns_per_byte\n"
        f"cpu,,cpu,tiny,32,fp32,1,0.1,0.1,,,5,,,false,,,,,t,,,h,m,false,{snapshot_ns},{write_ns}\n")


def test_without_a_network_profile_the_nodes_profiles_price_checkpoints(tmp_path):
    """A profile's host checkpoint rates (geodt calibrate device) price the snapshot and the write,
    the slowest host's of each; a node without them is named; none at all: not priced, said so."""
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM
    from simulator.scenario import load_scenario

    _profile_with_checkpoint(tmp_path / "a.csv", "0.5", "2.0")
    _profile_with_checkpoint(tmp_path / "b.csv", "0.25", "3.0")
    head = 'name = "s"\n[model]\npreset = "tiny"\nseq_len = 32\ndtype = "fp32"\n[training]\nrounds = 2\nlocal_steps = 3\n'
    node = '[[nodes]]\nname = "{}"\ngpus = {{ "cpu" = 1 }}\n{}\n'
    (tmp_path / "s.toml").write_text(head + node.format("a", 'profile = "a.csv"') + node.format("b", 'profile = "b.csv"')
                                     + node.format("c", "step_time_s = 0.1"))
    scenario = load_scenario(str(tmp_path / "s.toml"))
    size = CHECKPOINT_BYTES_PER_PARAM * scenario.model.param_count
    cost = checkpoint_cost(scenario)
    # CPU nodes: the write (the slowest host's, 3.0 ns a byte) blocks after the snapshot (0.5)
    assert (cost.snapshot_s, cost.write_s) == (pytest.approx(3.5e-9 * size), 0.0)
    assert "not c: no checkpoint columns" in cost.note
    (tmp_path / "s.toml").write_text(head + node.format("c", "step_time_s = 0.1"))
    bare = checkpoint_cost(load_scenario(str(tmp_path / "s.toml")))
    assert (bare.snapshot_s, bare.write_s) == (0.0, 0.0) and bare.note.startswith("checkpoints not priced")


def test_the_h200_run_with_checkpoints_is_predicted_from_its_profile():
    """benchmarks/estimate/h200-2026-11-27: the one-node H200 run's committed scenario, profile and
    measured wall time; the prediction is deterministic (37.36 s printed on the GPU machine), and
    the measured 37.60 s is the run's own trace."""
    from pathlib import Path

    from simulator.engines.engine import simulate
    from simulator.models.wallclock import measured_wall_s, predicted_wall_clock
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    folder = Path(__file__).resolve().parents[1] / "benchmarks/estimate/h200-2026-11-27"
    scenario = load_scenario(str(folder / "gpu1-ckpt.toml"))
    timeline = simulate(scenario, make_plan(scenario, "baseline"), engine="analytic")
    wall = predicted_wall_clock(scenario, timeline)
    assert round(wall.wall_s, 2) == 37.36 and round(wall.last_checkpoint_s, 2) == 11.00
    measured = measured_wall_s(pd.read_csv(folder / "trace-gpu1-ckpt.csv"))
    assert round(measured, 2) == 37.60
