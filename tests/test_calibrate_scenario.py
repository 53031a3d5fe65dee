"""geodt calibrate scenario --scenario: every CPU device of a scenario measured at once, one profile each,
which the scenario's nodes then use."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

SCENARIO = """
name = "pair"
[model]
preset = "tiny"
seq_len = 16
dtype = "fp32"
[training]
rounds = 2
local_steps = 3
batch_size = 2
[[nodes]]
name = "a"
gpus = { "cpu" = 1 }
cpu_cores = [0]
profile = "cal/a-0.csv"
[[nodes]]
name = "b"
gpus = { "cpu" = 2 }
profile = ["cal/b-0.csv", "cal/b-1.csv"]
"""


def test_every_device_gets_a_profile_the_scenario_then_uses(tmp_path, capsys):
    from geodt.calibration.scenario import main
    from simulator.scenario import load_scenario
    from simulator.strategies import make_plan

    path = tmp_path / "pair.toml"
    path.write_text(textwrap.dedent(SCENARIO))
    (tmp_path / "cal").mkdir()
    # the profiles the scenario names do not exist yet: that is what this command makes
    assert main(["--scenario", str(path), "--batch", "1,2", "--repeats", "2", "--warmup", "1",
                 "--out-dir", str(tmp_path / "cal")]) == 0
    names = sorted(p.name for p in (tmp_path / "cal").iterdir())
    assert names == ["a-0.csv", "b-0.csv", "b-1.csv"]
    for name in names:
        frame = pd.read_csv(tmp_path / "cal" / name)
        assert list(frame["batch_size"]) == [1, 2] and (frame["repeats"] == 2).all()
    device = pd.read_csv(tmp_path / "cal" / "b-1.csv")["device_name"].iloc[0]
    assert device.endswith("; pair b 2/2)")
    assert "cores 0" in pd.read_csv(tmp_path / "cal" / "a-0.csv")["device_name"].iloc[0]
    scenario = load_scenario(str(path))
    plan = make_plan(scenario, "baseline")
    measured = pd.read_csv(tmp_path / "cal" / "a-0.csv").set_index("batch_size")["step_s_median"]
    assert plan.nodes[0].step_s == pytest.approx(measured[2])
    printed = capsys.readouterr().out
    assert "b device 2/2" in printed
    if Path("/proc/stat").exists():  # what a later run's steal is compared with (train/hoststat.py)
        assert "host during the calibration: steal " in printed


@pytest.mark.parametrize("retries, written", [(2, "third"), (1, "second")])
def test_a_calibration_under_steal_is_measured_again_and_the_least_stolen_kept(tmp_path, monkeypatch, capsys,
                                                                                retries, written):
    """Steal of 8.3%, then 3.8% (both above 2%), then 1.0% over three measurements: --steal-retries 2
    writes the third; --steal-retries 1 stops after two and keeps the one with less steal, warning."""
    import geodt.calibration.scenario as cal
    import train.hoststat as hoststat

    path = tmp_path / "pair.toml"
    path.write_text(textwrap.dedent(SCENARIO))
    steal = iter([0, 9, 9, 13, 13, 14])  # cumulative steal ticks, read before and after each measurement
    clock = iter(range(0, 1000, 100))     # and 100 idle ticks more at each read
    monkeypatch.setattr(cal, "cpu_times", lambda: {**dict.fromkeys(hoststat.FIELDS, 0),  # where the calibration reads
                                                   "idle": next(clock), "steal": next(steal)})
    measures = iter(["first", "second", "third"])
    monkeypatch.setattr(cal, "_measure_all", lambda scenario, args, jobs: next(measures))
    kept = []
    monkeypatch.setattr(cal, "_write_profiles", lambda out_dir, jobs, rows: kept.append(rows))
    assert cal.main(["--scenario", str(path), "--out-dir", str(tmp_path), "--steal-retries", str(retries)]) == 0
    assert kept == [written]
    said = capsys.readouterr()
    assert said.err.count("measuring again") == retries
    assert ("warning: the host's other tenants took 3.8%" in said.err) == (written == "second")


def test_gpu_nodes_and_bad_arguments_are_one_line(tmp_path, capsys):
    from geodt.calibration.scenario import main

    assert main(["--scenario", "paper", "--out-dir", str(tmp_path)]) == 2
    assert "expected CPU devices only" in capsys.readouterr().err
    path = tmp_path / "pair.toml"
    path.write_text(textwrap.dedent(SCENARIO))
    for argv, expected in ((["--batch", "x"], "--batch 'x'"), (["--batch", "auto"], "expected a list"),
                           (["--out-dir", str(tmp_path / "nope")], "expected an existing directory")):
        full = ["--scenario", str(path), "--out-dir", str(tmp_path), *argv]
        assert main(full) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, prctl)")
def test_a_killed_calibration_takes_its_device_processes_with_it(tmp_path):
    """SIGKILL (or SIGTERM) gives the parent no chance to stop its device processes. torch's
    start_processes asks for SIGINT to them when it goes, but a command started with SIGINT
    ignored (a background job of a script, nohup) passes that on to them: before
    train/children.py they kept stepping, for good. Nothing is written."""
    import signal
    import subprocess

    from tests.proctree import cpu_s, kill_parent_once_ready

    path = tmp_path / "pair.toml"
    path.write_text(textwrap.dedent(SCENARIO))
    (tmp_path / "cal").mkdir()
    parent = subprocess.Popen([sys.executable, "-m", "geodt", "calibrate", "scenario", "--scenario", str(path), "--batch", "1",
                               "--repeats", "1000000", "--out-dir", str(tmp_path / "cal")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    # Into their steps (a few seconds of CPU each: past the start-up, when a child still reading
    # its start from the parent's pipe ends with it anyway), then the parent killed.
    left = kill_parent_once_ready(parent, 3, lambda pids: min(cpu_s(p) for p in pids) >= 5)
    assert left == [], f"device processes {left} outlived their killed parent"
    assert list((tmp_path / "cal").iterdir()) == []


def test_the_network_profile_need_not_exist_yet(tmp_path):
    """The scenario names the network profile `geodt calibrate network` writes; calibrating the
    devices first (README, "A first calibration journey") must not need it: it does not sync."""
    from geodt.calibration.scenario import _checked_scenario, parser
    from simulator.scenario import load_scenario

    path = tmp_path / "pair.toml"
    path.write_text(textwrap.dedent(SCENARIO).replace("[[nodes]]", '[network]\nprofile = "cal/net.csv"\n[[nodes]]', 1))
    (tmp_path / "cal").mkdir()
    scenario = _checked_scenario(parser().parse_args(["--scenario", str(path), "--out-dir", str(tmp_path / "cal")]))
    assert not isinstance(scenario, str), scenario
    assert [n.name for n in scenario.nodes] == ["a", "b"]
    with pytest.raises(Exception, match=r"net\.csv"):  # the run itself still needs it
        load_scenario(str(path), without_profiles=True)


def _rows(*steps):
    """One device's rows at batches 1, 2, ... with these median steps (None: out of memory)."""
    return [{"batch_size": b, "step_s_median": s, "pass": tag} for b, (s, tag) in enumerate(steps, start=1)]


def test_median_rows_keeps_each_devices_median_pass_per_batch():
    """Three passes: per device and batch, the row of the pass whose step is the middle one, whole; two
    passes: the lower; a batch out of memory in any pass keeps the first pass's row."""
    from geodt.calibration.scenario import median_rows

    passes = [{0: _rows((0.040, "p0"), (0.070, "p0")), 1: _rows((0.100, "p0"), (None, "p0"))},
              {0: _rows((0.059, "p1"), (0.060, "p1")), 1: _rows((0.098, "p1"), (0.2, "p1"))},
              {0: _rows((0.041, "p2"), (0.065, "p2")), 1: _rows((0.103, "p2"), (0.3, "p2"))}]
    kept = median_rows(passes)
    assert [r["pass"] for r in kept[0]] == ["p2", "p2"]  # 0.041 of 0.040/0.059/0.041; 0.065 of 0.070/0.060/0.065
    assert [r["pass"] for r in kept[1]] == ["p0", "p0"]  # 0.100 of 0.100/0.098/0.103; batch 2 OOM in p0
    assert [r["pass"] for r in median_rows(passes[1:])[0]] == ["p2", "p1"]  # even: the lower middle
    assert median_rows(passes[:1]) == passes[0]


def test_passes_measure_the_scenario_k_times_and_write_the_median(tmp_path, monkeypatch, capsys):
    import geodt.calibration.scenario as cal

    path = tmp_path / "pair.toml"
    path.write_text(textwrap.dedent(SCENARIO))
    measures = iter([{0: _rows((0.05, "p0"))}, {0: _rows((0.07, "p1"))}, {0: _rows((0.06, "p2"))}])
    monkeypatch.setattr(cal, "_measure_all", lambda scenario, args, jobs: next(measures))
    kept = []
    monkeypatch.setattr(cal, "_write_profiles", lambda out_dir, jobs, rows: kept.append(rows))
    assert cal.main(["--scenario", str(path), "--out-dir", str(tmp_path), "--passes", "3"]) == 0
    assert [r["pass"] for r in kept[0][0]] == ["p2"]
    assert capsys.readouterr().err.count("geodt calibrate scenario: pass ") == 3
