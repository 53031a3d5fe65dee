"""`geodt calibrate` on CPU end to end: the profile file, resume, injected OOM, bad inputs.

Runs in-process on the `tiny` model at a short sequence with few repeats, so it stays fast;
timings are only checked for being positive (they are measurements on a shared machine).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import calibrate.harness as harness
from calibrate.cli import calibrate_main
from formats.profile import COLUMNS
from simulator.models.profile_check import profile_main
from simulator.models.profile_fit import ProfileModel

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--device", "cpu", "--model", "tiny", "--seq-len", "16", "--repeats", "2", "--warmup", "1",
        "--threads", "1"]


@pytest.fixture(autouse=True)
def _restore_threads():
    # --threads sets torch's process-wide thread count: give other tests theirs back.
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def read(path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def test_cpu_end_to_end(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "2,1,4", "--out", str(out)]) == 0
    frame = read(out)
    assert tuple(frame.columns) == COLUMNS
    assert list(frame["batch_size"]) == ["1", "2", "4"]
    assert set(frame["gpu_key"]) == {"cpu"} and set(frame["dtype"]) == {"fp32"}
    assert set(frame["oom"]) == {"false"} and set(frame["repeats"]) == {"2"}
    assert set(frame["device_name"]) == {f"{harness.cpu_name()} (1 thread)"}
    for column in ("sm_util_pct", "mem_util_pct", "power_w", "peak_mem_bytes", "mem_total_bytes"):
        assert set(frame[column]) == {""}  # nothing to sample on CPU
    times = frame[["step_s_p10", "step_s_median", "step_s_p90"]].astype(float)
    assert (times > 0).all().all()
    assert (times["step_s_p10"] <= times["step_s_median"]).all()
    assert (times["step_s_median"] <= times["step_s_p90"]).all()
    tokens = frame["batch_size"].astype(int) * 16 / frame["step_s_median"].astype(float)
    assert tokens.tolist() == pytest.approx(frame["tokens_per_s"].astype(float).tolist())
    model = ProfileModel.from_csv(out, seq_len=16, dtype="fp32", model="tiny")
    assert model.measured_batches == (1, 2, 4) and model.max_batch() is None
    printed = capsys.readouterr().out
    assert "step_ms" in printed and "tokens/s" in printed
    assert profile_main(["check", str(out)]) == 0
    assert "leave-one-out |error|: median" in capsys.readouterr().out


def test_rerun_measures_only_missing_batches(tmp_path, monkeypatch):
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "1,2", "--out", str(out)]) == 0
    first = read(out)
    measured = []
    real_measure = harness.Calibrator.measure
    monkeypatch.setattr(harness.Calibrator, "measure",
                        lambda self, b: measured.append(b) or real_measure(self, b))
    assert calibrate_main(FAST + ["--batch", "1,2,4", "--out", str(out)]) == 0
    assert measured == [4]
    second = read(out)
    assert list(second["batch_size"]) == ["1", "2", "4"]
    pd.testing.assert_frame_equal(second.iloc[:2], first)  # old rows kept byte for byte
    measured.clear()
    assert calibrate_main(FAST + ["--batch", "1,2,4", "--out", str(out)]) == 0
    assert measured == [] and len(read(out)) == 3


def test_interrupted_run_keeps_rows_and_rerun_finishes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "p.csv"
    real_measure = harness.Calibrator.measure

    def interrupt_at_4(self, batch):
        if batch == 4:
            raise KeyboardInterrupt
        return real_measure(self, batch)

    monkeypatch.setattr(harness.Calibrator, "measure", interrupt_at_4)
    assert calibrate_main(FAST + ["--batch", "1,2,4,8", "--out", str(out)]) == 130
    assert "rerun the same command" in capsys.readouterr().err
    assert list(read(out)["batch_size"]) == ["1", "2"]
    assert not [p for p in tmp_path.iterdir() if p.name != "p.csv"]  # no temp files left
    monkeypatch.setattr(harness.Calibrator, "measure", real_measure)
    assert calibrate_main(FAST + ["--batch", "1,2,4,8", "--out", str(out)]) == 0
    assert list(read(out)["batch_size"]) == ["1", "2", "4", "8"]


def test_refuses_file_of_another_profile(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "1", "--out", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    for change in (["--seq-len", "32"], ["--dtype", "bf16"], ["--model", "llama-60m"], ["--threads", "2"]):
        assert calibrate_main(FAST + change + ["--batch", "1,2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(out) in err and "expected" in err
    assert out.read_bytes() == before


def _inject_oom(monkeypatch, limit: int) -> list[int]:
    """Make every step above `limit` samples raise torch.OutOfMemoryError; log batches tried."""
    real_step = harness.train_step
    tried: list[int] = []

    def step(model, optimizer, batch, dtype, scaler=None, scheduler=None):
        if batch.shape[0] > limit:
            raise torch.OutOfMemoryError(f"injected: {batch.shape[0]} > {limit}")
        return real_step(model, optimizer, batch, dtype, scaler, scheduler)

    real_measure = harness.Calibrator.measure
    monkeypatch.setattr(harness, "train_step", step)
    monkeypatch.setattr(harness.Calibrator, "measure", lambda self, b: tried.append(b) or real_measure(self, b))
    return tried


def test_auto_search_with_injected_oom(tmp_path, monkeypatch, capsys):
    tried = _inject_oom(monkeypatch, limit=13)
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "auto", "--max-batch", "64", "--out", str(out)]) == 0
    assert tried == [1, 2, 4, 8, 16, 12, 14, 13]  # double to the first OOM, then bisect
    assert "largest batch that fits: 13" in capsys.readouterr().out
    frame = read(out)
    assert list(frame["batch_size"]) == ["1", "2", "4", "8", "16", "12", "14", "13"]
    ooms = frame[frame["oom"] == "true"]
    assert list(ooms["batch_size"]) == ["16", "14"]
    assert set(ooms["step_s_median"]) == {""} and set(ooms["tokens_per_s"]) == {""}
    model = ProfileModel.from_csv(out)
    assert model.max_batch() == 13 and model.fits(13) and not model.fits(14)
    # a rerun replays the search from the file: nothing is measured again
    tried.clear()
    assert calibrate_main(FAST + ["--batch", "auto", "--max-batch", "64", "--out", str(out)]) == 0
    assert tried == [] and len(read(out)) == 8


def test_auto_search_oom_at_start_and_cap(tmp_path, monkeypatch):
    tried = _inject_oom(monkeypatch, limit=2)
    assert calibrate_main(FAST + ["--batch", "auto:8", "--out", str(tmp_path / "a.csv")]) == 0
    assert tried == [8, 4, 2, 3]
    monkeypatch.undo()
    tried = _inject_oom(monkeypatch, limit=1000)
    assert calibrate_main(FAST + ["--batch", "auto", "--max-batch", "6", "--out", str(tmp_path / "b.csv")]) == 0
    assert tried[-4:] == [1, 2, 4, 6]  # CPU: stops at --max-batch, the cap itself measured


@pytest.mark.parametrize("limit, max_batch", [(0, 64), (1, 64), (5, 64), (63, 64), (64, 64), (100, 64),
                                              (7, 7), (200, 100)])
def test_auto_search_finds_largest(limit, max_batch):
    tried = []
    found = harness.auto_search(lambda b: tried.append(b) or b <= limit, 1, max_batch)
    assert found == (min(limit, max_batch) or None)
    assert len(tried) == len(set(tried))  # no batch tried twice


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device 'tpu'"),
    (["--device", "cuda:0"], "--device cuda:0"),
    (["--device", "all"], "--device all"),
    (["--batch", "1,x"], "--batch '1,x'"),
    (["--batch", "0,2"], "--batch '0,2'"),
    (["--batch", ""], "--batch ''"),
    (["--batch", "auto:0"], "--batch 'auto:0'"),
    (["--batch", "auto:128"], "starts above --max-batch 64"),
    (["--model", "llama-7b"], "unknown model preset 'llama-7b'"),
    (["--model", "missing.json"], "missing.json: model config file not found"),
    (["--repeats", "0"], "--repeats"),
    (["--dtype", "int8"], "--dtype"),
    (["--bogus"], "--bogus"),
    (["--batch", "\u00b2"], "--batch '\u00b2'"),  # str.isdigit() is true for a superscript two; int() is not
    (["--batch", "auto:\u00b2"], "--batch 'auto:\u00b2'"),
    (["--batch", "100000000"], "--batch 100000000: above --max-batch 64 (the default on CPU)"),
    (["--batch", "8", "--max-batch", "4"], "--batch 8: above --max-batch 4;"),
    (["--repeats", "\u00b2"], "--repeats"),
])
def test_bad_inputs(tmp_path, capsys, args, message):
    if args[:2] in (["--device", "cuda:0"], ["--device", "all"]) and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "1", "--out", str(out)] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value, message", [
    ("[1, 2]", "expected an integer from 1 to"), ('"abc"', "expected an integer from 1 to"),
    ("null", "expected an integer from 1 to"), ("1e999", "expected an integer from 1 to"),
    ("true", "expected an integer from 1 to"), ("64.5", "expected an integer from 1 to"),
    ("NaN", "not a readable JSON model config"),
])
def test_malformed_config_json_values_are_one_line(tmp_path, capsys, value, message):
    config = tmp_path / "m.json"
    config.write_text(f'{{"hidden_size": {value}, "num_hidden_layers": 2, "num_attention_heads": 2, '
                      '"intermediate_size": 128, "vocab_size": 256}')
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "1", "--model", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not out.exists()


def test_config_json_that_is_a_fifo_is_refused_unread(tmp_path, capsys):
    import os

    os.mkfifo(tmp_path / "m.json")  # opening it to read would block forever
    assert calibrate_main(FAST + ["--batch", "1", "--model", str(tmp_path / "m.json"),
                                  "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m.json: not a regular file" in err


def test_config_json_not_utf8_is_one_line(tmp_path, capsys):
    config = tmp_path / "m.json"
    config.write_bytes(b'{"hidden_size": "\xff"}')
    assert calibrate_main(FAST + ["--batch", "1", "--model", str(config), "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not UTF-8" in err


def test_allocator_failure_on_cpu_is_an_oom_row(tmp_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 1099511627776 bytes. Error code 12")

    monkeypatch.setattr(harness, "train_step", no_memory)
    out = tmp_path / "p.csv"
    assert calibrate_main(FAST + ["--batch", "2", "--out", str(out)]) == 0
    frame = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(frame["oom"]) == ["true"] and list(frame["step_s_median"]) == [""]


def test_another_runtime_error_is_not_taken_for_an_oom():
    assert harness.is_allocator_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not harness.is_allocator_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_unwritable_outputs(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    for out, message in ((tmp_path / "afile" / "p.csv", "does not exist"),
                         (tmp_path / "nodir" / "p.csv", "does not exist"),
                         (tmp_path / "adir", "not a regular file")):
        assert calibrate_main(FAST + ["--batch", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and str(out) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]
    assert list((tmp_path / "adir").iterdir()) == []


def test_garbage_existing_file_is_refused(tmp_path, capsys):
    out = tmp_path / "p.csv"
    out.write_text("a,b\n1,2\n")
    assert calibrate_main(FAST + ["--batch", "1", "--out", str(out)]) == 2
    assert "column 'device_name' missing" in capsys.readouterr().err
    assert out.read_text() == "a,b\n1,2\n"


def test_profile_check_errors(tmp_path, capsys):
    assert profile_main(["check", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert profile_main(["frobnicate"]) == 2


def test_python_m_calibrate_bad_input_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "calibrate", "--model", "nope", "--out", str(tmp_path / "p.csv")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nope" in proc.stderr


@pytest.mark.parametrize("name, key", [("NVIDIA GeForce RTX 3090", "rtx-3090"),
                                       ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"),
                                       ("NVIDIA A30", "a30"), ("NVIDIA TITAN RTX", "titan-rtx"),
                                       ("Some Unknown Accelerator", "")])
def test_gpu_key_from_catalog(name, key):
    assert harness.gpu_key_for(name) == key


def test_gpu_key_prefers_most_specific():
    keys = ["v100", "v100-pcie", "rtx-3090", "rtx-3090-ti"]
    assert harness.gpu_key_for("Tesla V100-PCIE-16GB", keys) == "v100-pcie"
    assert harness.gpu_key_for("Tesla V100-SXM2-32GB", keys) == "v100"
    assert harness.gpu_key_for("NVIDIA GeForce RTX 3090 Ti", keys) == "rtx-3090-ti"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profile(tmp_path):
    out = tmp_path / "p.csv"
    dtype = "bf16" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16"
    assert calibrate_main(["--device", "cuda:0", "--model", "tiny", "--seq-len", "128", "--repeats", "5",
                           "--dtype", dtype, "--batch", "1,4", "--out", str(out)]) == 0
    frame = read(out)
    assert set(frame["dtype"]) == {dtype} and set(frame["device_index"]) == {"0"}
    assert frame["gpu_key"].iloc[0] == harness.gpu_key_for(torch.cuda.get_device_name(0))
    assert (frame["peak_mem_bytes"].astype(float) > 0).all()
    assert (frame["mem_total_bytes"].astype(float) > frame["peak_mem_bytes"].astype(float)).all()
    assert frame["cuda_version"].iloc[0] == torch.version.cuda
    model = ProfileModel.from_csv(out)
    assert model.peak_mem_bytes(4) >= model.peak_mem_bytes(1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_real_oom_is_recorded(tmp_path):
    # llama-1b at seq 4096 and batch 4096 cannot fit on any current GPU.
    out = tmp_path / "p.csv"
    assert calibrate_main(["--device", "cuda:0", "--model", "llama-1b", "--seq-len", "4096", "--repeats", "1",
                           "--warmup", "0", "--dtype", "fp16", "--batch", "4096", "--out", str(out)]) == 0
    assert list(read(out)["oom"]) == ["true"]
    import gc

    gc.collect()
    assert torch.cuda.memory_allocated(0) < 2 ** 30  # nothing of the run (or its OOM) is left


def test_all_devices_get_one_file_each():
    from calibrate.profile_writer import out_paths

    assert out_paths(Path("d/p.csv"), ["cuda:0", "cuda:1"]) == [Path("d/p-cuda0.csv"), Path("d/p-cuda1.csv")]
    assert out_paths(Path("d/p.csv"), ["cpu"]) == [Path("d/p.csv")]


def test_noisy_batches_are_flagged():
    from calibrate.device_run import _noisy_batches

    rows = [{"batch_size": "1", "step_s_p10": "0.1", "step_s_p90": "0.11"},
            {"batch_size": "2", "step_s_p10": "0.1", "step_s_p90": "0.2"},
            {"batch_size": "4", "step_s_p10": "", "step_s_p90": ""}]
    assert _noisy_batches(rows) == [2]


def test_fp16_scaler_survives_an_oom_mid_step(monkeypatch):
    from facts.presets import PRESETS

    real_step = harness.train_step

    def step(model, optimizer, batch, dtype, scaler=None, scheduler=None):
        if batch.shape[0] > 2:  # OOM after the scaler has unscaled: its state is mid-step
            scaler.scale(model(input_ids=batch, labels=batch).loss).backward()
            scaler.unscale_(optimizer)
            raise torch.OutOfMemoryError("injected")
        return real_step(model, optimizer, batch, dtype, scaler, scheduler)

    monkeypatch.setattr(harness, "train_step", step)
    cal = harness.Calibrator(PRESETS["tiny"], 8, "fp16", "cpu", repeats=1, warmup=0)
    assert cal.measure(4).oom
    assert all(p.grad is None for p in cal.model.parameters())
    after = cal.measure(2)
    assert not after.oom and len(after.times_s) == 1


@pytest.mark.parametrize("extra", [["--cpu-cores", "0"], ["--cpu-quota", "0.5", "--cpu-cores", "0"]])
def test_cpu_limits_are_applied_and_named_in_the_profile(tmp_path, extra):
    from train.cpulimit import cpu_quota_supported

    if "--cpu-quota" in extra and not cpu_quota_supported():
        pytest.skip("needs root and a cgroup cpu controller")
    out = tmp_path / "p.csv"
    proc = subprocess.run([sys.executable, "-m", "geodt", "calibrate", "device", "--device", "cpu", "--model", "tiny",
                           "--seq-len", "16", "--batch", "1", "--repeats", "2", "--warmup", "0", "--threads", "1",
                           *extra, "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    name = pd.read_csv(out)["device_name"].iloc[0]
    assert name.endswith(", cores 0)")
    assert ("quota 0.5 cores" in name) == ("--cpu-quota" in extra)


@pytest.mark.parametrize("extra, expected", [
    (["--cpu-quota", "0"], "--cpu-quota: expected a share of cores in [0.01, 1024]"),
    (["--cpu-cores", "a,1"], "--cpu-cores: expected comma-separated core indices"),
    (["--cpu-cores", "0", "--device", "cuda:0"], None),
])
def test_bad_cpu_limits_are_one_line(tmp_path, capsys, extra, expected):
    from calibrate.cli import calibrate_main

    assert calibrate_main(["--model", "tiny", *extra, "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and (expected is None or expected in err)
    assert not (tmp_path / "p.csv").exists()


def test_calibrate_help_lists_every_mode_and_its_options(capsys):
    from geodt.cli import main

    assert main(["calibrate", "--help"]) == 0
    out = capsys.readouterr().out
    for mode in ("device", "network", "scenario"):
        assert f"\n  {mode} " in out, mode
    for usage in ("geodt calibrate device [-h]", "geodt calibrate network [-h]",
                  "geodt calibrate network --wan shaped [-h]", "geodt calibrate scenario [-h]"):
        assert usage in out, usage


def test_old_spelling_runs_its_mode_with_a_note(tmp_path, capsys):
    from geodt.cli import main

    # --model nope fails in the device mode's own check: the old spelling reached `device`
    assert main(["calibrate", "--model", "nope", "--out", str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("geodt calibrate: note: this spelling is now `geodt calibrate device ...`")
    assert len(err) == 2 and "nope" in err[1]
    assert main(["calibrate", "frobnicate"]) == 2
    assert "unknown mode 'frobnicate'" in capsys.readouterr().err
