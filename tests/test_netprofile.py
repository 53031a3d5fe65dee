"""Network profiles: the fits recover the model they assume; bad files are one-line errors;
`geodt calibrate network` measures real gloo processes into a profile that loads."""
from __future__ import annotations

import pandas as pd
import pytest

from formats.netprofile import NET_COLUMNS, OPTIONAL_COLUMNS, NetProfileError
from simulator.models.netfit import fit_affine, fit_ring, read_network_profile

# Encode / decode cost per fp32 byte (fixed, per byte) by payload dtype: about what
# `geodt calibrate network` measured on the 2-core VM (int8 quantisation costs the most).
CODEC = {("encode", "fp32"): (1e-5, 0.0), ("decode", "fp32"): (1e-5, 0.1e-9),
         ("encode", "fp16"): (1e-5, 0.15e-9), ("decode", "fp16"): (1e-5, 0.7e-9),
         ("encode", "int8"): (2e-5, 1.3e-9), ("decode", "int8"): (2e-5, 1.4e-9)}


def _codec_rows(codec=CODEC) -> pd.DataFrame:
    rows = [{"kind": kind, "processes": 2, "backend": "gloo", "size": elements,
             "seconds_median": fixed + per_byte * 4 * elements, "seconds_p10": 0, "seconds_p90": 0, "repeats": 3,
             "host": "h", "torch_version": "x", "measured_at": "now", "payload_dtype": dtype, "collective": ""}
            for (kind, dtype), (fixed, per_byte) in codec.items() for elements in (1 << 14, 1 << 18, 1 << 22)]
    return pd.DataFrame(rows, columns=list(NET_COLUMNS + OPTIONAL_COLUMNS))


def _rows(latency_s=2e-4, bandwidth_bps=8e9, per_param_s=3e-9, ckpt_fixed_s=1e-3, write_bps=4e9):
    rows = []
    for n in (2, 3, 4):
        for size in (1 << 16, 1 << 20, 1 << 24):
            t = 2 * (n - 1) * latency_s + 2 * (n - 1) / n * 8 * size / bandwidth_bps
            rows.append(("all_reduce", n, size, t))
    for size in (1 << 14, 1 << 18, 1 << 22):
        rows.append(("outer_step", 2, size, 5e-5 + per_param_s * size))
        rows.append(("checkpoint", 2, size * 4, ckpt_fixed_s + 8 * size * 4 / write_bps))
    return pd.DataFrame([{"kind": k, "processes": n, "backend": "gloo", "size": s, "seconds_median": t,
                          "seconds_p10": t, "seconds_p90": t, "repeats": 3, "host": "h", "torch_version": "x",
                          "measured_at": "now"} for k, n, s, t in rows], columns=list(NET_COLUMNS))


def test_fits_recover_the_generating_model(tmp_path):
    path = tmp_path / "net.csv"
    _rows().to_csv(path, index=False)
    model = read_network_profile(path)
    assert model.ring.latency_s == pytest.approx(2e-4, rel=1e-9)
    assert model.ring.bandwidth_gbps == pytest.approx(8.0, rel=1e-9)
    assert model.ring.all_reduce_s(3, 1e6) == pytest.approx(4 * 2e-4 + 4 / 3 * 8e6 / 8e9, rel=1e-9)
    assert model.outer_step.per_unit_s == pytest.approx(3e-9, rel=1e-9)
    assert model.outer_step.fixed_s == pytest.approx(5e-5, rel=1e-9)
    assert model.checkpoint(4e6) == pytest.approx(1e-3 + 8 * 4e6 / 4e9, rel=1e-9)


def test_a_rows_time_is_its_mean_where_the_profile_has_one(tmp_path):
    """A run sums its syncs, so the profile's mean prices them; older profiles (median only)
    still load at their median, and an empty mean cell falls back to the row's median."""
    rows = _rows()
    path = tmp_path / "net.csv"
    rows.to_csv(path, index=False)
    by_median = read_network_profile(path)
    rows.assign(seconds_mean=rows.seconds_median * 1.25).to_csv(path, index=False)
    by_mean = read_network_profile(path)
    assert by_mean.ring.all_reduce_s(3, 1e6) == pytest.approx(1.25 * by_median.ring.all_reduce_s(3, 1e6), rel=1e-9)
    assert by_mean.checkpoint(4e6) == pytest.approx(1.25 * by_median.checkpoint(4e6), rel=1e-9)
    rows.assign(seconds_mean="").to_csv(path, index=False)
    assert read_network_profile(path).ring.all_reduce_s(3, 1e6) == by_median.ring.all_reduce_s(3, 1e6)


def test_negative_intercepts_refit_through_zero():
    fit = fit_affine([1, 2, 3], [0.9, 2.0, 3.1])  # the free line would cross below 0
    assert fit.fixed_s == 0.0 and fit.per_unit_s > 0
    ring = fit_ring([2, 2], [1e6, 2e6], [0.9e-3, 2.1e-3])
    assert ring.latency_s == 0.0 and ring.bandwidth_bps > 0


@pytest.mark.parametrize("edit, expected", [
    (lambda f: f.drop(columns="size"), "column 'size' missing"),
    (lambda f: f.assign(kind="teleport"), "line 2: kind: expected one of"),
    (lambda f: f.assign(seconds_median="fast"), "line 2: processes/size/seconds_median: expected numbers"),
    (lambda f: f.assign(seconds_median=-1.0), "line 2: expected processes >= 1 and positive"),
    (lambda f: f.assign(seconds_mean="slow"), "line 2: processes/size/seconds_mean: expected numbers"),
    (lambda f: f.iloc[:0], "no rows"),
])
def test_bad_profiles_are_one_line_errors(tmp_path, edit, expected):
    path = tmp_path / "net.csv"
    edit(_rows()).to_csv(path, index=False)
    with pytest.raises(NetProfileError, match=expected) as info:
        read_network_profile(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_missing_or_special_file(tmp_path):
    with pytest.raises(NetProfileError, match="not a regular file"):
        read_network_profile(tmp_path)


@pytest.mark.slow
def test_calibrate_network_measures_real_processes(tmp_path):
    pytest.importorskip("torch")
    from geodt.calibration.links import main

    out = tmp_path / "net.csv"
    assert main(["--network", "--processes", "2", "--max-mib", "16", "--repeats", "2", "--threads", "1",
                 "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(NET_COLUMNS + OPTIONAL_COLUMNS)
    assert sorted(frame.kind.unique()) == ["all_reduce", "checkpoint", "decode", "encode", "outer_step", "snapshot"]
    # 64 KiB ... 16 MiB (x4 per size): all-reduce, outer step, checkpoint, snapshot, and encode + decode per dtype.
    assert len(frame) == (4 + 2 * 3) * 5
    codec = frame[frame.kind.isin(["encode", "decode"])]
    assert sorted(codec.payload_dtype.unique()) == ["fp16", "fp32", "int8"]
    assert sorted(codec["size"].unique()) == [(64 << 10) // 4 * 4 ** k for k in range(5)]  # elements
    model = read_network_profile(out)
    assert model.ring.bandwidth_bps > 0 and model.outer_step.per_unit_s > 0
    assert model.snapshot.per_unit_s > 0  # copying 16 MiB costs more than copying 64 KiB
    assert model.codec_measured and model.codec_fit("encode", "int8").per_unit_s > 0
    assert not list(tmp_path.glob(".*"))  # no temp files or checkpoint directory left behind


SCENARIO = """
name = "netprof"
[model]
preset = "tiny"
seq_len = 64
dtype = "fp32"
[training]
rounds = 2
local_steps = 10
batch_size = 4
[network]
profile = "net.csv"
[[nodes]]
name = "one"
gpus = { "cpu" = 1 }
step_time_s = 0.1
[[nodes]]
name = "two"
gpus = { "cpu" = 2 }
step_time_s = 0.1
cpu_quota = 0.5
cpu_cores = [1]
"""

THIRD_NODE = """
[[nodes]]
name = "three"
gpus = { "cpu" = 1 }
step_time_s = 0.1
uplink_gbps = 2.0
"""


def test_simulator_uses_the_measured_network(tmp_path, write_scenario):
    from simulator.models.network import outer_step_s, sync_s
    from simulator.models.timing import intra_node_allreduce_s
    from simulator.scenario import load_scenario

    _rows().to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(write_scenario(SCENARIO)))
    assert scenario.network.bandwidth_gbps == pytest.approx(8.0, rel=1e-9)
    assert scenario.network.latency_ms == pytest.approx(0.2, rel=1e-9)
    n = scenario.model.param_count
    assert outer_step_s(scenario) == pytest.approx(5e-5 + 3e-9 * n, rel=1e-9)
    ring = 2 * 2e-4 + 8 * 4 * n / 8e9  # 2 nodes, fp32 payload
    assert sync_s(scenario) == pytest.approx(ring + 5e-5 + 3e-9 * n, rel=1e-9)
    one, two = scenario.nodes
    assert intra_node_allreduce_s(scenario, one) == 0.0
    assert intra_node_allreduce_s(scenario, two) == pytest.approx(2 * 2e-4 + 8 * 4 * n / 8e9, rel=1e-9)
    assert two.cpu_quota == 0.5 and two.cpu_cores == (1,)
    # The resolved scenario points at the profile absolutely and reloads to the same numbers.
    again = write_scenario(scenario.to_toml(), name="resolved.toml")
    reloaded = load_scenario(str(again)).network
    assert reloaded.profile == str(tmp_path / "net.csv")
    assert (reloaded.bandwidth_gbps, reloaded.latency_ms) == (scenario.network.bandwidth_gbps,
                                                              scenario.network.latency_ms)


@pytest.mark.parametrize("edit, expected", [
    ('profile = "missing.csv"', "network.profile: .*missing.csv: file not found"),
    ("cpu_quota = 0.0", r"nodes\[1\]\.cpu_quota: expected a share of a core"),
    ("cpu_cores = []", r"nodes\[1\]\.cpu_cores: expected a non-empty list"),
])
def test_bad_network_and_cpu_keys(tmp_path, write_scenario, edit, expected):
    from formats.errors import InputError
    from simulator.scenario import load_scenario

    _rows().to_csv(tmp_path / "net.csv", index=False)
    key = edit.split(" = ")[0]
    text = "\n".join(edit if line.startswith(key + " =") else line for line in SCENARIO.splitlines())
    with pytest.raises(InputError, match=expected):
        load_scenario(str(write_scenario(text)))


def test_measured_checkpoint_delays_every_round_in_both_engines(tmp_path, write_scenario):
    from simulator.engines.engine import simulate
    from simulator.models.network import CHECKPOINT_BYTES_PER_PARAM, checkpoint_s
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    _rows().to_csv(tmp_path / "net.csv", index=False)
    # a set every round (the default cadence is Young/Daly's, which here is far fewer)
    scenario = load_scenario(str(write_scenario(SCENARIO.replace("rounds = 2", "rounds = 2\ncheckpoint_every = 1"))))
    ckpt = checkpoint_s(scenario)
    assert ckpt == pytest.approx(1e-3 + 8 * CHECKPOINT_BYTES_PER_PARAM * scenario.model.param_count / 4e9, rel=1e-9)
    plan = make_plan(scenario, "baseline")
    for engine in ("simpy", "analytic"):
        t = simulate(scenario, plan, engine=engine)
        ends = t.groupby("round").round_end_s.max()
        starts = t.groupby("round").round_start_s.min()
        assert starts.iloc[1] - ends.iloc[0] == pytest.approx(ckpt, rel=1e-9)


def test_profile_variability_drives_per_node_jitter(write_scenario):
    from pathlib import Path

    from simulator.models.profile_fit import ProfileModel
    from simulator.models.workload import compute_matrix, node_cvs
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    root = Path(__file__).resolve().parents[1]
    profile = ProfileModel.from_csv(root / "profiles" / "cpu-1thread.csv")
    # batch 4 of that profile: p10 0.03933455310011595, p90 0.04681023799996638, median 0.04222288450000633
    expected = (0.04681023799996638 - 0.03933455310011595) / (2 * 1.2816 * 0.04222288450000633)
    assert profile.step_cv(4) == pytest.approx(expected, rel=1e-12)
    text = SCENARIO.replace('profile = "net.csv"\n', "").replace(
        "step_time_s = 0.1\ncpu_quota", f'profile = "{root}/profiles/cpu-1thread.csv"\ncpu_quota').replace(
        "seq_len = 64", "seq_len = 256") + '[simulation]\nvariability = "profile"\njitter_cv = 0.02\n'
    scenario = load_scenario(str(write_scenario(text)))
    plan = make_plan(scenario, "baseline")
    assert node_cvs(scenario, plan) == [0.02, pytest.approx(expected, rel=1e-12)]
    a, b = compute_matrix(scenario, plan), compute_matrix(scenario, plan)
    assert (a == b).all() and a[:, 0].std() > 0  # seeded: the same draw every time, and not constant


def test_a_node_of_several_devices_waits_for_the_slowest_draw(write_scenario):
    """G devices per node: each step lasts the slowest device's draw, so the mean rises with G
    (for a lognormal of cv 0.2, E[max of 2] is about 1.11× the mean), the all-reduce unchanged."""
    import numpy as np

    from simulator.models.workload import compute_matrix
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    text = SCENARIO.replace('profile = "net.csv"\n', "").replace("rounds = 2", "rounds = 400") + \
        "[simulation]\njitter_cv = 0.2\n"
    scenario = load_scenario(str(write_scenario(text)))
    plan = make_plan(scenario, "baseline")
    one, two = compute_matrix(scenario, plan).mean(axis=0) / (10 * 0.1)
    assert one == pytest.approx(1.0, abs=0.01)  # one device: the mean of the draws
    assert two == pytest.approx(1.11, abs=0.015)
    assert np.isclose(plan.nodes[1].step_s, 0.1)  # the given step time includes no extra all-reduce here


def test_codec_fits_per_byte_and_old_profiles_still_load(tmp_path):
    """encode/decode rows fit per fp32 byte, per dtype; a profile without them (written before
    they existed: no payload_dtype / collective columns) loads, and prices encoding at 0."""
    path = tmp_path / "net.csv"
    pd.concat([_rows().assign(payload_dtype="", collective=""), _codec_rows()]).to_csv(path, index=False)
    model = read_network_profile(path)
    for (kind, dtype), (fixed, per_byte) in CODEC.items():
        fit = model.codec_fit(kind, dtype)
        assert fit.fixed_s == pytest.approx(fixed, rel=1e-6) and fit.per_unit_s == pytest.approx(per_byte, abs=1e-15)
    assert model.ring.bandwidth_gbps == pytest.approx(8.0, rel=1e-9)  # codec rows leave the ring fit alone
    old = tmp_path / "old.csv"
    _rows().to_csv(old, index=False)
    assert list(pd.read_csv(old).columns) == list(NET_COLUMNS)
    legacy = read_network_profile(old)
    assert not legacy.codec_measured and legacy.codec_fit("encode", "int8") is None


def test_a_time_that_does_not_grow_is_a_fixed_cost():
    fit = fit_affine([1, 2, 3], [3.0, 2.0, 2.5])  # the free line would fall
    assert (fit.fixed_s, fit.per_unit_s) == (2.5, 0.0)


def test_sync_prices_encode_and_decode(tmp_path, write_scenario):
    """t_codec of simulator/models/network.py, exactly, for a 2-node ring of int8 and a 3-node
    partitioned fp16 sync with unequal links; the fused ring + fp32 encodes nothing."""
    from simulator.models.network import codec_note, codec_s, outer_step_s, ring_allreduce_s, sync_s
    from simulator.scenario import load_scenario

    pd.concat([_rows().assign(payload_dtype="", collective=""), _codec_rows()]).to_csv(tmp_path / "net.csv",
                                                                                     index=False)
    scenario = load_scenario(str(write_scenario(SCENARIO)))
    p = scenario.model.param_count
    (ea, ec), (da, dc) = CODEC[("encode", "int8")], CODEC[("decode", "int8")]
    expected = 3 * ea + 4 * da + 4 * p * (ec + dc) + 4 * (p / 2) * (ec + 2 * dc)
    assert codec_s(scenario, "int8", "ring") == pytest.approx(expected, rel=1e-6)
    assert sync_s(scenario, "int8", "ring") == pytest.approx(
        ring_allreduce_s(scenario, "int8") + expected + outer_step_s(scenario), rel=1e-9)
    assert codec_s(scenario, "fp32", "ring") == 0.0
    assert codec_s(scenario, "fp32", "partitioned") > 0  # encoded all-to-alls, even of fp32
    assert codec_note(scenario).startswith("encode/decode priced from")
    three = load_scenario(str(write_scenario(SCENARIO + THIRD_NODE, name="three.toml")))
    (ea, ec), (da, dc) = CODEC[("encode", "fp16")], CODEC[("decode", "fp16")]
    # links 8, 8 (the fit's bandwidth) and 2 Gbit/s: shares by water-filling, the largest 1/2.
    expected = 4 * ea + 6 * da + 4 * p * (ec + dc) + 4 * (p / 2) * (ec + 3 * dc)
    assert codec_s(three, "fp16", "partitioned") == pytest.approx(expected, rel=1e-6)


def test_old_profile_prices_encoding_at_zero_and_says_so(tmp_path, write_scenario):
    from simulator.models.network import codec_note, codec_s
    from simulator.scenario import load_scenario

    _rows().to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(write_scenario(SCENARIO)))
    assert codec_s(scenario, "int8", "ring") == 0.0
    assert codec_note(scenario) == (f"encode/decode of the payload priced at 0 (no encode/decode rows: "
                                    f"{tmp_path / 'net.csv'} predates them)")


def test_network_aware_keeps_fp32_where_int8_encoding_costs_more_than_it_saves(tmp_path, write_scenario):
    """On a fast link (8 Gbit/s) int8's quantisation (2.7 ns per fp32 byte, encode + decode)
    costs more than the 3 bytes in 4 it saves on the wire (about 1 ns per byte): priced, the
    planner sends fp32; unpriced (an old profile) it sends int8, as before."""
    from formats.wire import PAYLOAD_BYTES
    from simulator.models.network import sync_s
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    fast = SCENARIO.replace("step_time_s = 0.1", "step_time_s = 0.001")  # the sync dominates the round
    _rows().to_csv(tmp_path / "old.csv", index=False)
    pd.concat([_rows().assign(payload_dtype="", collective=""), _codec_rows()]).to_csv(tmp_path / "net.csv",
                                                                                     index=False)
    priced = load_scenario(str(write_scenario(fast)))
    unpriced = load_scenario(str(write_scenario(fast.replace("net.csv", "old.csv"), name="old.toml")))
    assert sync_s(priced, "int8", "ring") > sync_s(priced, "fp32", "ring")  # the premise
    assert sync_s(unpriced, "int8", "ring") < sync_s(unpriced, "fp32", "ring")
    before, after = make_plan(unpriced, "network-aware"), make_plan(priced, "network-aware")
    assert before.payload_dtype == "int8"
    assert after.payload_dtype != "int8"
    dtypes = list(PAYLOAD_BYTES)
    fastest = min(dtypes, key=lambda d: min(sync_s(priced, d, c) for c in ("ring", "partitioned")))
    assert after.payload_dtype == fastest
    assert after.comm_s == pytest.approx(min(sync_s(priced, fastest, c) for c in ("ring", "partitioned")), rel=1e-9)


def _shaped_rows(scenario, dtype: str, collective: str, factors) -> pd.DataFrame:
    """Shaped-WAN all-reduce rows made exactly: codec + f · byte-count time, f = factors[k] at the
    k-th size (64 KiB, 256 KiB, 1 MiB, 4 MiB of fp32)."""
    from formats.wire import PAYLOAD_BYTES
    from simulator.models.network import codec_cost, link_gbps, wire_bytes_s_raw

    links, rows = link_gbps(scenario), []
    for fp32_bytes, factor in zip((1 << 16, 1 << 18, 1 << 20, 1 << 22), factors):
        params = fp32_bytes / 4
        bytes_s = float(wire_bytes_s_raw(collective, scenario.network.latency_ms, params * PAYLOAD_BYTES[dtype], links))
        t = float(codec_cost(scenario).seconds_raw(dtype, collective, params, links)) + factor * bytes_s
        rows.append({"kind": "all_reduce", "processes": len(links), "backend": "gloo+shaped", "size": fp32_bytes,
                     "seconds_median": t, "seconds_p10": t, "seconds_p90": t, "repeats": 3, "host": "h",
                     "torch_version": "x", "measured_at": "now", "payload_dtype": dtype, "collective": collective})
    return pd.DataFrame(rows, columns=list(NET_COLUMNS + OPTIONAL_COLUMNS))


def test_shaped_wan_rows_price_the_links_as_measured(tmp_path, write_scenario):
    """A profile with shaped-WAN all-reduces: the simulator prices that dtype and collective at the
    measured ratio f = (measured − codec) / byte count, exactly at a measured size, interpolated
    in log size between sizes and held beyond them, in the scalar path and the strategies' vector
    path alike; other pairs keep the byte count. The ratios grow with the size as measured on
    tbf links (1.09 at 64 KiB to 1.61 at 4 MiB): the old line a + f·t through the points priced
    the 1 MiB point 16% short."""
    import numpy as np

    from simulator.models.network import WireCost, allreduce_s, bytes_s, codec_s, wire_cost, wire_note
    from simulator.models.timing import node_timings
    from simulator.scenario import load_scenario
    from simulator.strategies.tables import from_scenario

    host = pd.concat([_rows().assign(payload_dtype="", collective=""), _codec_rows()])
    host.to_csv(tmp_path / "net.csv", index=False)
    path = write_scenario(SCENARIO + THIRD_NODE, name="three.toml")
    before = load_scenario(str(path))
    factors = (1.10, 1.23, 1.55, 1.61)
    pd.concat([host, _shaped_rows(before, "int8", "partitioned", factors)]).to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(path))
    wire = wire_cost(scenario)
    sizes = (1 << 16, 1 << 18, 1 << 20, 1 << 22)
    at = [bytes_s(scenario, "partitioned", "int8", size / 4) for size in sizes]
    assert np.allclose(wire.seconds_raw("int8", "partitioned", np.array(at)), np.multiply(factors, at), rtol=1e-12)
    middle = np.sqrt(at[2] * at[3])  # halfway in log size: halfway in f
    assert wire.factor_raw("int8", "partitioned", middle) == pytest.approx((1.55 + 1.61) / 2, rel=1e-12)
    assert wire.factor_raw("int8", "partitioned", at[0] / 10) == pytest.approx(1.10, rel=1e-12)  # held beyond
    assert wire.factor_raw("int8", "partitioned", at[3] * 10) == pytest.approx(1.61, rel=1e-12)
    assert wire.factor_raw("fp32", "ring", 1.0) is None and WireCost().seconds_raw("fp32", "ring", 2.5) == 2.5
    payload_s = bytes_s(scenario, "partitioned", "int8")
    expected = float(wire.factor_raw("int8", "partitioned", payload_s)) * payload_s + codec_s(scenario, "int8",
                                                                                               "partitioned")
    assert allreduce_s(scenario, "int8", "partitioned") == pytest.approx(expected, rel=1e-12)
    assert allreduce_s(scenario, "fp32", "ring") == allreduce_s(before, "fp32", "ring")  # not measured: bytes
    _, net = from_scenario(scenario, node_timings(scenario))
    assert np.allclose(net.allreduce_s("int8", "partitioned"), expected, rtol=1e-12)
    f = float(wire.factor_raw("int8", "partitioned", payload_s))
    assert wire_note(scenario) == ("links priced as measured on the shaped WAN "
                                   f"(int8 partitioned ×{f:.2f} the byte count)")
    assert wire_note(before) == "links priced by their byte count"


def test_each_nodes_own_sync_end_moves_its_idle(tmp_path, write_scenario):
    """Rows naming a node (that node's own times in the shaped calibration) give each node its own
    end of the all-reduce: offset (f_i − f)·t_bytes from the collective's, f the slowest-process
    rows' ratio. Nodes "one" and "two" measured at 70% and 85% of the slowest (fp32 ring: no
    encoding) end that much earlier, start the next round early and wait that much longer at its
    barrier. For a dtype not measured per node all nodes keep the one sync time."""
    import numpy as np

    from simulator.engines.engine import node_comm_s, simulate
    from simulator.models.network import allreduce_s, node_sync_offsets_s
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    host = pd.concat([_rows().assign(payload_dtype="", collective=""), _codec_rows()])
    host.to_csv(tmp_path / "net.csv", index=False)
    path = write_scenario(SCENARIO + THIRD_NODE, name="three.toml")
    before = load_scenario(str(path))
    whole = _shaped_rows(before, "fp32", "ring", (1.10, 1.23, 1.55, 1.61))
    per_node = [whole.assign(node=name, seconds_median=whole.seconds_median * share)
                for name, share in (("one", 0.7), ("two", 0.85), ("three", 1.0))]
    pd.concat([host, whole, *per_node]).to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(path))
    assert len(scenario.network_model.shaped) == 4 and len(scenario.network_model.shaped_by_node) == 12
    offsets = node_sync_offsets_s(scenario, "fp32", "ring")
    wire_s = allreduce_s(scenario, "fp32", "ring")
    assert np.allclose(offsets, [-0.3 * wire_s, -0.15 * wire_s, 0.0], rtol=1e-12, atol=1e-15)
    assert node_sync_offsets_s(scenario, "int8", "ring") is None  # not measured per node
    plan = make_plan(scenario, "baseline")
    comm = node_comm_s(scenario, plan)
    assert np.array_equal(comm, plan.comm_s + offsets)
    for engine in ("simpy", "analytic"):
        timeline = simulate(scenario, plan, engine)
        assert np.allclose(timeline.comm_s.to_numpy().reshape(2, 3), comm, rtol=0, atol=1e-12)
        # round 1: each early node waits its early end longer than in round 0 (equal compute)
        idle = timeline.pivot(index="round", columns="node", values="idle_s")[["one", "two", "three"]]
        assert np.allclose(idle.loc[1] - idle.loc[0], -offsets, rtol=0, atol=1e-9)


def test_validate_prediction_keeps_the_network_profile_in_every_draw(tmp_path, write_scenario):
    """With per-step jitter `geodt validate` predicts the mean of VARIABILITY_SAMPLES draws, each a
    copy of the scenario with another seed. The copies lost the network profile (an init=False
    field that dataclasses.replace resets), so 31 of 32 draws had no checkpoint time and no
    per-node sync ends: the mean gap between a round's end and the next round's start was
    ckpt/32, now the measured checkpoint time."""
    from dataclasses import replace

    import numpy as np

    from geodt.run_cmd import predicted_timeline
    from simulator.models.network import checkpoint_s
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    _rows().to_csv(tmp_path / "net.csv", index=False)
    every_round = SCENARIO.replace("rounds = 2", "rounds = 2\ncheckpoint_every = 1")  # not Young/Daly's cadence
    scenario = load_scenario(str(write_scenario(every_round + "[simulation]\njitter_cv = 0.1\n")))
    assert replace(scenario, seed=1).network_model is scenario.network_model
    ckpt = checkpoint_s(scenario)
    assert ckpt > 0
    plan = make_plan(scenario, "baseline")
    timeline = predicted_timeline(scenario, plan, "analytic")
    by_round = timeline.pivot(index="round", columns="node", values=["round_start_s", "round_end_s"])
    gap = by_round["round_start_s"].loc[1] - by_round["round_end_s"].loc[0]
    assert np.allclose(gap, ckpt, rtol=1e-9)


def test_streaming_fragments_end_apart_per_node_too(tmp_path, write_scenario):
    """A Streaming DiLoCo plan (P = 2) on a profile with each node's own times: each fragment's
    all-reduce (half the payload) ends at the node's own offset at that size, in both engines."""
    import numpy as np

    from simulator.engines.engine import simulate_syncs
    from simulator.models.network import node_sync_offsets_s
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    host = pd.concat([_rows().assign(payload_dtype="", collective=""), _codec_rows()])
    host.to_csv(tmp_path / "net.csv", index=False)
    path = write_scenario(SCENARIO + THIRD_NODE, name="three.toml")
    whole = _shaped_rows(load_scenario(str(path)), "fp32", "ring", (1.10, 1.23, 1.55, 1.61))
    per_node = [whole.assign(node=name, seconds_median=whole.seconds_median * share)
                for name, share in (("one", 0.7), ("two", 0.85), ("three", 1.0))]
    pd.concat([host, whole, *per_node]).to_csv(tmp_path / "net.csv", index=False)
    scenario = load_scenario(str(path), ["diloco.fragments=2"])
    offsets = node_sync_offsets_s(scenario, "fp32", "ring", fragments=2)
    assert offsets[0] < offsets[1] < offsets[2] == 0.0
    assert not np.allclose(offsets, node_sync_offsets_s(scenario, "fp32", "ring"))  # the fragment's size
    plan = make_plan(scenario, "baseline")
    assert plan.fragments == 2
    for engine in ("simpy", "analytic"):
        _, syncs = simulate_syncs(scenario, plan, engine)
        own = (syncs.end_s - syncs.start_s).to_numpy().reshape(-1, 3)
        assert np.allclose(own - own[:, 2:], offsets, rtol=0, atol=1e-9)
