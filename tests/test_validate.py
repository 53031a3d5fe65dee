"""`geodt validate` / `geodt run`: the comparison table, bad input, and runs end to end.

No assertion depends on machine load: emulated steps are padded to at least their target
(a lower bound that holds however slow the machine is); everything else is structure,
token counts and bytes, which are exact.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from formats.plan import load_plan
from formats.timeline import VALIDATION_COLUMNS
from formats.wire import bytes_sent_per_sync
from geodt.run_cmd import device_kind, run_main, validate_main, validation_table


def _run_exec():
    """geodt/run_exec.py, the executor's side of run and validate (it imports torch): the README's fast
    tier on `pip install -e '.[test]'` has no torch, and skips what needs it."""
    pytest.importorskip("torch")
    import geodt.run_exec as run_exec

    return run_exec


def test_validation_table_sums_rounds_and_scales_measured_time():
    timeline = pd.DataFrame({
        "strategy": "C", "node": ["a", "b"] * 2, "round": [0, 0, 1, 1],
        "compute_s": [1.0, 2.0, 1.0, 2.0], "idle_s": [1.0, 0.0, 1.0, 0.0], "comm_s": [0.5] * 4,
        "round_start_s": 0.0, "round_end_s": 0.0, "tokens": [64, 128, 64, 128],
    })
    # Measured at time scale 0.5: halves of the scenario's seconds.
    trace = pd.DataFrame({
        "strategy": "C", "node": ["a", "b"] * 2, "round": [0, 0, 1, 1],
        "compute_s": [0.5, 1.0, 0.5, 1.0], "idle_s": [0.6, 0.0, 0.55, 0.05], "comm_s": [0.25] * 4,
        "overrun_steps": [0, 1, 0, 0], "tokens": [64, 128, 32, 128],
    })
    table = validation_table(timeline, trace, time_scale=0.5, emulated=True)
    a, b = table.iloc[0], table.iloc[1]
    assert (a["node"], a["predicted_idle_s"], a["predicted_round_s"]) == ("a", 2.0, 5.0)
    assert a["measured_idle_s"] == pytest.approx(2.3)
    assert a["measured_round_s"] == pytest.approx(5.3)
    assert a["error_pct_of_round"] == pytest.approx(100 * 0.3 / 5.0)
    assert b["measured_idle_s"] == pytest.approx(0.1) and b["overrun_steps"] == 1
    # Sync: predicted 0.5 s per round, measured 0.25 s at time scale 0.5 = 0.5 s: no error.
    assert (a["predicted_comm_s"], a["measured_comm_s"], a["comm_error_pct"]) == (1.0, 1.0, 0.0)
    assert list(table.columns[:len(VALIDATION_COLUMNS)]) == VALIDATION_COLUMNS and set(table["mode"]) == {"emulated"}
    assert set(validation_table(timeline, trace, 1.0)["mode"]) == {"measured"}
    assert set(table["network"]) == {"loopback"}
    assert (a["predicted_tokens"], a["measured_tokens"], b["measured_tokens"]) == (128, 96, 256)  # summed per node
    shaped = validation_table(timeline, trace, 1.0, network="shaped WAN (latency not emulated)")
    assert set(shaped["network"]) == {"shaped WAN (latency not emulated)"}


def test_validation_table_reports_signed_sync_errors():
    """A node whose sync took longer than predicted gets a positive error, a faster one a negative
    error, and a node with no predicted sync NaN (not a division by zero)."""
    timeline = pd.DataFrame({
        "strategy": "baseline", "node": ["a", "b", "c"] * 2, "round": [0, 0, 0, 1, 1, 1],
        "compute_s": 1.0, "idle_s": 0.0, "comm_s": [2.0, 4.0, 0.0] * 2,
        "round_start_s": 0.0, "round_end_s": 0.0, "tokens": 64,
    })
    trace = pd.DataFrame({
        "strategy": "baseline", "node": ["a", "b", "c"] * 2, "round": [0, 0, 0, 1, 1, 1],
        "compute_s": 1.0, "idle_s": 0.0, "comm_s": [2.5, 3.0, 0.1, 2.3, 3.4, 0.1], "overrun_steps": 0, "tokens": 64,
    })
    table = validation_table(timeline, trace, time_scale=1.0).set_index("node")
    assert table.at["a", "predicted_comm_s"] == 4.0 and table.at["a", "measured_comm_s"] == pytest.approx(4.8)
    assert table.at["a", "comm_error_pct"] == pytest.approx(20.0)
    assert table.at["b", "comm_error_pct"] == pytest.approx(100 * (6.4 - 8.0) / 8.0)  # -20 %
    assert pd.isna(table.at["c", "comm_error_pct"])
    # The round grows with the sync: a's measured round 2 + 4.8 against 2 + 4 predicted.
    assert (table.at["a", "predicted_round_s"], table.at["a", "measured_round_s"]) == (6.0, pytest.approx(6.8))


@pytest.mark.parametrize("argv, message", [
    (["hetero-cpu", "--strategy", "no-such-strategy"], "no-such-strategy"),
    (["hetero-cpu", "--strategy", "baseline", "--set", "diloco.averaging=median"], "averaging"),
    (["hetero-cpu", "--strategy", "baseline", "--time-scale", "0"], "--time-scale"),
    (["hetero-cpu", "--strategy", "baseline", "--timeout-s", "inf"], "--timeout-s"),
    (["hetero-cpu", "--strategy", "baseline", "--threads", "-1"], "--threads"),
    (["hetero-cpu", "--strategy", "baseline", "--host", "no-such-host.invalid"], "--host: cannot resolve"),
    (["hetero-cpu", "--strategy", "baseline", "--host", "192.0.2.254"], "--host: cannot bind"),
    (["hetero-cpu", "--strategy", "baseline", "--frob"], "unrecognized arguments: --frob"),
])
@pytest.mark.parametrize("main", [run_main, validate_main])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message, main):
    out = tmp_path / "out"
    try:
        code = main([*argv, "--out", str(out)])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (out / "trace.csv").exists()


def test_validate_emulated_is_a_schedule_check(tmp_path, capsys):
    out = tmp_path / "v"
    code = validate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress", "--emulate",
                          "--set", "training.rounds=3", "--set", "training.local_steps=3", "--time-scale", "0.5",
                          "--checkpoint-every", "2"])
    assert code == 0
    # --checkpoint-every reaches the scenario the simulator priced, and the run took those checkpoints
    assert "checkpoint_every = 2" in (out / "scenario.toml").read_text()
    for name in ("plan.csv", "scenario.toml", "timeline.csv", "trace.csv", "validation.csv", "validation.png",
                 "trace.json"):
        assert (out / name).stat().st_size > 0
    assert _tracks(out / "trace.json") == {"predicted: baseline", "emulated: baseline"}  # never called measured
    table = pd.read_csv(out / "validation.csv")
    assert list(table.columns) == VALIDATION_COLUMNS and set(table["mode"]) == {"emulated"}
    assert list(table["node"]) == ["fast", "medium", "slow", "slowest"]
    trace = pd.read_csv(out / "trace.csv")
    assert len(trace) == 12 and (set(trace["mode"]), set(trace["time_scale"])) == ({"emulated"}, {0.5})
    assert list(trace.groupby("round").ckpt_block_s.min() > 0) == [False, True, False]  # after round 2 (none after the last)
    # Padding makes every step last at least its target, whatever the load.
    steps = {"fast": 0.06, "medium": 0.08, "slow": 0.11, "slowest": 0.15}
    for _, row in trace.iterrows():
        assert row["compute_s"] >= 3 * steps[row["node"]] * 0.5 - 1e-3
    printed = capsys.readouterr().out
    assert "schedule check (emulated)" in printed and "mean loss by round" in printed
    assert "verdict (schedule check (emulated)): round time, median over nodes |error| " in printed
    assert set(table["verdict"].str.split(":").str[0]) <= {"within", "outside"}


def test_validate_measures_by_default(tmp_path, capsys):
    out = tmp_path / "v"
    assert validate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress",
                          "--threads", "1", "--set", "training.rounds=1", "--set", "training.local_steps=2"]) == 0
    table = pd.read_csv(out / "validation.csv")
    assert set(table["mode"]) == {"measured"} and len(table) == 4
    assert set(table["network"]) == {"loopback"} and not (out / "wan.csv").exists()
    trace = pd.read_csv(out / "trace.csv")
    assert (trace["overrun_steps"] == 0).all()  # nothing padded, nothing to overrun
    printed = capsys.readouterr()
    assert "measured: largest idle error" in printed.out and "warnings above" in printed.out
    assert "\ncompute, measured over predicted: fast " in printed.out  # the run's compute split (geodt/validation.py)
    # the host over the run, beside every row (train/hoststat.py): what a miss on a shared VM is told by
    if Path("/proc/stat").exists():
        assert table["host_steal_pct"].nunique() == 1 and 0 <= table["host_steal_pct"].iloc[0] < 100
        assert 0 < table["host_busy_pct"].iloc[0] <= 100
        assert "host during the run: steal " in printed.out
    # hetero-cpu's speeds are only given: said before the run, naming the nodes
    assert "warning: nodes fast, medium, slow, slowest: step_time_s is given" in printed.err


def test_given_speeds_without_real_limits_are_named():
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    scenario = load_scenario("hetero-cpu")
    plan = make_plan(scenario, "baseline")
    warnings = _run_exec().reproduction_warnings(scenario, plan, emulate=False, cores=4)
    assert len(warnings) == 1 and warnings[0].startswith("nodes fast, medium, slow, slowest: step_time_s is given")
    assert _run_exec().reproduction_warnings(scenario, plan, emulate=True, cores=1) == []  # padded to the plan's times
    limited = load_scenario("hetero-cpu", ["nodes.fast.cpu_quota=0.3", "nodes.medium.cpu_quota=0.3",
                                           "nodes.slow.cpu_cores=[0]"])
    warnings = _run_exec().reproduction_warnings(limited, make_plan(limited, "baseline"), emulate=False, cores=4)
    assert len(warnings) == 1 and warnings[0].startswith("node slowest: step_time_s is given")
    assert "run it at its own speed" not in warnings[0] and "runs it at its own speed" in warnings[0]


def test_more_cpu_devices_than_cores_is_said():
    """4 single-device CPU nodes: 4 cores' worth of processes; quotas count as their share of a core."""
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    profiled = ["nodes.fast.cpu_quota=0.5", "nodes.medium.cpu_quota=0.5", "nodes.slow.cpu_quota=0.5",
                "nodes.slowest.cpu_quota=0.5"]
    scenario = load_scenario("hetero-cpu", profiled)
    plan = make_plan(scenario, "baseline")
    assert _run_exec().reproduction_warnings(scenario, plan, emulate=False, cores=2) == []  # 4 x 0.5 = 2 cores
    assert _run_exec().reproduction_warnings(scenario, plan, emulate=False, cores=1) == [
        ("4 CPU device processes need 2 cores and this machine offers 1: devices share cores, so the prediction "
        "(every device its own) cannot hold; use fewer devices, or cpu_quota / cpu_cores limits that fit the machine")]
    plain = load_scenario("hetero-cpu")
    warnings = _run_exec().reproduction_warnings(plain, make_plan(plain, "baseline"), emulate=False, cores=2)
    assert any(w.startswith("4 CPU device processes need 4 cores") for w in warnings)
    gpus = load_scenario("paper")  # GPU nodes: no CPU processes counted
    assert not any("CPU device" in w for w in _run_exec().reproduction_warnings(gpus, make_plan(gpus, "baseline"), False, 1))


def test_labels_name_the_device_and_the_mode():
    from simulator.scenario import load_scenario

    assert device_kind(load_scenario("hetero-cpu")) == "CPU" and device_kind(load_scenario("paper")) == "GPU"
    mixed = load_scenario("hetero-cpu", ['nodes.fast.gpus={ "a30" = 1 }'])
    assert device_kind(mixed) == "device"
    assert "emulated" in _run_exec().run_heading(True, 0.5) and "x0.5" in _run_exec().run_heading(True, 0.5)
    assert "emulated" not in _run_exec().run_heading(False, 1.0) and "measured" in _run_exec().run_heading(False, 1.0)


def test_run_executes_the_plan_rounds_of_sync_ddp(tmp_path, capfd):
    out = tmp_path / "r"
    assert run_main(["hetero-cpu", "--strategy", "sync-ddp", "--out", str(out), "--no-progress", "--threads", "1",
                     "--set", "training.rounds=1", "--set", "training.local_steps=3"]) == 0
    plan = load_plan(out / "plan.csv")
    assert plan.rounds == 3 and {n.local_steps for n in plan.nodes} == {1}
    trace = pd.read_csv(out / "trace.csv")
    assert sorted(set(trace["round"])) == [0, 1, 2]
    slices = [e for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    assert sum(e["dur"] for e in slices if e["name"] == "compute") == pytest.approx(trace["compute_s"].sum() * 1e6)
    printed = capfd.readouterr().out
    assert "final_loss" in printed and "slowest" in printed  # the summary
    assert "(measured: every time is this machine's own)" in printed
    assert (set(trace["mode"]), set(trace["time_scale"])) == ({"measured"}, {1.0})
    assert _tracks(out / "trace.json") == {"measured: sync-ddp"}


def test_run_emulated_says_so_in_its_summary(tmp_path, capfd):
    out = tmp_path / "r"
    assert run_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress", "--threads", "1",
                     "--emulate", "--time-scale", "0.1", "--set", "training.rounds=1",
                     "--set", "training.local_steps=1"]) == 0
    printed = capfd.readouterr()
    heading = printed.out[printed.out.index("per node, summed over rounds"):]
    assert heading.startswith("per node, summed over rounds (emulated, times x0.1:") and "final_loss" in heading
    assert "warning" not in printed.err  # emulated: the given speeds are what it pads to
    # the run's own records say it was emulated: its trace.json, and trace.csv, which validate --trace follows
    assert _tracks(out / "trace.json") == {"emulated: baseline"}
    trace = pd.read_csv(out / "trace.csv")
    assert (set(trace["mode"]), set(trace["time_scale"])) == ({"emulated"}, {0.1})
    assert validate_main(["--trace", str(out)]) == 0
    assert set(pd.read_csv(out / "validation" / "validation.csv")["mode"]) == {"emulated"}
    assert _tracks(out / "validation" / "trace.json") == {"predicted: baseline", "emulated: baseline"}
    assert "schedule check (emulated): largest idle error" in capfd.readouterr().out


def test_run_partitioned_int8_plan_sends_int8_bytes(tmp_path):
    out = tmp_path / "r"
    assert run_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out), "--no-progress", "--threads", "1",
                     "--set", "training.rounds=2", "--set", "training.local_steps=2",
                     "--set", "network.collective=partitioned", "--set", "network.payload_dtype=int8",
                     "--set", "nodes.fast.uplink_gbps=0.2", "--set", "nodes.slow.uplink_gbps=0.5"]) == 0
    plan = load_plan(out / "plan.csv")
    assert (plan.collective, plan.payload_dtype) == ("partitioned", "int8")
    links = [n.link_gbps for n in plan.nodes]
    assert links == [0.2, 1.0, 0.5, 1.0]
    import torch

    params = sum(t.numel() for t in torch.load(out / "final_weights.pt", weights_only=True).values())
    trace = pd.read_csv(out / "trace.csv")
    want = bytes_sent_per_sync(params, "int8", "partitioned", links)
    for r in (0, 1):
        assert list(trace[trace["round"] == r]["bytes_sent"]) == want
    assert trace["loss"].notna().all()


def test_prediction_with_jitter_is_the_mean_over_seeds(write_scenario):
    """One measured run is one draw; validate compares it with the expectation over seeds."""
    from dataclasses import replace

    from geodt.run_cmd import VARIABILITY_SAMPLES, predicted_timeline
    from simulator.engines.engine import simulate
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    scenario = load_scenario(str(write_scenario()), ["simulation.jitter_cv=0.2"])
    plan = make_plan(scenario, "baseline")
    mean = predicted_timeline(scenario, plan, "analytic")
    draws = [simulate(replace(scenario, seed=k), plan, "analytic") for k in range(VARIABILITY_SAMPLES)]
    expected = sum(d["idle_s"].to_numpy() for d in draws) / VARIABILITY_SAMPLES
    assert mean["idle_s"].to_numpy() == pytest.approx(expected, rel=1e-12)
    assert not (mean["idle_s"].to_numpy() == draws[0]["idle_s"].to_numpy()).all()
    calm = load_scenario(str(write_scenario()))
    assert predicted_timeline(calm, plan, "analytic").equals(simulate(calm, plan, "analytic"))


def test_validation_table_compares_the_whole_wall_clock(tmp_path):
    """Predicted wall = startup (profiles' warm-up beyond steady steps) + the timeline's end + the last
    checkpoint; measured = the latest node's last round end plus its checkpoint (time-scaled)."""
    from simulator.models.wallclock import WallClock, measured_wall_s, predicted_wall_clock
    from simulator.scenario import load_scenario

    profile = tmp_path / "p.csv"
    profile.write_text(
        "device_name,device_index,gpu_key,model,seq_len,dtype,batch_size,step_s_median,step_s_mean,step_s_p10,"
        "step_s_p90,repeats,peak_mem_bytes,mem_total_bytes,oom,tokens_per_s,sm_util_pct,mem_util_pct,power_w,"
        "torch_version,cuda_version,driver_version,host,measured_at,compiled,warmup_steps,warmup_s\n"
        "cpu,,cpu,tiny,32,fp32,1,0.1,0.1,,,5,,,false,,,,,t,,,h,m,false,2,1.2\n"
        "cpu,,cpu,tiny,32,fp32,2,0.2,0.2,,,5,,,false,,,,,t,,,h,m,false,2,0.5\n")
    toml = tmp_path / "s.toml"
    toml.write_text('name = "s"\n[model]\npreset = "tiny"\nseq_len = 32\ndtype = "fp32"\n[training]\nrounds = 2\n'
                    'local_steps = 3\nbatch_size = 1\n[[nodes]]\nname = "a"\ngpus = { "cpu" = 1 }\nprofile = "p.csv"\n'
                    '[[nodes]]\nname = "b"\ngpus = { "cpu" = 1 }\nstep_time_s = 0.1\n')
    scenario = load_scenario(str(toml))
    timeline = pd.DataFrame({"strategy": "baseline", "node": ["a", "b"] * 2, "round": [0, 0, 1, 1],
                             "compute_s": 0.3, "idle_s": 0.0, "comm_s": 0.1,
                             "round_start_s": [0.0, 0.0, 0.4, 0.4], "round_end_s": [0.4, 0.4, 0.8, 0.8], "tokens": 96})
    wall = predicted_wall_clock(scenario, timeline)
    # startup: the larger of 1.2 − 2 × 0.1 = 1.0 and 0.5 − 2 × 0.2 = 0.1; no network profile: no checkpoint
    assert (wall.startup_s, wall.rounds_s, wall.last_checkpoint_s) == (pytest.approx(1.0), 0.8, 0.0)
    assert wall.wall_s == pytest.approx(1.8) and "b not measured" in wall.note
    # the last round's end, its checkpoint's blocking part and the write the run waits for
    trace = timeline.assign(overrun_steps=0, round_end_s=[1.0, 1.1, 1.6, 1.7], ckpt_block_s=[0.1, 0.1, 0.2, 0.2],
                            ckpt_background_s=[float("nan"), float("nan"), 0.05, 0.1])
    assert measured_wall_s(trace) == pytest.approx(2.0) and measured_wall_s(trace, 0.5) == pytest.approx(4.0)
    table = validation_table(timeline, trace, 1.0, wall=WallClock(1.0, 0.8, 0.0, ""))
    assert list(table["predicted_wall_s"]) == [1.8, 1.8] and list(table["measured_wall_s"]) == [2.0, 2.0]
    assert table["wall_error_pct"].iloc[0] == pytest.approx(100 * 0.2 / 1.8)


# --- an emulated run is never called measured (issue 41, item 5) ---------------------------------------------

def _finished_run(out, run: dict | None, scale: float = 1.0):
    """A run's --out as the executor leaves it, without running it: hetero-cpu's baseline plan (2 rounds),
    and trace.csv = the predicted timeline with its times × scale (what an emulated run at that time
    scale records) plus the executor's columns; run: trace.csv's run columns (None: a trace from before
    it recorded them)."""
    from simulator.engines.engine import simulate
    from simulator.outputs.outputs import write_csv, write_text
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    scenario = load_scenario("hetero-cpu", ["training.rounds=2", "training.local_steps=2"])
    plan = make_plan(scenario, "baseline")
    trace = simulate(scenario, plan, "analytic")
    for column in ("compute_s", "idle_s", "comm_s", "round_start_s", "round_end_s"):
        trace[column] = trace[column] * scale
    trace = trace.assign(loss=5.0, overrun_steps=0, **(run or {}))
    out.mkdir(parents=True)
    write_csv(plan.to_frame(scenario), out / "plan.csv")
    write_text(out / "scenario.toml", scenario.to_toml())
    write_csv(trace, out / "trace.csv")
    return out


def _tracks(path) -> set[str]:
    return {e["args"]["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "process_name"}


def test_validate_trace_follows_the_runs_record_of_emulation(tmp_path, capsys):
    """A trace that records an emulated run at time scale 0.5: validated as emulated, at its own scale,
    without --emulate or --time-scale (it printed "measured:" and wrote mode measured)."""
    run = _finished_run(tmp_path / "run", {"mode": "emulated", "time_scale": 0.5}, scale=0.5)
    assert validate_main(["--trace", str(run)]) == 0
    printed = capsys.readouterr()
    table = pd.read_csv(run / "validation" / "validation.csv")
    assert set(table["mode"]) == {"emulated"}
    # its times divided by its own scale: the padded schedule is the prediction's
    assert list(table["measured_idle_s"]) == pytest.approx(list(table["predicted_idle_s"]))
    assert _tracks(run / "validation" / "trace.json") == {"predicted: baseline", "emulated: baseline"}
    assert "schedule check (emulated): largest idle error" in printed.out and "measured:" not in printed.out
    assert "idle_emul_s" in printed.out and "idle_meas_s" not in printed.out
    assert "verdict (schedule check (emulated))" in printed.out and "verdict (measured" not in printed.out
    assert "compute, measured over predicted" not in printed.out  # padded steps are the prediction's own
    assert "), emulated " in next(line for line in printed.out.splitlines() if line.startswith("wall time"))
    assert printed.err == ""  # no flag given, nothing contradicted
    assert table["host_steal_pct"].isna().all() and "host during the run" not in printed.out  # ran earlier: not known


def test_validate_trace_says_when_a_flag_contradicts_the_record(tmp_path, capsys):
    run = _finished_run(tmp_path / "run", {"mode": "measured", "time_scale": 1.0})
    assert validate_main(["--trace", str(run), "--emulate", "--time-scale", "0.5"]) == 0
    printed = capsys.readouterr()
    assert printed.err.strip() == (f"geodt validate: --emulate and --time-scale 0.5: {run / 'trace.csv'} records the "
                                   "run as measured (not emulated); validating it as recorded")
    table = pd.read_csv(run / "validation" / "validation.csv")
    assert set(table["mode"]) == {"measured"} and "measured: largest idle error" in printed.out
    assert list(table["measured_idle_s"]) == pytest.approx(list(table["predicted_idle_s"]))  # not divided by 0.5
    assert _tracks(run / "validation" / "trace.json") == {"predicted: baseline", "measured: baseline"}
    emulated = _finished_run(tmp_path / "emulated", {"mode": "emulated", "time_scale": 0.5}, scale=0.5)
    assert validate_main(["--trace", str(emulated), "--emulate", "--time-scale", "0.5"]) == 0  # as recorded
    assert capsys.readouterr().err == ""
    assert validate_main(["--trace", str(emulated), "--time-scale", "2"]) == 0
    assert "--time-scale 2: " in capsys.readouterr().err
    assert set(pd.read_csv(emulated / "validation" / "validation.csv")["mode"]) == {"emulated"}


def test_validate_trace_of_a_run_without_the_record_follows_the_flags(tmp_path, capsys):
    run = _finished_run(tmp_path / "run", None, scale=0.5)
    assert validate_main(["--trace", str(run), "--emulate", "--time-scale", "0.5"]) == 0
    table = pd.read_csv(run / "validation" / "validation.csv")
    assert set(table["mode"]) == {"emulated"}
    assert list(table["measured_idle_s"]) == pytest.approx(list(table["predicted_idle_s"]))
    assert validate_main(["--trace", str(run), "--out", str(tmp_path / "plain")]) == 0
    assert set(pd.read_csv(tmp_path / "plain" / "validation.csv")["mode"]) == {"measured"}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("run, message", [
    ({"mode": "simulated", "time_scale": 1.0}, "trace.csv: mode: expected one of measured, emulated"),
    ({"mode": "emulated", "time_scale": 0.0}, "trace.csv: time_scale: expected one finite positive number"),
    ({"mode": "emulated", "time_scale": "fast"}, "trace.csv: time_scale: expected one finite positive number"),
])
def test_validate_trace_refuses_a_bad_record_in_one_line(tmp_path, capsys, run, message):
    out = _finished_run(tmp_path / "run", run)
    assert validate_main(["--trace", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (out / "validation").exists()


def test_validation_figure_names_an_emulated_run_emulated(tmp_path, monkeypatch):
    """validation.png of a schedule check: its legends, axes and titles say emulated, never measured."""
    import geodt.validation
    from geodt.validation import plot_validation

    figures = []  # where the validation saves (its top import of simulator.outputs.outputs.save_figure)
    monkeypatch.setattr(geodt.validation, "save_figure", lambda fig, path, **kw: figures.append(fig))
    timeline = pd.DataFrame({"strategy": "baseline", "node": ["a", "b"], "round": 0, "compute_s": [1.0, 2.0],
                             "idle_s": [1.0, 0.0], "comm_s": 0.5, "tokens": 64})
    for emulated in (True, False):
        table = validation_table(timeline, timeline.assign(overrun_steps=0), 1.0, emulated=emulated)
        plot_validation(table, tmp_path / "v.png", "title", "CPU")
    texts = [[t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text"))] for fig in figures]
    words = [" ".join(t) for t in texts]
    assert "emulated" in words[0] and "measured" not in words[0]
    assert "measured" in words[1] and "emulated" not in words[1]


def test_trace_csv_records_how_the_run_was_made():
    """real/rounds/trace.py: mode and time_scale on every row, after the timeline's and the executor's columns."""
    from formats.timeline import RUN_COLUMNS, TRACE_COLUMNS
    from real.core.options import ExecOptions
    from real.rounds.trace import run_columns, trace_frame

    row = dict.fromkeys(TRACE_COLUMNS, 0) | {"strategy": "baseline", "node": "a"}
    emulated = trace_frame([row], ["a"], run_columns(ExecOptions(out_dir=".", emulate=True, time_scale=0.5)))
    assert list(emulated.columns) == TRACE_COLUMNS + RUN_COLUMNS
    assert emulated[RUN_COLUMNS].iloc[0].tolist() == ["emulated", 0.5]
    measured = trace_frame([row | {"members": "0"}], ["a"], run_columns(ExecOptions(out_dir=".", time_scale=0.5)),
                           extra=["members"])
    assert list(measured.columns) == TRACE_COLUMNS + RUN_COLUMNS + ["members"]
    assert measured[RUN_COLUMNS].iloc[0].tolist() == ["measured", 1.0]  # the scale pads nothing unemulated
