"""Nodes timed by calibration profiles: t(b) exact where measured, slowest GPU rules, B and measured-* use them."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from formats.profile import COLUMNS
from simulator.engines.engine import simulate, summary
from simulator.models.timing import node_timings
from simulator.scenario import load_scenario
from simulator.strategies import make_plan


def write_profile(path, gpu_key, times, oom=(), mem=None, total=None, seq_len=64, dtype="fp32", model="tiny"):
    rows = []
    for b, t in times.items():
        rows.append({"batch_size": b, "step_s_median": t, "oom": "false",
                     "peak_mem_bytes": "" if mem is None else mem[b]})
    rows += [{"batch_size": b, "step_s_median": "", "oom": "true", "peak_mem_bytes": ""} for b in oom]
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame:
            frame[column] = ""
    frame["device_name"], frame["gpu_key"], frame["model"] = gpu_key, gpu_key, model
    frame["seq_len"], frame["dtype"], frame["device_index"], frame["repeats"] = seq_len, dtype, 0, 5
    frame["mem_total_bytes"] = "" if total is None else total
    frame[list(COLUMNS)].to_csv(path, index=False)
    return path.name


SCENARIO = """
name = "profiled"
[model]
preset = "tiny"
seq_len = 64
dtype = "fp32"
[training]
rounds = 3
local_steps = 10
batch_size = 2
[[nodes]]
name = "one"
gpus = {{ "a30" = 1 }}
profile = "{a}"
[[nodes]]
name = "mixed"
gpus = {{ "a30" = 1, "t4" = 1 }}
profile = ["{a}", "{t}"]
"""


@pytest.fixture
def profiled(tmp_path, write_scenario):
    a = write_profile(tmp_path / "a30.csv", "a30", {1: 0.10, 2: 0.12, 4: 0.16, 8: 0.24},
                      oom=(16,), mem={1: 1e9, 2: 2e9, 4: 4e9, 8: 8e9}, total=24e9)
    t = write_profile(tmp_path / "t4.csv", "t4", {1: 0.20, 2: 0.26, 4: 0.38})
    return load_scenario(str(write_scenario(SCENARIO.format(a=a, t=t))))


def test_exact_at_measured_and_linear_between(profiled):
    one = node_timings(profiled)[0]
    assert one.source == "profile"
    assert [one.step_s(b) for b in (1, 2, 4, 8)] == [0.10, 0.12, 0.16, 0.24]
    assert one.step_s(6) == pytest.approx(0.20)  # halfway between 4 and 8


def test_node_follows_slowest_gpu_plus_allreduce(profiled):
    _one, mixed = node_timings(profiled)
    assert mixed.step_s(2) > 0.26  # the T4's 0.26 s plus the intra-node gradient all-reduce
    assert mixed.step_s(2) == pytest.approx(0.26 + (mixed.step_s(1) - 0.20))


def test_oom_rows_bound_strategy_b(profiled):
    one = node_timings(profiled)[0]
    assert one.fits(8) and not one.fits(16)
    plan = make_plan(profiled, "B")
    assert plan.nodes[0].batch_size == 8  # 2, 4, 8 fit; 16 ran out of memory


def test_measured_steps_reduces_idle(profiled):
    def idle(strategy):
        plan = make_plan(profiled, strategy)
        return summary(simulate(profiled, plan), plan)["idle_s"].sum()
    assert idle("measured-steps") < idle("baseline")
    assert idle("measured-batch") < idle("baseline")


def test_profile_at_other_seq_len_is_an_error(tmp_path, write_scenario):
    a = write_profile(tmp_path / "a.csv", "a30", {1: 0.1, 2: 0.2}, seq_len=128)
    t = write_profile(tmp_path / "t.csv", "t4", {1: 0.1, 2: 0.2})
    scenario = load_scenario(str(write_scenario(SCENARIO.format(a=a, t=t))))
    with pytest.raises(ValueError, match="seq_len"):
        make_plan(scenario, "baseline")


def test_profile_of_another_gpu_is_an_error(tmp_path, write_scenario):
    a = write_profile(tmp_path / "a.csv", "v100", {1: 0.1, 2: 0.2})
    t = write_profile(tmp_path / "t.csv", "t4", {1: 0.1, 2: 0.2})
    scenario = load_scenario(str(write_scenario(SCENARIO.format(a=a, t=t))))
    with pytest.raises(ValueError, match="measured on 'v100'"):
        make_plan(scenario, "baseline")


def test_max_batch_reaches_the_limit_when_everything_fits(profiled, tmp_path, write_scenario):
    one, mixed = node_timings(profiled)
    assert one.max_batch(limit=100) == 15  # batch 16 ran out of memory
    assert mixed.max_batch(limit=100) == 15  # the node's A30 bounds it
    t = write_profile(tmp_path / "t4only.csv", "t4", {1: 0.2, 2: 0.26})  # no OOM rows, no memory figures
    text = SCENARIO.format(a=t, t=t).replace('"a30" = 1 }', '"t4" = 1 }').replace('"a30" = 1, ', "")
    t4 = node_timings(load_scenario(str(write_scenario(text, "t4.toml"))))[0]
    assert t4.max_batch(limit=100) == 100


def test_shipped_cpu_profiles_measured_steps_beats_baseline():
    # profiles/ holds real profiles of one CPU at 1 and 2 threads (geodt calibrate device --threads 1|2)
    from pathlib import Path
    scenario = load_scenario(str(Path(__file__).parents[1] / "profiles" / "two-cpus.toml"))
    idle = {}
    for strategy in ("baseline", "measured-steps"):
        plan = make_plan(scenario, strategy)
        idle[strategy] = summary(simulate(scenario, plan), plan)["idle_s"].sum()
    assert idle["measured-steps"] < 0.1 * idle["baseline"]


FIDELITY_SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity").glob("*.toml"))


@pytest.mark.parametrize("path", FIDELITY_SCENARIOS, ids=lambda p: p.stem)
def test_every_fidelity_scenario_loads_with_its_committed_profiles(path):
    # wan-three and wan-four named profiles that were never committed: `geodt simulate` on them
    # failed, and so did the links calibration that prices their WAN cases.
    scenario = load_scenario(str(path))
    for timing in node_timings(scenario):
        assert 0 < timing.step_s(scenario.training.batch_size) < 10


def test_a_node_prices_its_outer_step_from_its_own_profile(tmp_path):
    """`geodt calibrate device` writes the host's outer step into the profile; the simulator prices that
    node's outer step from it (state on the CPU, or on the device), other nodes at the VM default."""
    from calibrate.profile_writer import ProfileWriter, set_profile_columns
    from formats.profile import COLUMNS
    from simulator.models.memory import Layout
    from simulator.models.network import OUTER_STEP_NS_PER_PARAM, node_outer_step_s, outer_step_s, outer_step_source
    from simulator.scenario import load_scenario

    identity = {"device_name": "NVIDIA H200", "device_index": 0, "gpu_key": "h200", "model": "tiny",
                "seq_len": 32, "dtype": "bf16"}
    writer = ProfileWriter(tmp_path / "p.csv", identity)
    for batch, step in ((1, 0.01), (2, 0.015)):
        writer.append(dict.fromkeys(COLUMNS) | identity | {"batch_size": batch, "step_s_median": step, "oom": False})
    writer.close()
    set_profile_columns(tmp_path / "p.csv", {"outer_step_cpu_ns_per_param": 1.33, "outer_step_device_ns_per_param": 0.02})
    (tmp_path / "s.toml").write_text(
        'name = "s"\n[model]\npreset = "tiny"\nseq_len = 32\ndtype = "bf16"\n[training]\nrounds = 2\nlocal_steps = 2\n'
        'batch_size = 1\ncompile = "off"\n[[nodes]]\nname = "a"\ngpus = { "h200" = 1 }\nprofile = "p.csv"\n'
        '[[nodes]]\nname = "b"\ngpus = { "h200" = 1 }\n')
    s = load_scenario(str(tmp_path / "s.toml"))
    n = s.model.param_count
    assert node_outer_step_s(s, s.nodes[0], Layout()) == pytest.approx(1.33e-9 * n)
    assert node_outer_step_s(s, s.nodes[0], Layout(outer_state="device")) == pytest.approx(0.02e-9 * n)
    assert node_outer_step_s(s, s.nodes[1], Layout()) == pytest.approx(OUTER_STEP_NS_PER_PARAM * 1e-9 * n)
    assert outer_step_s(s) == pytest.approx(OUTER_STEP_NS_PER_PARAM * 1e-9 * n)  # the slowest host
    assert outer_step_source(s) == ("outer step: a 1.33 ns/param (its profile), "
                                    f"b {OUTER_STEP_NS_PER_PARAM} ns/param (this VM's default, not its host's)")


def test_calibrate_device_times_the_hosts_checkpoint_and_the_simulator_prices_it(tmp_path, capsys):
    """`geodt calibrate device` times real/checkpoint/checkpoint.py's snapshot and write on its host into the
    profile (ns per byte, every row alike; its timing file removed), and a scenario of that profile
    prices its checkpoints from them."""
    pytest.importorskip("torch")  # calibrate device times steps
    import pandas as pd

    from geodt.cli import main
    from simulator.models.checkpoints import checkpoint_cost
    from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM
    from simulator.scenario import load_scenario

    out = tmp_path / "p.csv"
    assert main(["calibrate", "device", "--device", "cpu", "--model", "tiny", "--seq-len", "16", "--batch", "1",
                 "--repeats", "1", "--warmup", "0", "--compile", "off", "--out", str(out)]) == 0
    assert "checkpoint on this host: snapshot" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]
    frame = pd.read_csv(out)
    snapshot_ns, write_ns = frame["ckpt_snapshot_ns_per_byte"].iloc[0], frame["ckpt_write_ns_per_byte"].iloc[0]
    assert snapshot_ns > 0 and write_ns > 0  # measured: only their sign is certain on a shared machine
    (tmp_path / "s.toml").write_text(
        'name = "s"\n[model]\npreset = "tiny"\nseq_len = 16\ndtype = "fp32"\n[training]\nrounds = 2\nlocal_steps = 2\n'
        'batch_size = 1\ncompile = "off"\n[[nodes]]\nname = "a"\ngpus = { "cpu" = 1 }\nprofile = "p.csv"\n')
    scenario = load_scenario(str(tmp_path / "s.toml"))
    size = CHECKPOINT_BYTES_PER_PARAM * scenario.model.param_count
    cost = checkpoint_cost(scenario)
    # a CPU node: the write blocks after the snapshot (simulator/models/checkpoints.py)
    assert cost.snapshot_s == pytest.approx((snapshot_ns + write_ns) * 1e-9 * size) and cost.write_s == 0.0


def test_a_checkpoint_that_cannot_be_written_leaves_the_profile_without_its_columns(tmp_path, capsys, monkeypatch):
    """A full disk while timing the host's checkpoint: one line, the profile kept, its ckpt columns empty."""
    pytest.importorskip("torch")
    import errno

    import pandas as pd

    import real.checkpoint.checkpoint
    from geodt.cli import main

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "x")
    monkeypatch.setattr(real.checkpoint.checkpoint, "time_checkpoint", full)
    out = tmp_path / "p.csv"
    assert main(["calibrate", "device", "--device", "cpu", "--model", "tiny", "--seq-len", "16", "--batch", "1",
                 "--repeats", "1", "--warmup", "0", "--compile", "off", "--out", str(out)]) == 0
    assert f"{out}: checkpoint not timed (No space left on device); its columns left empty" in capsys.readouterr().err
    frame = pd.read_csv(out)
    assert frame["ckpt_write_ns_per_byte"].isna().all() and frame["outer_step_cpu_ns_per_param"].notna().all()
