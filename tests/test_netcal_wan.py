"""`geodt calibrate --network --wan shaped --scenario S`: the sync timed on the scenario's own
shaped links (real/wan.py), written as network-profile rows the simulator loads.

Needs root and the kernel's netns, veth, bridge and tbf (skips with real.wan.missing_support()'s
reason otherwise). Timing assertions are lower bounds only: a tbf link caps the rate, so a sync
can take longer on a busy machine, never less than its bytes at the link's rate.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")
from real import wan  # noqa: E402

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
    from calibrate.netprofile import read_network_profile
    from formats.netprofile import NET_COLUMNS, OPTIONAL_COLUMNS, SHAPED_BACKEND
    from geodt.cli import main

    out = tmp_path / "net.csv"
    assert main(["calibrate", "--network", "--wan", "shaped", "--scenario", str(write_scenario(SCENARIO)),
                 "--payload-dtypes", "fp32,int8", "--collectives", "ring", "--max-mib", "1", "--repeats", "1",
                 "--threads", "1", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(NET_COLUMNS + OPTIONAL_COLUMNS)
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
    code = main(["calibrate", "--network", "--wan", "shaped", "--scenario", str(write_scenario(SCENARIO)),
                 "--max-mib", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err[-1] == ("geodt calibrate --network --wan shaped: --wan shaped: needs root (network namespaces, veth, "
                       "bridge and tc); run as root or use --wan loopback")


def test_each_node_leader_is_measured_under_its_cpu_limits(write_scenario):
    from geodt.netcal_wan import leader_limits
    from simulator.scenario import load_scenario

    text = SCENARIO.replace('name = "b"\ngpus = { "cpu" = 1 }', 'name = "b"\ngpus = { "cpu" = 2 }\ncpu_cores = [0, 1]\ncpu_quota = 0.5')
    assert leader_limits(load_scenario(str(write_scenario(text)))) == [(None, None), ([0], 0.5)]


@pytest.mark.wan
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_a_node_with_a_cpu_quota_syncs_at_that_quota(tmp_path, write_scenario):
    """In a run the leader of a node with cpu_quota does its share of the sync (copies, sums,
    int8 encoding) at that quota; the calibration measures it so. On a fast link (1 Gbit/s) the
    4 MiB int8 sync is CPU work: at a tenth of a core it took 10× as long as unlimited here
    (0.221 s against 0.022 s); asserted: at least 3× (a busy machine narrows the ratio)."""
    from geodt.cli import main

    def sync_s(text: str, name: str) -> float:
        out = tmp_path / f"{name}.csv"
        assert main(["calibrate", "--network", "--wan", "shaped", "--scenario", str(write_scenario(text, name=f"{name}.toml")),
                     "--payload-dtypes", "int8", "--collectives", "ring", "--max-mib", "4", "--repeats", "3",
                     "--threads", "1", "--out", str(out)]) == 0
        frame = pd.read_csv(out)
        reduce = frame[frame.kind == "all_reduce"]
        return float(reduce[reduce["size"] == 4 << 20].seconds_median.iloc[0])

    fast = SCENARIO.replace("bandwidth_gbps = 0.05", "bandwidth_gbps = 1.0")
    limited = fast.replace('name = "b"\ngpus = { "cpu" = 1 }', 'name = "b"\ngpus = { "cpu" = 1 }\ncpu_quota = 0.1')
    assert limited != fast
    assert sync_s(limited, "limited") >= 3 * sync_s(fast, "free")


def test_each_node_computes_its_round_between_averages(write_scenario):
    """As in a run, each node computes between two syncs: its round of the scenario's batch and
    local steps (H × its step time: 2 × 0.1 s here), run untimed between timed averages."""
    from geodt.netcal_wan import round_compute_s
    from real.netcal import _computing, _time_all
    from simulator.scenario import load_scenario

    scenario = load_scenario(str(write_scenario(SCENARIO)))
    assert round_compute_s(scenario) == [2 * 0.1, 2 * 0.1]
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
