"""`geodt calibrate network --wan shaped --scenario S`: the sync timed on the scenario's own
shaped links (real/wan/wan.py), written as network-profile rows the simulator loads.

Needs root and the kernel's netns, veth, bridge and tbf (skips with real.wan.wan.missing_support()'s
reason otherwise). Timing assertions are lower bounds only: a tbf link caps the rate, so a sync
can take longer on a busy machine, never less than its bytes at the link's rate.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
from real.wan import wan

MISSING = wan.missing_support()

SCENARIO = """
name = "wan2"
[model]
preset = "tiny"
seq_len = 64
dtype = "fp32"
[training]
rounds = 1
local_steps = 2
batch_size = 2
[network]
bandwidth_gbps = 0.05
latency_ms = 0
[[nodes]]
name = "a"
gpus = { "cpu" = 1 }
step_time_s = 0.1
[[nodes]]
name = "b"
gpus = { "cpu" = 1 }
step_time_s = 0.1
"""


@pytest.mark.wan
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_shaped_calibration_measures_each_dtype_on_the_scenario_links(tmp_path, write_scenario, capsys):
    from formats.netprofile import NET_COLUMNS, OPTIONAL_COLUMNS, SHAPED_BACKEND
    from geodt.cli import main
    from simulator.models.netfit import read_network_profile

    out = tmp_path / "net.csv"
    assert main(["calibrate", "network", "--wan", "shaped", "--scenario", str(write_scenario(SCENARIO)),
                 "--payload-dtypes", "fp32,int8", "--collectives", "ring", "--max-mib", "1", "--repeats", "1",
                 "--threads", "1", "--out", str(out), "--profiles-out", str(tmp_path)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(NET_COLUMNS + OPTIONAL_COLUMNS)
    for node in ("a", "b"):  # its H = 2 inner steps after each dtype's one repeat of 1 MiB, at batch 2
        profile = pd.read_csv(tmp_path / f"{node}-0.csv")
        assert list(profile.batch_size) == [2] and list(profile.repeats) == [2 * 2] and profile.step_s_mean[0] > 0
    frame["node"] = frame["node"].fillna("")
    every = frame[frame.kind == "all_reduce"]
    assert set(every.backend) == {SHAPED_BACKEND} and set(every.processes) == {2}
    reduce = every[every.node == ""]  # each repeat's slowest process
    assert sorted(zip(reduce.payload_dtype, reduce["size"])) == sorted(
        (d, s) for d in ("fp32", "int8") for s in (64 << 10, 256 << 10, 1 << 20))
    # and each node's own time in the same repeats: never above the slowest (one repeat: the max)
    own = every[every.node != ""].pivot_table(index=["payload_dtype", "size"], columns="node",
                                             values="seconds_median")
    assert list(own.columns) == ["a", "b"] and len(own) == len(reduce)
    slowest = reduce.set_index(["payload_dtype", "size"]).seconds_median.loc[own.index]
    assert np.allclose(own.max(axis=1), slowest, rtol=1e-6)
    # 2 nodes: each sends half of the fp32 payload twice (reduce-scatter, all-gather) at 50 Mbit/s.
    one_mib = reduce.set_index(["payload_dtype", "size"]).seconds_median
    assert one_mib[("fp32", 1 << 20)] >= 0.95 * (1 << 20) * 8 / 50e6
    assert one_mib[("int8", 1 << 20)] >= 0.95 * (1 << 18) * 8 / 50e6
    model = read_network_profile(out)
    assert model.ring is None and model.codec_measured  # shaped rows are compared with, not fitted
    printed = capsys.readouterr()
    assert "measured_s" in printed.out and "predicted_s" in printed.out and "error_pct" in printed.out
    assert "shaped WAN (tbf each way)" in printed.err
    assert not wan.owned_namespaces(__import__("os").getpid())  # the WAN is gone


def test_without_root_or_support_it_is_one_line_and_exit_2(tmp_path, write_scenario, capsys, monkeypatch):
    """The build's error (here: not root) is one line, exit 2, and nothing is written."""
    from geodt.cli import main

    monkeypatch.setattr(wan.os, "geteuid", lambda: 1000)
    out = tmp_path / "net.csv"
    code = main(["calibrate", "network", "--wan", "shaped", "--scenario", str(write_scenario(SCENARIO)),
                 "--max-mib", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err[-1] == ("geodt calibrate network --wan shaped: --wan shaped: needs root (network namespaces, veth, "
                       "bridge and tc); run as root or use --wan loopback")


def test_each_node_leader_is_measured_under_its_cpu_limits(write_scenario):
    from geodt.calibration.wan_links import leader_limits
    from simulator.scenario import load_scenario

    text = SCENARIO.replace('name = "b"\ngpus = { "cpu" = 1 }', 'name = "b"\ngpus = { "cpu" = 2 }\ncpu_cores = [0, 1]\ncpu_quota = 0.5')
    assert leader_limits(load_scenario(str(write_scenario(text)))) == [(None, None), ([0], 0.5)]


@pytest.mark.wan
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_a_node_with_a_cpu_quota_syncs_at_that_quota(tmp_path, write_scenario):
    """In a run the leader of a node with cpu_quota does its share of the sync (copies, sums,
    int8 encoding) at that quota; the calibration measures it so. On a fast link (1 Gbit/s) the
    4 MiB int8 sync is CPU work: at a tenth of a core it took 10× as long as unlimited here
    (0.221 s against 0.022 s) on an idle machine, and 2.8× with the machine loaded (a 3× bound
    failed there). Load slows the unlimited sync by the load factor L (its share of a core),
    while the limited one runs at most 0.1 core whatever the load: the ratio is about 10 / L.
    Asserted: at least 1.5×, which holds while L < 6.7 (seven busy processes per core), so it
    tests that the quota binds without timing the machine's load."""
    from geodt.cli import main

    def sync_s(text: str, name: str) -> float:
        out = tmp_path / f"{name}.csv"
        assert main(["calibrate", "network", "--wan", "shaped", "--scenario", str(write_scenario(text, name=f"{name}.toml")),
                     "--payload-dtypes", "int8", "--collectives", "ring", "--max-mib", "4", "--repeats", "3",
                     "--threads", "1", "--out", str(out)]) == 0
        frame = pd.read_csv(out)
        reduce = frame[frame.kind == "all_reduce"]
        return float(reduce[reduce["size"] == 4 << 20].seconds_median.iloc[0])

    fast = SCENARIO.replace("bandwidth_gbps = 0.05", "bandwidth_gbps = 1.0")
    limited = fast.replace('name = "b"\ngpus = { "cpu" = 1 }', 'name = "b"\ngpus = { "cpu" = 1 }\ncpu_quota = 0.1')
    assert limited != fast
    assert sync_s(limited, "limited") >= 1.5 * sync_s(fast, "free")


def test_each_node_runs_its_round_between_averages(write_scenario):
    """As in a run, each node computes between two syncs: a CPU node its real inner steps (the
    scenario's model at its batch, H of them), a GPU node planned here a busy loop for H × its
    step time (2 × 0.1 s here), run untimed between timed averages."""
    from geodt.calibration.link_timing import _computing, _time_all
    from geodt.calibration.wan_links import between_averages
    from simulator.scenario import load_scenario

    gpu = SCENARIO.replace('name = "b"\ngpus = { "cpu" = 1 }', 'name = "b"\ngpus = { "a100-80gb" = 1 }')
    assert gpu != SCENARIO
    scenario = load_scenario(str(write_scenario(gpu)))
    assert between_averages(scenario) == [
        {"steps": {"preset": "tiny", "base_dir": str(scenario.base_dir), "seq_len": 64, "dtype": "fp32",
                   "batch": 2, "steps": 2}},
        {"busy_s": 2 * 0.1}]
    calls = []
    times = _time_all(3, lambda: calls.append("fn"), lambda: calls.append("sync"), lambda: calls.append("after"))
    assert len(times) == 3
    assert calls == ["fn"] + ["after", "sync", "fn"] * 3  # warm-up, then per repeat: compute, start together, time
    assert _computing(0.0) is None
    import time

    compute = _computing(0.05)
    start = time.perf_counter()
    compute()
    assert time.perf_counter() - start >= 0.05


def test_a_streaming_scenario_runs_its_fragment_schedule_between_and_beside_averages(write_scenario):
    """Streaming DiLoCo's averages are one fragment's, ⌊H/P⌋ steps apart, each begun τ steps
    before its merge: H = 8, P = 2, τ = 1 gives 3 steps before an average and 1 beside it; a GPU
    node planned here the same in busy seconds (0.1 s a step). Classic DiLoCo: H, then none."""
    from geodt.calibration.wan_links import between_averages, overlapped_steps
    from simulator.scenario import load_scenario

    assert overlapped_steps(8, 1, 0) == (8, 0)
    assert overlapped_steps(8, 2, 1) == (3, 1)
    assert overlapped_steps(8, 2, 0) == (4, 0)   # blocking fragments: no step beside
    assert overlapped_steps(9, 4, 1) == (1, 1)   # the first fragment's period, 9 // 4 = 2
    text = (SCENARIO.replace("local_steps = 2", "local_steps = 8")
            .replace('name = "b"\ngpus = { "cpu" = 1 }', 'name = "b"\ngpus = { "a100-80gb" = 1 }')
            + "[diloco]\nfragments = 2\nsync_delay_steps = 1\n")
    scenario = load_scenario(str(write_scenario(text)))
    a, b = between_averages(scenario)
    assert (a["steps"]["steps"], a["beside_steps"]) == (3, 1)
    assert b == {"busy_s": pytest.approx(0.3), "beside_s": pytest.approx(0.1)}


def test_an_overlapped_average_runs_on_its_own_thread_beside_the_steps():
    """Per repeat: the steps before, then the average begun on a communication thread (its start
    marked, as the run's leaders mark it) while the steps beside run; the average's own time is
    kept. The average here cannot end until the steps beside it have begun: run one after the
    other, it would time out."""
    import threading

    from geodt.calibration.link_timing import _time_overlapped

    calls, beside_started = [], threading.Event()

    def average():
        calls.append(("average", threading.current_thread().name.startswith("geodt-comm")))
        if "before" in calls:  # not the warm-up: it waits for the steps beside it
            assert beside_started.wait(5)

    def beside():
        calls.append("beside")
        beside_started.set()

    def before():
        beside_started.clear()
        calls.append("before")

    times = _time_overlapped(2, average, lambda: calls.append("start"), before, beside)
    assert len(times) == 2 and all(0 <= t < 5 for t in times)
    assert calls[:2] == ["start", ("average", True)]  # the warm-up, on the thread
    repeats = calls[2:]
    assert [c for c in repeats if c == "before"] == ["before"] * 2
    assert repeats.count("start") == 2 and repeats.count(("average", True)) == 2 and repeats.count("beside") == 2
    assert repeats[0] == "before" and repeats[4] == "before"  # the next repeat after both are done


def test_inner_steps_train_the_model_and_time_each_step():
    """Real training steps (the weights move), each timed; the construction's warm-up untimed."""
    import torch

    from geodt.calibration.link_timing import InnerSteps

    inner = InnerSteps("tiny", None, 16, "fp32", 1, 3)
    before = [p.detach().clone() for p in inner.cal.model.parameters()]
    assert inner.times == []
    inner()
    inner()
    assert len(inner.times) == 6 and all(t > 0 for t in inner.times)
    assert any(not torch.equal(a, b) for a, b in zip(before, inner.cal.model.parameters()))


def test_the_steps_kept_are_those_beside_the_run_payload_size():
    from geodt.calibration.wan_links import nearest_size

    sizes = [64 << 10, 256 << 10, 1 << 20]
    assert nearest_size(sizes, 1.0012 * (1 << 20)) == 1 << 20   # the tiny model's fp32 payload
    assert nearest_size(sizes, 100 << 10) == 64 << 10           # 1.56x above 64 KiB, 2.56x below 256
    assert nearest_size(sizes, 140 << 10) == 256 << 10
    assert nearest_size(sizes, 64 << 20) == 1 << 20


def test_profiles_out_writes_each_cpu_node_steps_as_a_profile_at_the_scenario_batch(tmp_path, write_scenario):
    """One row per node at the scenario's batch, from the steps beside the chosen size only, in a
    profile the simulator loads (the scenario pointed at it plans and simulates)."""
    from geodt.calibration.wan_links import write_profiles
    from simulator.scenario import load_scenario

    scenario = load_scenario(str(write_scenario(SCENARIO)))
    device = "AMD EPYC (1 thread"
    cpu = f"{device})"  # describe_device("cpu")'s name in the node's process
    inner = {"a": (cpu, {64 << 10: [9.0], 1 << 20: [0.1, 0.2, 0.3, 0.4]}),
             "b": (cpu, {64 << 10: [9.0], 1 << 20: [0.5, 0.5, 0.5, 0.5]})}
    lines = write_profiles(tmp_path, scenario, inner, 1 << 20, [2, 2])
    assert lines == [f"{tmp_path}/a-0.csv: a: b2 250.0 ms mean over 4 steps between averages of 1024 KiB",
                     f"{tmp_path}/b-0.csv: b: b2 500.0 ms mean over 4 steps between averages of 1024 KiB"]
    frame = pd.read_csv(tmp_path / "a-0.csv")
    assert len(frame) == 1 and frame.batch_size[0] == 2 and frame.repeats[0] == 4
    assert frame.step_s_mean[0] == pytest.approx(0.25) and frame.step_s_median[0] == pytest.approx(0.25)
    assert frame.device_name[0] == f"{device}; wan2 a 1/1, between shaped-WAN averages)"
    pointed = SCENARIO.replace("step_time_s = 0.1", "", 1).replace('name = "a"\n', f'name = "a"\nprofile = "{tmp_path}/a-0.csv"\n')
    from simulator.models.timing import node_timings

    timing = node_timings(load_scenario(str(write_scenario(pointed, name="pointed.toml"))))[0]
    assert timing.step_s(2) == pytest.approx(0.25)
    assert write_profiles(tmp_path, scenario, {"a": ("", {})}, 1 << 20, [2, 2]) == []  # no steps, no profile


def test_a_streaming_scenario_also_measures_one_fragment_payload(write_scenario):
    """Streaming DiLoCo averages one fragment at a time: that size (here the tiny model's
    262,464 parameters / 2, 4 bytes each) is measured beside the ×4 ladder, not interpolated."""
    from geodt.calibration.wan_links import measured_sizes
    from simulator.scenario import load_scenario

    classic = load_scenario(str(write_scenario(SCENARIO)))
    assert measured_sizes(classic, 1) == [64 << 10, 256 << 10, 1 << 20]
    streaming = load_scenario(str(write_scenario(SCENARIO + "[diloco]\nfragments = 2\n", name="streaming.toml")))
    assert measured_sizes(streaming, 1) == [64 << 10, 256 << 10, 4 * 131_232, 1 << 20]


def test_with_a_plan_each_node_runs_its_plan_round_between_averages(tmp_path, write_scenario, capsys):
    """--plan: each node's b_i and H_i (a measured-steps plan runs every node for the same time,
    a neighbourhood unlike the scenario's equal H); a plan of other nodes is one line, exit 2."""
    from dataclasses import replace

    from formats.plan import load_plan
    from geodt.calibration.wan_links import between_averages
    from geodt.cli import main
    from simulator.scenario import load_scenario

    scenario_path = write_scenario(SCENARIO)
    assert main(["plan", str(scenario_path), "--strategy", "baseline", "--out", str(tmp_path)]) == 0
    plan = load_plan(tmp_path / "plan.csv")
    plan = replace(plan, nodes=(replace(plan.nodes[0], batch_size=3, local_steps=5), plan.nodes[1]))
    specs = between_averages(load_scenario(str(scenario_path)), plan)
    assert [(s["steps"]["batch"], s["steps"]["steps"]) for s in specs] == [(3, 5), (2, 2)]
    other = (tmp_path / "plan.csv").read_text().replace("\nbaseline,b,", "\nbaseline,z,")
    (tmp_path / "other.csv").write_text(other)
    capsys.readouterr()
    code = main(["calibrate", "network", "--wan", "shaped", "--scenario", str(scenario_path), "--plan",
                 str(tmp_path / "other.csv"), "--out", str(tmp_path / "net.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not (tmp_path / "net.csv").exists()
    assert err == [(f"geodt calibrate network --wan shaped: {tmp_path}/other.csv: node: expected the scenario's "
                   "nodes ['a', 'b'], got ['a', 'z']")]
