"""geodt plan --export torchft (geodt/torchft_export.py) and the torch-only recorder (train/torchft_recorder.py).

The export is checked on its files (exact values from the plan and the prediction, every value
commented, shell quoting, refusals in one line with nothing written); the recorder on a step loop
with a stand-in for torchft's Manager and DiLoCo hook (sleep-padded, so its times have floors);
and, marked slow, a real torchft run (lighthouse, Manager, gloo) of an exported two-node plan,
validated with `geodt validate --trace`, with its processes and lighthouse gone afterwards.
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from pathlib import Path

import pytest
import tomllib

from formats.timeline import RUN_COLUMNS, TRACE_COLUMNS
from geodt.cli import main as geodt_main
from train import torchft_recorder

ROOT = Path(__file__).resolve().parents[1]


def _export(tmp_path: Path, strategy: str, *extra: str) -> tuple[int, Path]:
    out = tmp_path / strategy
    return geodt_main(["plan", "hetero-cpu", "--strategy", strategy, "--export", "torchft", str(out), *extra]), out


def test_recorder_columns_are_the_trace_contract():
    assert torchft_recorder.COLUMNS == TRACE_COLUMNS + RUN_COLUMNS


def test_export_sets_each_replica_from_the_plan(tmp_path):
    status, out = _export(tmp_path, "measured-steps", "--emulate", "--time-scale", "2")
    assert status == 0
    h = {"fast": 25, "medium": 18, "slow": 13, "slowest": 10}  # the plan's H_i (geodt plan's table)
    steps = {"fast": 0.06, "medium": 0.08, "slow": 0.11, "slowest": 0.15}
    for node, sync_every in h.items():
        text = (out / f"replica-{node}.toml").read_text()
        cfg = tomllib.loads(text)
        assert cfg["diloco"]["sync_every"] == sync_every
        assert cfg["diloco"]["num_fragments"] == 1 and cfg["diloco"]["fragment_sync_delay"] == 0
        assert cfg["batch"] == {"batch_size": 4, "grad_accum": 1}
        assert cfg["emulate"] == {"step_s": steps[node], "comm_s": pytest.approx(0.0431914406), "time_scale": 2.0}
        assert cfg["lighthouse"] == {"address": "http://127.0.0.1:29510", "min_replicas": 4}
        assert cfg["diloco"]["outer_lr"] == 0.7 and cfg["diloco"]["outer_momentum"] == 0.9
        # every value says where it came from
        values = [line for line in text.splitlines() if " = " in line and not line.startswith("#")]
        assert values and all("#" in line for line in values), [v for v in values if "#" not in v]
    for name in ("train_torchft.py", "torchft_recorder.py", "lighthouse.sh", "run_all.sh", "plan.csv",
                 "scenario.toml"):
        assert (out / name).is_file(), name
    assert (out / "torchft_recorder.py").read_bytes() == (ROOT / "train" / "torchft_recorder.py").read_bytes()


def test_timeouts_come_from_the_predicted_round(tmp_path):
    status, out = _export(tmp_path, "measured-steps", "--emulate", "--time-scale", "4")
    assert status == 0
    cfg = tomllib.loads((out / "replica-slow.toml").read_text())
    header = (out / "replica-slow.toml").read_text().split("[timeouts]")[1].splitlines()[0]
    # the slowest replica's round: 10 steps of 0.15 s + the sync 0.0431914406 s, × the time scale 4
    round_s = 4 * (10 * 0.15 + 0.0431914406)
    assert f"predicted round {round_s:.3f} s" in header
    band = float(header.split("the band ")[1].split("%")[0])
    edge_s = round_s * (1 + band / 100)
    lighthouse = shlex.split((out / "lighthouse.sh").read_text().splitlines()[-1])
    assert lighthouse[lighthouse.index("--join_timeout_ms") + 1] == str(round(1000 * edge_s))
    assert lighthouse[lighthouse.index("--quorum_tick_ms") + 1] == str(min(100, round(10 * round_s)))
    # hetero-cpu has restart_s 0; a rejoin is the fetch of the weights and outer momentum (8 bytes for each
    # of tiny's 262,464 parameters) over 1 Gbps plus 5 ms of latency, × the time scale 4
    rejoin_s = 4 * (8 * 262464 * 8 / 1e9 + 0.005)
    # (the band is printed to 0.1%: edge_s is known to ±0.05% of the round)
    assert cfg["timeouts"]["quorum_timeout_s"] == pytest.approx(max(5.0, edge_s + rejoin_s), abs=round_s * 5e-4)


def test_the_scripts_quote_what_they_are_given(tmp_path):
    hostile = "a$(touch pwned);b:29999"  # a host that a shell would run
    status, out = _export(tmp_path, "baseline", "--lighthouse", hostile)
    assert status == 0
    last = (out / "lighthouse.sh").read_text().splitlines()[-1]
    assert shlex.split(last)[:3] == ["exec", "torchft_lighthouse", "--bind"]
    assert shlex.split(last)[3] == hostile
    assert tomllib.loads((out / "replica-fast.toml").read_text())["replica"]["host"] == "a$(touch pwned);b"


@pytest.mark.parametrize("strategy", ["deadline", "quorum", "async", "rebalance", "sync-ddp"])
def test_strategies_without_a_torchft_form_are_refused(tmp_path, strategy, capsys):
    status, out = _export(tmp_path, strategy)
    err = capsys.readouterr().err.strip()
    assert status == 2 and not out.exists()
    assert len(err.splitlines()) == 1 and f"strategy {strategy} has no torchft form" in err


@pytest.mark.parametrize("strategy, extra, words", [
    ("network-aware", (), "collective partitioned"),  # its plan picks the partitioned all-reduce
    ("measured-steps", ("--set", "diloco.fragments=2"), "node fast: local_steps 25 with fragments 2"),
])
def test_plans_torchft_cannot_hold_are_refused_before_writing(tmp_path, strategy, extra, words, capsys):
    status, out = _export(tmp_path, strategy, *extra)
    err = capsys.readouterr().err.strip()
    assert status == 2 and not out.exists(), err
    assert len(err.splitlines()) == 1 and words in err


def test_streaming_settings_travel(tmp_path):
    status, out = _export(tmp_path, "baseline", "--set", "diloco.fragments=2", "--set", "diloco.sync_delay_steps=1",
                          "--set", "diloco.fragment_alpha=0.5")
    assert status == 0
    d = tomllib.loads((out / "replica-slow.toml").read_text())["diloco"]
    assert (d["sync_every"], d["num_fragments"], d["fragment_sync_delay"], d["fragment_update_alpha"]) == (10, 2, 1, 0.5)


def test_bad_export_arguments_are_one_line(tmp_path, capsys):
    for extra in (["--lighthouse", "nohost"], ["--time-scale", "0"]):
        status, out = _export(tmp_path, "baseline", *extra)
        assert status == 2 and not out.exists()
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    status = geodt_main(["plan", "hetero-cpu", "--strategy", "baseline", "--export", "deepspeed", str(tmp_path / "x")])
    assert status == 2 and "unknown format" in capsys.readouterr().err


def test_validate_reads_the_replicas_traces(tmp_path, capsys):
    """geodt validate --trace DIR joins DIR/traces/<node>.csv (no trace.csv): a trace equal to the
    prediction validates with no error."""
    pytest.importorskip("torch", reason="geodt validate needs the real extra")
    import pandas as pd

    from geodt.validation import predicted_timeline
    from simulator.scenario import load_scenario

    status, out = _export(tmp_path, "baseline", "--emulate")
    assert status == 0
    from formats.plan import load_plan

    scenario = load_scenario(str(out / "scenario.toml"))
    timeline = predicted_timeline(scenario, load_plan(out / "plan.csv", seq_len=64), "analytic")
    (out / "traces").mkdir()
    for node, rows in timeline.groupby("node"):
        rows.assign(loss=6.9, overrun_steps=0, ckpt_block_s=0.0, ckpt_background_s=0.0, local_steps=10,
                    batch_size=4, bytes_sent=0, peak_mem_bytes=0, mode="emulated", time_scale=1.0)[
            torchft_recorder.COLUMNS].to_csv(out / "traces" / f"{node}.csv", index=False)
    capsys.readouterr()
    assert geodt_main(["validate", "--trace", str(out)]) == 0
    table = pd.read_csv(out / "validation" / "validation.csv")
    assert sorted(table["node"]) == ["fast", "medium", "slow", "slowest"]
    assert table["error_pct_of_round"].abs().max() < 1e-6 and set(table["mode"]) == {"emulated"}


class _Manager:
    """What the recorder wraps: a quorum that waits `wait_s` (the others arriving), a commit."""

    def __init__(self, wait_s: float):
        self.wait_s, self.commits = wait_s, 0

    def start_quorum(self, *args, **kwargs):
        time.sleep(self.wait_s)

    def should_commit(self, *args, **kwargs):
        self.commits += 1
        return True


def test_recorder_splits_compute_idle_and_sync(tmp_path):
    torch = pytest.importorskip("torch")

    model = torch.nn.Linear(4, 4)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = _Manager(wait_s=0.05)
    rec = torchft_recorder.RoundRecorder(tmp_path, "n0", "baseline", sync_every=3, batch_size=2, seq_len=8,
                                         step_s=0.02, comm_s=0.03)
    rec.attach(manager, inner)
    steps = {"n": 0}

    def diloco_hook(*_):  # DiLoCo's post hook, registered after the recorder's: syncs every 3rd step
        steps["n"] += 1
        if steps["n"] % 3 == 0:
            manager.start_quorum()
            manager.should_commit()

    inner.register_step_post_hook(diloco_hook)
    rec.start()
    for _ in range(6):
        with rec.step():
            model(torch.ones(1, 4)).sum().backward()
            rec.loss(1.5)
            inner.step()
    path = rec.close()
    import pandas as pd

    trace = pd.read_csv(path)
    assert list(trace.columns) == TRACE_COLUMNS + RUN_COLUMNS and list(trace["round"]) == [0, 1]
    assert set(trace["mode"]) == {"emulated"} and set(trace["tokens"]) == {3 * 2 * 8}
    # padded: floors exact, ceilings loose (a loaded host's sleeps overshoot)
    assert all(0.06 <= c < 0.3 for c in trace["compute_s"])
    assert all(0.05 <= i < 0.3 for i in trace["idle_s"])
    assert all(0.03 <= s < 0.3 for s in trace["comm_s"])
    sums = trace["compute_s"] + trace["idle_s"] + trace["comm_s"]
    assert (sums - (trace["round_end_s"] - trace["round_start_s"])).abs().max() < 1e-3
    assert trace["round_start_s"].iloc[1] == trace["round_end_s"].iloc[0]


def test_recorder_attached_after_diloco_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 4)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = _Manager(wait_s=0.0)
    inner.register_step_post_hook(lambda *_: manager.start_quorum())  # DiLoCo's hook, registered first
    rec = torchft_recorder.RoundRecorder(tmp_path, "n0", "baseline", sync_every=1, batch_size=1, seq_len=1)
    rec.attach(manager, inner)
    with pytest.raises(RuntimeError, match="attach it before entering torchft's DiLoCo"), rec.step():
        model(torch.ones(1, 4)).sum().backward()
        inner.step()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TWO_NODES = """name = "two"
seed = 0
nodes = [
    { name = "fast", gpus = { cpu = 1 }, step_time_s = 0.15 },
    { name = "slow", gpus = { cpu = 1 }, step_time_s = 0.3 },
]
[model]
preset = "tiny"
seq_len = 64
[training]
rounds = 2
local_steps = 4
batch_size = 4
"""


@pytest.mark.slow
def test_a_torchft_run_of_an_exported_plan_validates(tmp_path):
    """Equal sync_every on two replicas of unequal speed: torchft's own DiLoCo, measured idle as predicted."""
    pytest.importorskip("torchft")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_torchft_export import run_export, validate

    (tmp_path / "two.toml").write_text(TWO_NODES)
    port = _free_port()
    out = tmp_path / "tf"
    assert geodt_main(["plan", str(tmp_path / "two.toml"), "--strategy", "baseline", "--export", "torchft",
                       str(out), "--emulate", "--lighthouse", f"127.0.0.1:{port}"]) == 0
    run_export(out, timeout_s=150)
    table = validate(out).set_index("node")
    # fast waits 4 × (0.3 − 0.15) s a round for slow; 6% of the round is the goal for emulated runs
    assert table.at["fast", "predicted_idle_s"] == pytest.approx(2 * 4 * 0.15)
    assert table["error_pct_of_round"].abs().max() <= 6.0, table
    assert table["round_error_pct"].abs().max() <= 5.0, table
    with socket.socket() as s:  # the lighthouse is gone (run_all.sh stops it; run_export its group): the port binds
        s.bind(("127.0.0.1", port))


def _stamp(line: str) -> float:
    """Seconds of the day of a torchft (Rust) log line: 2026-12-07T14:11:53.928 [INFO] ..."""
    clock = line.split("T", 1)[1].split(" ", 1)[0]
    h, m, s = clock.split(":")
    return 3600 * int(h) + 60 * int(m) + float(s)


@pytest.mark.slow
def test_timeouts_hold_a_replica_at_the_band_edge_and_trip_on_a_stopped_one(tmp_path):
    """The slow replica's steps at the band's edge: no timeout trips in round 0. Then it is stopped (SIGKILL):
    the fast one's quorum fails after the exported quorum_timeout_s, within +10%."""
    import os
    import signal
    import subprocess

    pytest.importorskip("torchft")
    (tmp_path / "two.toml").write_text(TWO_NODES.replace("rounds = 2", "rounds = 3"))
    out = tmp_path / "tf"
    assert geodt_main(["plan", str(tmp_path / "two.toml"), "--strategy", "baseline", "--export", "torchft",
                       str(out), "--emulate", "--time-scale", "4", "--lighthouse", f"127.0.0.1:{_free_port()}"]) == 0
    slow_toml = out / "replica-slow.toml"
    header = slow_toml.read_text().split("[timeouts]")[1].splitlines()[0]
    band = float(header.split("the band ")[1].split("%")[0])
    slow_toml.write_text(slow_toml.read_text().replace("step_s = 0.3 ", f"step_s = {0.3 * (1 + band / 100)!r} "))
    quorum_timeout_s = tomllib.loads((out / "replica-fast.toml").read_text())["timeouts"]["quorum_timeout_s"]
    assert quorum_timeout_s > 5.0  # the prediction's, not the floor
    env = {**os.environ, "PYTHON": sys.executable}
    procs = [subprocess.Popen([str(out / "lighthouse.sh")], start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        time.sleep(1)
        fast, slow = (subprocess.Popen([str(out / f"replica-{n}.sh")], env=env, start_new_session=True, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in ("fast", "slow"))
        procs += [fast, slow]
        for line in slow.stdout:
            if line.startswith("slow: round 0"):  # round 0 done at the band's edge: nothing tripped
                os.killpg(slow.pid, signal.SIGKILL)
                break
        lines = fast.communicate(timeout=120)[0].splitlines()
        assert fast.returncode != 0
        assert any(line.startswith("fast: round 0") for line in lines)
        started = [_stamp(li) for li in lines if "[Replica fast] Start quorum" in li]
        failed = [_stamp(li) for li in lines if "lighthouse quorum failed" in li]
        assert failed, "\n".join(lines[-20:])
        trip_s = failed[0] - max(s for s in started if s <= failed[0])
        print(f"quorum_timeout_s {quorum_timeout_s:.3f}, tripped after {trip_s:.3f} s")
        assert quorum_timeout_s <= trip_s + 2e-3 and trip_s <= 1.1 * quorum_timeout_s
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_users_file_of_an_exported_name_is_never_replaced(tmp_path, capsys):
    """run_all.sh, lighthouse.sh, train_torchft.py are common names: a user's own in DIR is refused in one
    line, nothing written (the export replaced it, exit 0); an earlier export's own is replaced; --force
    writes over anything."""
    out = tmp_path / "x"
    out.mkdir()
    (out / "run_all.sh").write_text("my script\n")
    argv = ["plan", "hetero-cpu", "--strategy", "baseline", "--export", "torchft", str(out)]
    assert geodt_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "holds files `geodt plan --export torchft` would replace and did not write (run_all.sh)" in err
    assert sorted(os.listdir(out)) == ["run_all.sh"] and (out / "run_all.sh").read_text() == "my script\n"
    assert geodt_main(argv + ["--force"]) == 0 and "my script" not in (out / "run_all.sh").read_text()
    assert geodt_main(argv) == 0  # its own earlier export: a rerun replaces it
