"""ProfileModel and leave_one_out on synthetic profiles: exact numbers (the model is deterministic)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.profile_writer import ProfileWriter, write_new_profile
from formats.profile import COLUMNS, ProfileError
from simulator.models.profile_fit import ProfileModel, leave_one_out

ROOT = Path(__file__).resolve().parents[1]
# seq 128: the step times below are ones an RTX 3090 could measure (check_step_units)
IDENTITY = {"device_name": "NVIDIA GeForce RTX 3090", "device_index": 0, "gpu_key": "rtx-3090",
            "model": "llama-150m", "seq_len": 128, "dtype": "bf16"}


def row(batch, step_s=None, mem=None, oom=False, total=24e9):
    values = dict.fromkeys(COLUMNS)
    values.update(IDENTITY)
    values.update(batch_size=batch, step_s_median=step_s, step_s_p10=step_s, step_s_p90=step_s,
                  repeats=None if oom else 5, peak_mem_bytes=mem, mem_total_bytes=total, oom=oom,
                  tokens_per_s=None if oom else batch * 128 / step_s)
    return values


def write(path, rows):
    writer = ProfileWriter(path, IDENTITY)
    for r in rows:
        writer.append(r)
    writer.close()
    return path


def test_a_row_cut_mid_line_is_refused_by_readers_and_remeasured_by_the_writer(tmp_path, capsys):
    path = write(tmp_path / "p.csv", [row(1, 0.1), row(2, 0.2)])
    text = path.read_text()
    path.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 1] + text.splitlines()[-1][:25])  # last row cut
    with pytest.raises(ProfileError, match=r"row 2: .* cut mid-write"):
        ProfileModel.from_csv(path)
    writer = ProfileWriter(path, IDENTITY)
    assert "the last row was cut mid-line" in capsys.readouterr().err
    assert sorted(writer.measured()) == [1]  # batch 2 is missing again: calibrate remeasures it
    writer.append(row(2, 0.25))
    writer.close()
    assert ProfileModel.from_csv(path).measured_step_s() == {1: 0.1, 2: 0.25}


def test_two_writers_of_one_profile_the_second_fails_in_one_line(tmp_path):
    first = ProfileWriter(tmp_path / "p.csv", IDENTITY)
    with pytest.raises(ProfileError, match="another geodt calibrate is writing this profile"):
        ProfileWriter(tmp_path / "p.csv", IDENTITY)
    first.close()
    second = ProfileWriter(tmp_path / "p.csv", IDENTITY)  # free again once the first is done
    second.close()
    assert not list(tmp_path.iterdir())  # the lock file goes with the lock


@pytest.mark.parametrize("make", ["fifo", "dir", "huge"])
def test_a_profile_that_is_not_a_small_regular_file_is_refused_unread(tmp_path, make):
    import os

    path = tmp_path / "p.csv"
    if make == "fifo":
        os.mkfifo(path)  # reading it would block forever
    elif make == "dir":
        path.mkdir()
    else:
        with open(path, "wb") as handle:
            handle.truncate(65 << 20)  # sparse: 65 MiB of zeros
    with pytest.raises(ProfileError, match=r"not a regular file|bytes; expected"):
        ProfileModel.from_csv(path)


@pytest.fixture
def curved(tmp_path):
    # Not affine: t = 0.01 + 0.002 b + 0.0001 b^2, memory 1e9 + 2e8 b; OOM from 40.
    rows = [row(b, 0.01 + 0.002 * b + 1e-4 * b * b, 1e9 + 2e8 * b) for b in (1, 2, 4, 8, 16)]
    rows += [row(40, oom=True), row(64, oom=True)]
    return ProfileModel.from_csv(write(tmp_path / "p.csv", rows))


def test_exact_at_measured_and_linear_between(curved):
    assert curved.measured_batches == (1, 2, 4, 8, 16)
    for b in curved.measured_batches:
        assert curved.step_s(b) == pytest.approx(0.01 + 0.002 * b + 1e-4 * b * b, rel=1e-12)
    t8, t16 = curved.step_s(8), curved.step_s(16)
    assert curved.step_s(12) == pytest.approx((t8 + t16) / 2, rel=1e-12)
    assert curved.step_s(10) == pytest.approx(t8 + (t16 - t8) * 2 / 8, rel=1e-12)


def test_extrapolates_by_least_squares_fit(curved):
    xs = np.array([1, 2, 4, 8, 16.0])
    ys = 0.01 + 0.002 * xs + 1e-4 * xs * xs
    slope, intercept = np.polyfit(xs, ys, 1, w=1 / ys)  # relative least squares
    assert curved.fit() == pytest.approx((intercept, slope), rel=1e-9)
    assert curved.step_s(32) == pytest.approx(intercept + slope * 32, rel=1e-9)
    assert curved.step_s(100) == pytest.approx(intercept + slope * 100, rel=1e-9)


def test_below_smallest_uses_fit_and_stays_positive(tmp_path):
    # Exactly affine points: the fit is the line itself, so below the data too.
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", [row(b, 0.05 + 0.01 * b) for b in (4, 8, 16)]))
    assert model.fit() == pytest.approx((0.05, 0.01), rel=1e-9)
    assert model.step_s(1) == pytest.approx(0.06, rel=1e-9)
    # A negative fixed cost would give t(1) <= 0: the smallest point is scaled instead.
    model = ProfileModel.from_csv(write(tmp_path / "q.csv", [row(b, -0.05 + 0.01 * b) for b in (8, 16)]))
    assert model.step_s(2) == pytest.approx(0.03 * 2 / 8, rel=1e-9)


def test_single_point_is_proportional(tmp_path):
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", [row(4, 0.2)]))
    assert model.fit() == (0.0, 0.05)
    assert model.step_s(4) == 0.2 and model.step_s(8) == pytest.approx(0.4)


def test_memory_model_and_limits(curved):
    assert curved.mem_total_bytes == 24e9
    assert curved.peak_mem_bytes(8) == pytest.approx(1e9 + 1.6e9)
    assert curved.peak_mem_bytes(12) == pytest.approx(1e9 + 2.4e9)
    assert curved.peak_mem_bytes(30) == pytest.approx(1e9 + 6e9)  # affine data: fit is exact
    assert curved.fits(16) and curved.fits(39)
    assert not curved.fits(40) and not curved.fits(50)
    # memory stays under 24 GB up to b = 115, so the OOM row is the bound
    assert curved.max_batch() == 39


def test_memory_total_bounds_without_oom_rows(tmp_path):
    rows = [row(b, 0.01 * b, 1e9 + 2e8 * b, total=5.1e9) for b in (1, 2, 4, 8)]
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", rows))
    assert model.fits(20) and not model.fits(21)  # 5.0e9 and 5.2e9 against 5.1e9
    assert model.max_batch() == 20


def test_cpu_profile_is_unbounded(tmp_path):
    rows = [row(b, 0.01 * b, None, total=None) for b in (1, 2, 4)]
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", rows))
    assert model.peak_mem_bytes(2) is None and model.mem_total_bytes is None
    assert model.fits(10_000) and model.max_batch() is None


def test_oom_without_memory_model_bounds_at_largest_measured(tmp_path):
    rows = [row(1, 0.1, total=None), row(2, 0.2, total=None), row(8, oom=True, total=None)]
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", rows))
    assert model.max_batch() == 2 and model.fits(7) and not model.fits(8)


def test_leave_one_out_figures(tmp_path):
    times = {1: 0.10, 2: 0.12, 4: 0.20, 8: 0.40}
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", [row(b, t) for b, t in times.items()]))
    table = leave_one_out(model)
    assert list(table["batch_size"]) == [1, 2, 4, 8]
    by_batch = table.set_index("batch_size")
    # inner points: linear interpolation of their neighbours
    assert by_batch.loc[2, "predicted_s"] == pytest.approx(0.10 + (0.20 - 0.10) / 3, rel=1e-12)
    assert by_batch.loc[4, "predicted_s"] == pytest.approx(0.12 + (0.40 - 0.12) * 2 / 6, rel=1e-12)
    # end points: least-squares fit of the other three
    slope, icpt = np.polyfit([2, 4, 8], [0.12, 0.20, 0.40], 1, w=1 / np.array([0.12, 0.20, 0.40]))
    assert by_batch.loc[1, "predicted_s"] == pytest.approx(icpt + slope, rel=1e-9)
    slope, icpt = np.polyfit([1, 2, 4], [0.10, 0.12, 0.20], 1, w=1 / np.array([0.10, 0.12, 0.20]))
    assert by_batch.loc[8, "predicted_s"] == pytest.approx(icpt + 8 * slope, rel=1e-9)
    expected = 100 * (by_batch["predicted_s"] - by_batch["measured_s"]) / by_batch["measured_s"]
    assert np.allclose(by_batch["error_pct"], expected)
    # the frame form gives the same table
    frame = pd.read_csv(tmp_path / "p.csv", dtype=str, keep_default_na=False)
    pd.testing.assert_frame_equal(leave_one_out(frame), table)


def test_leave_one_out_exact_on_affine_profile(tmp_path):
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", [row(b, 0.03 + 0.02 * b) for b in (1, 2, 4, 8, 16)]))
    assert np.abs(leave_one_out(model)["error_pct"]).max() < 1e-9


@pytest.mark.parametrize("kwargs, column", [({"seq_len": 512}, "seq_len"), ({"dtype": "fp32"}, "dtype"),
                                            ({"model": "llama-60m"}, "model")])
def test_mismatch_with_scenario_is_an_error(tmp_path, kwargs, column):
    path = write(tmp_path / "p.csv", [row(1, 0.1)])
    with pytest.raises(ProfileError, match=rf"p.csv: column '{column}'"):
        ProfileModel.from_csv(path, **kwargs)
    assert ProfileModel.from_csv(path, seq_len=128, dtype="bf16", model="llama-150m").step_s(1) == 0.1


def test_missing_file_names_path(tmp_path):
    with pytest.raises(ProfileError, match=r"nope.csv: file not found"):
        ProfileModel.from_csv(tmp_path / "nope.csv")


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.drop(columns=["power_w"]), "column 'power_w' missing"),
    (lambda f: f.assign(extra=1), "column 'extra' unknown"),
    (lambda f: f.assign(step_s_median=["0.1", "x"]), r"row 2 step_s_median: 'x'; expected a number"),
    (lambda f: f.assign(step_s_median=["0.1", "-1"]), "row 2 step_s_median"),
    (lambda f: f.assign(batch_size=["1", "1"]), "row 2 batch_size: 1 appears twice"),
    (lambda f: f.assign(batch_size=["1", "0"]), "row 2 batch_size"),
    (lambda f: f.assign(oom=["false", "maybe"]), "row 2 oom"),
    (lambda f: f.assign(dtype=["bf16", "fp32"]), "column 'dtype' holds"),
    (lambda f: f.assign(oom=["true", "false"], step_s_median=["", "0.2"]), "column 'oom'"),
    (lambda f: f.assign(oom=["true", "true"]), "no batch ran without OOM"),
])
def test_bad_profiles(tmp_path, edit, message):
    path = write(tmp_path / "p.csv", [row(1, 0.1), row(2, 0.2)])
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    edit(frame).to_csv(path, index=False)
    with pytest.raises(ProfileError, match=message):
        ProfileModel.from_csv(path)


def test_profiles_module_is_torch_free():
    code = "import sys, simulator.models.profile_fit, calibrate.profile_writer; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


@pytest.mark.parametrize("name, threads", [("cpu-1thread.csv", "1 thread"), ("cpu-2threads.csv", "2 threads")])
def test_committed_cpu_profiles_are_valid(name, threads):
    model = ProfileModel.from_csv(ROOT / "profiles" / name, seq_len=256, dtype="fp32", model="tiny")
    assert model.gpu_key == "cpu" and model.device_name.endswith(f"({threads})")
    assert model.measured_batches == (1, 2, 4, 8, 16, 32)
    assert model.max_batch() is None and model.peak_mem_bytes(4) is None
    assert len(leave_one_out(model)) == 6


def test_committed_two_thread_profile_is_faster_at_large_batches():
    # The scenario built on these files needs two unequal nodes; check the data says so.
    one = ProfileModel.from_csv(ROOT / "profiles" / "cpu-1thread.csv")
    two = ProfileModel.from_csv(ROOT / "profiles" / "cpu-2threads.csv")
    assert all(two.step_s(b) < one.step_s(b) for b in (8, 16, 32))


def test_written_profile_has_umask_permissions(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        path = write(tmp_path / "p.csv", [row(1, 0.1)])
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]


def test_fit_is_relative_so_small_batches_extrapolate_well():
    # A real CPU profile: step time grows faster than linearly at large batches. An unweighted
    # fit of batches 2..32 predicted batch 1 at 3.9 ms against 14.6 ms measured (-73%).
    from pathlib import Path
    path = Path(__file__).parents[1] / "profiles" / "cpu-1thread.csv"
    table = leave_one_out(ProfileModel.from_csv(path)).set_index("batch_size")
    assert abs(table.loc[1, "error_pct"]) < 25
    assert table["error_pct"].abs().max() < 25


def test_the_mean_step_predicts_and_a_profile_without_it_uses_the_median(tmp_path):
    """Rounds sum steps, so the mean is what t(b) is; a profile written before step_s_mean
    existed loads, its median standing in."""
    rows = [row(b, 0.01 * b) | {"step_s_mean": 0.0105 * b} for b in (1, 2, 4)]
    model = ProfileModel.from_csv(write(tmp_path / "p.csv", rows))
    assert [model.step_s(b) for b in (1, 2, 4)] == pytest.approx([0.0105, 0.021, 0.042], rel=1e-12)
    path = write(tmp_path / "old.csv", [row(b, 0.01 * b) for b in (1, 2, 4)])
    frame = pd.read_csv(path).drop(columns=["step_s_mean"])
    frame.to_csv(path, index=False)
    old = ProfileModel.from_csv(path)
    assert [old.step_s(b) for b in (1, 2, 4)] == pytest.approx([0.01, 0.02, 0.04], rel=1e-12)


def test_a_profile_row_carries_the_mean_of_its_timed_steps():
    pytest.importorskip("torch", reason="calibrate.harness needs torch (pip install -e '.[calibrate]')")
    from calibrate.harness import DeviceInfo, Measurement, profile_row

    info = DeviceInfo(device="cpu", device_name="cpu", device_index=None, gpu_key="cpu", mem_total_bytes=None,
                      driver_version=None, cuda_version=None)
    m = Measurement(4)
    m.times_s = [0.010, 0.011, 0.010, 0.030]  # one throttled step: the median misses it, the mean does not
    r = profile_row(info, "tiny", 256, "fp32", m)
    assert r["step_s_median"] == pytest.approx(0.0105) and r["step_s_mean"] == pytest.approx(0.01525)


def test_a_profile_records_its_step_and_warm_up_and_reads_them_back(tmp_path):
    """compiled (identity), warmup_steps and warmup_s per row; ProfileModel's startup_s is the largest
    warm-up beyond steady steps; a profile of another step is refused for an explicit compile mode."""
    pytest.importorskip("torch", reason="calibrate.harness needs torch (pip install -e '.[calibrate]')")
    from calibrate.harness import DeviceInfo, Measurement, profile_row

    info = DeviceInfo("cuda:0", "NVIDIA H200", 0, "h200", 150e9, "580", "13.0")
    rows = []
    for batch, times, warmup_s in ((8, [0.1, 0.1], 40.3), (16, [0.2, 0.2], 36.6)):
        m = Measurement(batch, times_s=times, warmup_s=warmup_s)
        rows.append(profile_row(info, "tiny", 256, "bf16", m, compiled=True, warmup_steps=3))
    assert (rows[0]["compiled"], rows[0]["warmup_steps"], rows[0]["warmup_s"]) == (True, 3, 40.3)
    oom = profile_row(info, "tiny", 256, "bf16", Measurement(32, oom=True, warmup_s=1.0), compiled=True, warmup_steps=3)
    assert (oom["warmup_steps"], oom["warmup_s"]) == (None, None)
    write_new_profile(tmp_path / "p.csv", rows + [oom])
    profile = ProfileModel.from_csv(tmp_path / "p.csv", compiled=True)
    assert profile.compiled and profile.startup_s == pytest.approx(40.3 - 3 * 0.1)
    with pytest.raises(ProfileError, match="column 'compiled': measured at 'true'; expected 'false'"):
        ProfileModel.from_csv(tmp_path / "p.csv", compiled=False)
