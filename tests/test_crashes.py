"""Runs that start and cannot finish (issue 42, part 2): each refused before it starts, in one line,
exit status 2, nothing left behind.

- host memory: every local process priced by geodt/preflight.py's rule (the step's peak from
  simulator/models/memory.py x HOST_STEP_FACTOR + HOST_PROCESS_BYTES) against the memory available, for
  geodt run and geodt calibrate device / scenario (tested by arithmetic on a stated machine, never
  by a real out-of-memory);
- a full disk (ENOSPC, injected) in geodt simulate and geodt sweep; an unreachable --scheduler;
- --threads beyond THREADS_PER_CPU per logical CPU; a node or scenario name over MAX_NAME_BYTES
  bytes of UTF-8 (it names files); a profile CSV field over csv's 128 KiB limit;
- a calibration that fails mid-way leaves no .<profile>.lock.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from one_line import one_line_exit_2

from formats.errors import InputError
from formats.limits import MAX_NAME_BYTES, THREADS_PER_CPU, check_node_name, check_scenario_name, max_threads
from geodt.preflight import (
    HOST_PROCESS_BYTES,
    HOST_STEP_FACTOR,
    Machine,
    PreflightError,
    check_machine,
    host_process_bytes,
    process_bytes,
)
from simulator.scenario import load_scenario
from simulator.strategies import make_plan

ROOT = Path(__file__).resolve().parents[1]
MACHINE_24GB = Machine(cores=2, memory_bytes=24e9, gpu_memory_bytes=())
BUILTIN = ROOT / "simulator" / "scenarios"


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # calibrate's --threads sets torch's process-wide count
    yield
    torch.set_num_threads(threads)


# --- host memory -----------------------------------------------------------------------------------

def test_rule_covers_the_measured_rank():
    """The rule against the rank measured in geodt/preflight.py's docstring: paper/hybrid with
    model.preset=tiny (node1: batch 64, seq_len 1024, fp16) peaked at 2.15 GB resident (VmHWM).
    The rule may lie above the measurement (it also covers fp32's smaller excess), by at most 10%."""
    scenario = load_scenario("paper", ["model.preset=tiny"])
    node = make_plan(scenario, "hybrid").nodes[0]
    assert node.batch_size == 64
    step = process_bytes(scenario, node)
    assert host_process_bytes(step) == HOST_STEP_FACTOR * step + HOST_PROCESS_BYTES
    assert 2.15e9 <= host_process_bytes(step) <= 1.10 * 2.15e9


def test_paper_hybrid_tiny_is_refused_on_24_gb():
    """The fix `geodt run paper` suggests (--set model.preset=tiny) under hybrid: 16 processes of
    2.27 GB need 35.5 GB. Before, the rule took the CUDA reserve (1 GB) off a peak that holds
    none, said 13.5 GB, and the run was killed by the OOM killer a minute in."""
    scenario = load_scenario("paper", ["model.preset=tiny"])
    plan = make_plan(scenario, "hybrid")
    expected = sum(n.gpus * host_process_bytes(process_bytes(scenario, n)) for n in plan.nodes)
    assert expected == pytest.approx(35.5e9, abs=0.05e9)
    with pytest.raises(PreflightError) as info:
        check_machine(scenario, plan, "auto", MACHINE_24GB)
    message = str(info.value)
    assert "16 processes of tiny" in message and "need about 35.5 GB" in message and "24.0 GB available" in message
    assert "model.preset=tiny" not in message and "training.batch_size" in message  # it is tiny already
    assert check_machine(scenario, plan, "auto", Machine(2, 36e9, ()))  # fits: the GPU-names warning only


def test_geodt_run_refuses_before_writing(tmp_path, capsys, monkeypatch):
    import geodt.run_exec as run_exec
    from geodt.run_cmd import run_main

    monkeypatch.setattr(run_exec, "this_machine", lambda: MACHINE_24GB)  # where the run asks (its top import)
    out = tmp_path / "out"
    code = run_main(["paper", "--strategy", "hybrid", "--set", "model.preset=tiny", "--out", str(out)])
    one_line_exit_2(capsys, code, "cannot hold the run", "need about 35.5 GB", "24.0 GB available")
    assert not out.exists()


def test_calibrate_device_8b_on_cpu_is_refused(tmp_path, capsys, monkeypatch):
    """Before: 34 s, a 46-line allocator traceback and .p.csv.lock left behind."""
    import geodt.calibration.device as device
    from geodt.calibration.device import cpu_memory_problem, main

    monkeypatch.setattr(device, "available_memory_bytes", lambda: 24e9)  # where the calibration asks
    out = tmp_path / "p.csv"
    code = main(["--device", "cpu", "--model", "llama-3.1-8b", "--out", str(out)])
    one_line_exit_2(capsys, code, "--model llama-3.1-8b at batch 8", "24.0 GB available", "smaller --model")
    assert list(tmp_path.iterdir()) == []
    assert cpu_memory_problem(["--device", "cpu", "--model", "tiny", "--out", str(out)], 24e9) is None
    # auto prices its first batch (larger ones are measured as out-of-memory rows)
    auto = cpu_memory_problem(["--device", "cpu", "--model", "llama-3.1-8b", "--batch", "auto", "--out", str(out)], 24e9)
    assert "at batch 1," in auto


def test_calibrate_scenario_prices_every_device(tmp_path):
    from geodt.calibration.scenario import memory_problem

    paper = load_scenario("paper", ["model.preset=tiny"], without_profiles=True)
    problem = memory_problem(paper, [1, 64], available_bytes=24e9)
    assert "16 device processes of tiny at batch 64" in problem and "24.0 GB available" in problem
    assert memory_problem(load_scenario("hetero-cpu", without_profiles=True), [1, 2, 4, 8], 24e9) is None


def test_a_failed_calibration_leaves_no_lock(tmp_path, monkeypatch):
    import calibrate.harness as harness
    from calibrate.cli import calibrate_main

    def broken(self, batch):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(harness.Calibrator, "measure", broken)
    out = tmp_path / "p.csv"
    with pytest.raises(RuntimeError, match="injected"):
        calibrate_main(["--device", "cpu", "--model", "tiny", "--seq-len", "16", "--batch", "1", "--threads", "1",
                        "--out", str(out)])
    assert not (tmp_path / ".p.csv.lock").exists()


# --- disk: simulate and sweep ------------------------------------------------------------------------

def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_simulate_on_a_full_disk(tmp_path, capsys, monkeypatch):
    import simulator.outputs.run_outputs as run_outputs
    from simulator.cli import simulate_main

    monkeypatch.setattr(run_outputs.TableWriter, "write", _enospc)
    out = tmp_path / "sim"
    code = simulate_main(["hetero-cpu", "--strategy", "baseline", "--out", str(out)])
    one_line_exit_2(capsys, code, f"--out {out}", "No space left on device", "nothing was replaced")
    assert list(tmp_path.iterdir()) == []  # the stage is gone


def test_simulate_parquet_failure_prints_nothing_more(tmp_path, capsys, monkeypatch):
    """A Parquet writer that failed is abandoned: its finaliser does not write and complain again."""
    import gc

    import pyarrow.parquet as pq

    from simulator.cli import simulate_main

    real_write = pq.ParquetWriter.write_table
    calls = []

    def fail_second(self, table, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", fail_second)
    monkeypatch.setattr(pq.ParquetWriter, "close", _enospc)
    code = simulate_main(["hetero-cpu", "--out", str(tmp_path / "sim")])
    monkeypatch.undo()
    gc.collect()
    one_line_exit_2(capsys, code, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_sweep_on_a_full_disk(tmp_path, capsys, monkeypatch):
    import simulator.outputs.outputs as outputs
    import simulator.sweep.sweep_cli as sweep_cli
    from simulator.sweep.sweep_cli import main

    # the chunks' writes (sweep_cli binds write_bytes at import) and every later one
    monkeypatch.setattr(outputs, "write_bytes", _enospc)
    monkeypatch.setattr(sweep_cli, "write_bytes", _enospc)
    out = tmp_path / "sweep"
    code = main(["--out", str(out), "--samples", "4", "--bandwidth-gbps", "1", "--strategy", "baseline",
                 "--workers", "1", "--no-figures"])
    one_line_exit_2(capsys, code, f"--out {out}", "No space left on device")
    leftovers = [p for p in out.rglob("*") if p.is_file() and p.name != "spec.json"]
    assert leftovers == []  # no part half-written


def test_sweep_unreachable_scheduler(tmp_path, capsys, monkeypatch):
    """Before: a 56-line traceback after 30 s, and spec.json left in --out."""
    pytest.importorskip("dask.distributed")
    import simulator.sweep.sweep_cluster as sweep_cluster
    from simulator.sweep.sweep_cli import main

    monkeypatch.setattr(sweep_cluster, "CONNECT_TIMEOUT_S", 1)
    out = tmp_path / "sweep"
    code = main(["--out", str(out), "--samples", "4", "--bandwidth-gbps", "1", "--strategy", "baseline",
                 "--scheduler", "tcp://127.0.0.1:9"])
    one_line_exit_2(capsys, code, "--scheduler tcp://127.0.0.1:9: cannot reach a Dask scheduler")
    assert not out.exists()


# --- --threads ------------------------------------------------------------------------------------

def test_threads_are_bounded(tmp_path, capsys):
    from calibrate.cli import calibrate_main
    from geodt.run_cmd import run_main
    from real.core.options import ExecOptions

    assert max_threads() == THREADS_PER_CPU * (os.cpu_count() or 1)
    with pytest.raises(ValueError, match="--threads: expected 0 \\(auto\\) or 1 to"):
        ExecOptions(out_dir=str(tmp_path), threads=100000)
    assert ExecOptions(out_dir=str(tmp_path), threads=max_threads()).threads == max_threads()
    out = tmp_path / "run"
    code = run_main(["hetero-cpu", "--strategy", "baseline", "--threads", "100000", "--out", str(out)])
    one_line_exit_2(capsys, code, "--threads", "got 100000")
    assert not out.exists()
    profile = tmp_path / "p.csv"
    code = calibrate_main(["--device", "cpu", "--model", "tiny", "--seq-len", "16", "--batch", "1",
                           "--threads", "100000", "--out", str(profile)])
    one_line_exit_2(capsys, code, "--threads", "got 100000")
    assert list(tmp_path.iterdir()) == []


def test_calibrate_scenario_threads_bounded(tmp_path, capsys):
    from geodt.calibration.scenario import main

    code = main(["--scenario", "hetero-cpu", "--threads", "100000", "--out-dir", str(tmp_path)])
    one_line_exit_2(capsys, code, "--threads", "got 100000")
    assert list(tmp_path.iterdir()) == []


# --- names and CSV fields ----------------------------------------------------------------------------

def test_names_are_limited_in_bytes(tmp_path):
    """200 'é' are 200 characters but 400 bytes: calibrate scenario's DIR/<node>-<j>.csv would pass
    NAME_MAX (255 bytes) and fail with ENAMETOOLONG after the measuring."""
    assert check_node_name("é" * 200) is not None and "bytes in UTF-8" in check_node_name("é" * 200)
    assert check_scenario_name("é" * 200) is not None
    widest = "é" * (MAX_NAME_BYTES // 2)
    assert check_node_name(widest) is None and check_scenario_name(widest) is None
    (tmp_path / f"{widest}-999.csv").write_text("")  # the longest file names a name makes still fit
    (tmp_path / f".{widest}-999.csv.lock").write_text("")
    (tmp_path / widest).mkdir()
    toml = (BUILTIN / "hetero-cpu.toml").read_text().replace('name = "fast"', f'name = "{"é" * 200}"')
    (tmp_path / "s.toml").write_text(toml)
    with pytest.raises(InputError, match="bytes in UTF-8"):
        load_scenario(str(tmp_path / "s.toml"))


def test_profile_field_over_csv_limit(tmp_path, capsys):
    from formats.profile import ProfileError, read_profile_frame
    from simulator.models.profile_check import profile_main

    source = next(p for p in sorted((ROOT / "profiles").rglob("*.csv")))
    lines = source.read_text().splitlines(keepends=True)
    cells = lines[1].split(",")
    cells[0] = '"' + "x" * (200 << 10) + '"'
    path = tmp_path / "p.csv"
    path.write_text(lines[0] + ",".join(cells) + "".join(lines[2:]))
    with pytest.raises(ProfileError, match="field larger than field limit"):
        read_profile_frame(path)
    one_line_exit_2(capsys, profile_main(["check", str(path)]), "p.csv", "field larger than field limit")
