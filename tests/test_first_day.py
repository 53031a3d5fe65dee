"""A first day without surprises (issue 31): what a newcomer's first commands meet.

Runs this machine cannot hold are refused up front (geodt/preflight.py); work beyond the
documented size limit is refused before planning (formats/limits.py); every bad input is one
line, exit 2, nothing written; a finished real run, also one of two torchrun "machines", is
validated from its trace (`geodt validate --trace`); printed tables fit 120 characters.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from one_line import one_line_exit_2

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")

from formats.limits import SWEEP_STEPS, SWEEP_STEPS_LARGE, WORK_ROWS, WORK_ROWS_LARGE, check_work  # noqa: E402
from geodt.preflight import Machine, PreflightError, check_machine  # noqa: E402
from geodt.run_cmd import run_main, validate_main  # noqa: E402
from simulator.cli import estimated_rows, plan_main, simulate_main  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.strategies import make_plan  # noqa: E402
from simulator.sweep.sweep_cli import main as sweep_main  # noqa: E402

CPU_MACHINE = Machine(cores=2, memory_bytes=24e9, gpu_memory_bytes=())


def call(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors
        return int(exc.code)


# --- 1. runs this machine can hold ---------------------------------------------------------------------

def test_paper_on_a_cpu_machine_is_refused_by_memory():
    """16 processes of llama-150m at batch 4 (fp16 model, simulator/models/memory.py) on a 24 GB machine without GPU."""
    scenario = load_scenario("paper")
    plan = make_plan(scenario, "baseline")
    with pytest.raises(PreflightError) as info:
        check_machine(scenario, plan, "auto", CPU_MACHINE)
    message = str(info.value)
    assert "16 processes of llama-150m" in message and "no GPU" in message and "24.0 GB available" in message
    assert "--set model.preset=tiny" in message and "hetero-cpu" in message


def test_gpu_machine_checks_each_gpu_memory():
    scenario = load_scenario("paper")
    plan = make_plan(scenario, "baseline")
    small_gpus = Machine(cores=64, memory_bytes=512e9, gpu_memory_bytes=(4e9,) * 16)
    with pytest.raises(PreflightError, match=r"smallest GPU holds 4.0 GB"):
        check_machine(scenario, plan, "auto", small_gpus)
    big_gpus = Machine(cores=64, memory_bytes=512e9, gpu_memory_bytes=(80e9,) * 16)
    assert check_machine(scenario, plan, "auto", big_gpus) == []


def test_nccl_without_gpus_is_refused():
    scenario = load_scenario("hetero-cpu")
    with pytest.raises(PreflightError, match=r"--backend nccl: .* 4 processes of tiny need a GPU each"):
        check_machine(scenario, make_plan(scenario, "baseline"), "nccl", CPU_MACHINE)


def test_gpu_nodes_run_on_the_cpu_is_said():
    """A scenario naming GPUs that fits in memory runs on the CPU; the warning says what that means."""
    scenario = load_scenario("paper", ["model.preset=tiny", "model.seq_len=64"])
    warnings = check_machine(scenario, make_plan(scenario, "baseline"), "auto", CPU_MACHINE)
    assert len(warnings) == 1 and "nodes node1, node2, node3, node4" in warnings[0] and "on the CPU" in warnings[0]
    cpu = load_scenario("hetero-cpu")
    assert check_machine(cpu, make_plan(cpu, "baseline"), "auto", CPU_MACHINE) == []


@pytest.mark.skipif(torch.cuda.device_count() >= 16, reason="a machine with 16 GPUs can hold the paper's run")
@pytest.mark.parametrize("main", [run_main, validate_main])
def test_geodt_run_paper_is_refused_in_one_line_and_writes_nothing(tmp_path, capsys, main):
    out = tmp_path / "out"
    code = main(["paper", "--strategy", "baseline", "--out", str(out)])
    one_line_exit_2(capsys, code, "this machine cannot hold the run", "16 processes of llama-150m")
    assert not out.exists()


# --- 2. size limits up front ---------------------------------------------------------------------------

def test_estimated_rows_per_strategy():
    scenario = load_scenario("paper", ["training.rounds=1000"])
    rows = estimated_rows(scenario, ["baseline", "sync-ddp", "streaming"])
    # 4 nodes: one row per node and round; sync-ddp's rounds are H = 100 inner steps each;
    # streaming a sync row per fragment too, up to 16 fragments.
    assert rows == {"baseline": 4_000, "sync-ddp": 400_000, "streaming": 68_000}


def test_check_work_bounds():
    assert check_work({"a": WORK_ROWS}) is None
    asks = check_work({"a": WORK_ROWS + 1})
    assert "add --large" in asks and f"{WORK_ROWS:,}" in asks
    assert check_work({"a": WORK_ROWS + 1}, large=True) is None
    refused = check_work({"a": WORK_ROWS_LARGE, "b": 1}, large=True)
    assert "--large" not in refused and f"at most {WORK_ROWS_LARGE:,} (" in refused and f"({WORK_ROWS_LARGE + 1:,} over 2" in refused


def test_fleet_size_runs_with_default_settings(tmp_path):
    # issue 32's goals are met "with default settings": 4096 nodes x 2000 rounds (8,192,000 rows, about
    # 4 s on the default path) and a sweep of 10^6 four-node scenarios (1,360,680 streaming steps at the
    # paper's 10 rounds) are not refused; the limits of issue 31 once asked --large of both
    nodes = "\n".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ a30 = 1 }}\nstep_time_s = 0.2' for i in range(4096))
    (tmp_path / "fleet.toml").write_text('name = "fleet"\n' + nodes + '\n[model]\npreset = "llama-150m"\n[training]\nrounds = 2000\n')
    scenario = load_scenario(str(tmp_path / "fleet.toml"))
    assert estimated_rows(scenario, ["baseline"]) == {"baseline": 8_192_000}
    assert check_work(estimated_rows(scenario, ["baseline"]), output="parquet") is None
    assert check_work({"streaming": 2001 * 10 * 4 * 17}, limits=(SWEEP_STEPS, SWEEP_STEPS_LARGE)) is None
    why = check_work({"baseline": WORK_ROWS + 1}, output="csv")
    assert "about 1.8 GB of output" in why and "add --large" in why


@pytest.mark.parametrize("argv", [
    ["simulate", "paper"], ["plan", "paper", "--strategy", "sync-ddp"], ["sweep", "--table", "paper"],
    ["sweep", "--samples", "3"],
    ["run", "paper", "--strategy", "sync-ddp"], ["validate", "paper", "--strategy", "sync-ddp"],
])
def test_a_million_rounds_is_refused_before_planning(tmp_path, capsys, argv):
    from geodt.cli import main

    out = tmp_path / "out"
    code = main([*argv, "--set", "training.rounds=1000000", "--out", str(out)])
    one_line_exit_2(capsys, code, "rows" if argv[0] != "sweep" or "--table" in argv else "fragment-sync steps",
                    "expected at most")
    assert not out.exists()


def test_large_work_asks_for_the_flag_and_the_flag_allows_it(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["paper", "--strategy", "sync-ddp", "--set", "training.rounds=30000", "--out", str(out)]
    one_line_exit_2(capsys, plan_main(argv), "12,000,000 timeline rows", "add --large")
    assert not out.exists()
    assert plan_main([*argv, "--large"]) == 0 and (out / "plan.csv").exists()


# --- 4. bad input: one line, exit 2, nothing left -----------------------------------------------------

BASE = ["hetero-cpu", "--strategy", "baseline", "--set", "training.rounds=1", "--set", "training.local_steps=1",
        "--threads", "1", "--no-progress"]


@pytest.mark.parametrize("extra, needles", [
    (["--backend", "nccl"], ["--backend nccl", "need a GPU each"]),
    (["--host", "192.0.2.254"], ["--host: cannot bind"]),
    (["--resume"], ["--resume", "holds no checkpoint"]),
    (["--data", "FIFO"], ["--data", "not a regular file"]),
])
@pytest.mark.parametrize("main", [run_main, validate_main])
def test_refused_runs_leave_nothing(tmp_path, capsys, main, extra, needles):
    if torch.cuda.is_available() and extra[:2] == ["--backend", "nccl"]:
        pytest.skip("this machine has a GPU")
    if "FIFO" in extra:
        os.mkfifo(tmp_path / "fifo")  # reading it would block for ever
        extra = ["--data", str(tmp_path / "fifo")]
    out = tmp_path / "out"
    one_line_exit_2(capsys, call(main, [*BASE, *extra, "--out", str(out)]), *needles)
    assert not out.exists()  # no plan.csv, no scenario.toml


def test_interrupted_before_a_checkpoint_says_there_is_nothing_to_resume(tmp_path):
    from real.process.launch import INTERRUPTED, INTERRUPTED_EARLY, interrupted_note

    assert interrupted_note(tmp_path) == INTERRUPTED_EARLY and "nothing to resume" in INTERRUPTED_EARLY
    (tmp_path / "checkpoints").mkdir()
    assert interrupted_note(tmp_path) == INTERRUPTED_EARLY
    (tmp_path / "checkpoints" / "node0.pt").write_bytes(b"x")  # not a checkpoint set (real/checkpoint/ckpt_set.py)
    assert interrupted_note(tmp_path) == INTERRUPTED_EARLY
    (tmp_path / "checkpoints" / "node0" / "round-000003").mkdir(parents=True)
    (tmp_path / "checkpoints" / "node0" / "round-000003" / "manifest.json").write_text("{}")
    assert interrupted_note(tmp_path) == INTERRUPTED


@pytest.mark.parametrize("argv, needles", [
    (["--gpu-types", "a30,", "--out", "OUT"], ["--gpu-types a30,", "none empty"]),
    (["--table", "paper", "--nodes", "3", "--out", "OUT"], ["--nodes", "not used by --table"]),
    (["--table", "paper", "--gpu-types", "a30", "--out", "OUT"], ["--gpu-types", "not used by --table"]),
])
def test_sweep_options_that_were_ignored_or_accepted(tmp_path, capsys, argv, needles):
    out = tmp_path / "out"
    one_line_exit_2(capsys, sweep_main([str(out) if a == "OUT" else a for a in argv]), *needles)
    assert not out.exists()


# --- 3. validating a finished run, one from torchrun across two "machines" -----------------------------

TWO_MACHINES = """name = "two-machines"
seed = 0
[model]
preset = "tiny"
seq_len = 32
dtype = "fp32"
[training]
rounds = 2
local_steps = 2
batch_size = 2
[network]
bandwidth_gbps = 1.0
latency_ms = 1.0
[[nodes]]
name = "m0"
gpus = { "cpu" = 2 }
step_time_s = 0.05
[[nodes]]
name = "m1"
gpus = { "cpu" = 1 }
step_time_s = 0.08
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_validate_trace_of_two_torchrun_machines(tmp_path, capsys):
    """torchrun twice on this machine, --node-rank 0 (node m0, 2 processes) and 1 (m1, 1 process),
    each with its own --out, as on two machines; rank 0's --out is validated from its trace."""
    import pandas as pd

    (tmp_path / "two.toml").write_text(TWO_MACHINES)
    assert plan_main([str(tmp_path / "two.toml"), "--strategy", "baseline", "--out", str(tmp_path / "plan")]) == 0
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(ROOT)
    procs = []
    for node_rank, processes in ((0, 2), (1, 1)):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
               "--nproc-per-node", str(processes), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "real", "--plan", str(tmp_path / "plan" / "plan.csv"),
               "--scenario", str(tmp_path / "plan" / "scenario.toml"), "--out", str(tmp_path / f"machine{node_rank}"),
               "--threads", "1", "--no-progress", "--timeout-s", "120"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    run_dir = tmp_path / "machine0"
    run_files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    capsys.readouterr()
    assert validate_main(["--trace", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(run_dir / "validation" / "validation.csv")
    trace = pd.read_csv(run_dir / "trace.csv")
    assert list(table["node"]) == ["m0", "m1"] and set(table["mode"]) == {"measured"}
    measured_idle = trace.groupby("node")["idle_s"].sum()
    assert table.set_index("node")["measured_idle_s"].to_dict() == pytest.approx(measured_idle.to_dict())
    # predicted: m1's 2 × 0.08 s steps set the round, m0 idles 2 × (0.16 - 0.10) over 2 rounds
    assert table.set_index("node").at["m0", "predicted_idle_s"] == pytest.approx(0.12)
    assert table.set_index("node").at["m1", "predicted_idle_s"] == pytest.approx(0.0)
    for name in ("validation.png", "timeline.csv", "trace.json"):
        assert (run_dir / "validation" / name).stat().st_size > 0
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == run_files  # the run's own files
    table_lines = printed.split("mean loss")[0].splitlines()
    assert "largest idle error" in printed and len(table_lines) == 3 and max(map(len, table_lines)) <= 120


def test_validate_trace_bad_input(tmp_path, capsys):
    one_line_exit_2(capsys, validate_main(["--trace", str(tmp_path / "none")]), "not a directory")
    (tmp_path / "run").mkdir()
    one_line_exit_2(capsys, validate_main(["--trace", str(tmp_path / "run")]), "trace.csv not found")
    assert list((tmp_path / "run").iterdir()) == []


# --- 6. tables that fit ---------------------------------------------------------------------------------

def test_validation_table_fits_120_columns_and_wide_shows_all():
    import pandas as pd

    from formats.timeline import VALIDATION_COLUMNS
    from geodt.run_cmd import validation_table
    from geodt.validation import validation_text

    timeline = pd.DataFrame({"strategy": "baseline", "node": ["a-long-node-name", "b"], "round": 0,
                             "compute_s": [1.0, 2.0], "idle_s": [1.0, 0.0], "comm_s": 0.5, "tokens": 4096})
    trace = timeline.assign(overrun_steps=0, idle_s=[1.25, 0.0])
    table = validation_table(timeline, trace, 1.0)
    narrow = validation_text(table)
    assert max(map(len, narrow.splitlines())) <= 120 and "idle_err_%round" in narrow
    wide = validation_text(table, wide=True)
    assert all(column in wide for column in VALIDATION_COLUMNS)


@pytest.mark.parametrize("strategy", ["hybrid", "streaming", "sync-ddp", "network-aware"])
def test_plan_table_fits_120_columns_and_wide_shows_all(tmp_path, capsys, strategy):
    from formats.plan import PLAN_COLUMNS

    assert plan_main(["paper", "--strategy", strategy, "--out", str(tmp_path / "a")]) == 0
    narrow = capsys.readouterr().out
    table = narrow[narrow.index(" node "):narrow.index("(plan.csv also holds")].splitlines()
    assert len(table) == 5 and max(map(len, table)) <= 120, table
    assert plan_main(["paper", "--strategy", strategy, "--out", str(tmp_path / "b"), "--wide"]) == 0
    wide = capsys.readouterr().out
    assert all(column in wide for column in PLAN_COLUMNS if column != "strategy")


def test_simulate_says_its_token_ratio_is_the_whole_runs(tmp_path, capsys):
    """sync-ddp does the baseline's work in 100 times as many rounds: 1.000 of the run's tokens (simulate)
    and 0.010 of its tokens per round (sweep --table), each labelled for what it is."""
    assert simulate_main(["paper", "--strategy", "baseline", "sync-ddp", "--engine", "analytic",
                          "--out", str(tmp_path / "s")]) == 0
    printed = capsys.readouterr().out
    assert "run tokens/base" in printed and "tokens vs base" not in printed
    row = next(line for line in printed.splitlines() if line.startswith("sync-ddp "))
    assert row.split()[3] == "1.000"
    assert sweep_main(["--table", "paper", "--strategy", "sync-ddp", "--out", str(tmp_path / "t")]) == 0
    table = capsys.readouterr().out
    assert "tokens/round vs baseline" in table and "| sync-ddp | 0.010 |" in table


@pytest.mark.parametrize("content", ["profile of another seq_len", "not a profile"])
def test_refused_calibrate_out_leaves_no_lock_file(tmp_path, capsys, content):
    from geodt.cli import main

    out = tmp_path / "p.csv"
    if content == "not a profile":
        out.write_text("a,b\n1,2\n")
    else:
        out.write_bytes((ROOT / "profiles" / "cpu-1thread.csv").read_bytes())  # tiny at seq_len 256
    before = out.read_bytes()
    code = main(["calibrate", "device", "--model", "tiny", "--seq-len", "16", "--batch", "1", "--repeats", "1",
                 "--warmup", "0", "--out", str(out)])
    one_line_exit_2(capsys, code, str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"] and out.read_bytes() == before


def test_profile_check_names_the_statistic_it_shows(tmp_path, capsys):
    """The step-time model takes each row's mean (the median where there is none); calibrate prints
    medians, so profile check says which it shows instead of "measured"."""
    import pandas as pd

    from simulator.models.profile_check import profile_main

    source = ROOT / "profiles" / "cpu-1thread.csv"
    assert profile_main(["check", str(source)]) == 0
    assert " median_ms " in capsys.readouterr().out
    frame = pd.read_csv(source)
    frame["step_s_mean"] = 2 * frame["step_s_median"]
    frame.to_csv(tmp_path / "p.csv", index=False)
    assert profile_main(["check", str(tmp_path / "p.csv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["batch_size", "mean_ms"]
    assert float(lines[2].split()[1]) == pytest.approx(2e3 * frame["step_s_median"].iloc[0], abs=1e-3)


def test_table_accepts_how_a_sweep_runs(tmp_path):
    """--workers changes no result: accepted with --table (the README's first hour passes it)."""
    assert sweep_main(["--table", "paper", "--strategy", "A", "--workers", "1", "--out", str(tmp_path / "t")]) == 0
