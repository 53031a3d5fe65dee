"""Unit-implausible profiles are refused in one line (simulator/models/profile_fit.py check_step_units)."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from formats.profile import ProfileError
from simulator.models.profile_fit import ProfileModel

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "cpu-1thread.csv"


def _scaled(tmp_path: Path, factor: float) -> Path:
    rows = list(csv.DictReader(PROFILE.open()))
    for row in rows:
        for column in ("step_s_median", "step_s_p10", "step_s_p90"):
            row[column] = repr(float(row[column]) * factor)
    path = tmp_path / f"x{factor:g}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_the_committed_profile_is_plausible():
    assert ProfileModel.from_csv(PROFILE).measured_batches[0] == 1


def test_a_profile_in_milliseconds_is_refused(tmp_path):
    with pytest.raises(ProfileError, match=r"column 'step_s_median': batch 8: 80\.\d+ s; expected seconds, under 60 "
                                           r"\(is it in milliseconds\?\)"):
        ProfileModel.from_csv(_scaled(tmp_path, 1000.0))


def test_a_step_faster_than_any_device_is_refused_in_one_line(tmp_path):
    path = _scaled(tmp_path, 1e-6)
    proc = subprocess.run([sys.executable, "-m", "geodt", "profile", "check", str(path)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert "batch 1: 1.46e-08 s would be" in proc.stderr and "beyond the device's peak" in proc.stderr
