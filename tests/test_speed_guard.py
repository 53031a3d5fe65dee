"""benchmarks/speed_guard.py's pass/fail arithmetic on given figures (no timing here: CI runs the
guard itself, .ci/run)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import speed_guard
from speed_guard import Limits, broken

LIMITS = Limits(process_over_bare=6.0, big_cpu_s=25.0, big_wall_s=120.0, big_rss_gib=1.0)
GOOD = {"process_s": 2.0, "bare_s": 0.6, "big_cpu_s": 7.2, "big_wall_s": 21.0, "big_rss_bytes": 0.36 * 2**30}


def test_figures_within_the_limits_pass():
    assert broken(GOOD, LIMITS) == []
    at_limits = {"process_s": 6.0, "bare_s": 1.0, "big_cpu_s": 25.0, "big_wall_s": 120.0, "big_rss_bytes": 2**30}
    assert broken(at_limits, LIMITS) == []  # a limit is the most allowed, not a failure


def test_issue_58s_regression_fails_every_limit_and_names_its_figure():
    """The figures issue 58 measured with idle.png drawn a bar per node-segment."""
    regressed = {"process_s": 162.0, "bare_s": 0.59, "big_cpu_s": 181.5, "big_wall_s": 207.0,
                 "big_rss_bytes": 1.7e9}
    lines = broken(regressed, LIMITS)
    assert lines == ["speed guard: 1024 x 200: whole process / bare SimPy loop 274.58x is above its limit 6x",
                     "speed guard: 4096 x 2000: CPU seconds 181.50 s is above its limit 25 s",
                     "speed guard: 4096 x 2000: wall seconds 207.00 s is above its limit 120 s",
                     "speed guard: 4096 x 2000: peak memory 1.58 GiB is above its limit 1 GiB"]


def test_each_limit_alone_fails_and_nan_fails():
    for key, value in [("process_s", 3.7), ("big_cpu_s", 25.1), ("big_wall_s", 121.0), ("big_rss_bytes", 1.01 * 2**30)]:
        assert len(broken({**GOOD, key: value}, LIMITS)) == 1, key
    assert len(broken({**GOOD, "big_cpu_s": float("nan")}, LIMITS)) == 1  # a figure that is not a number fails


def test_the_guard_uses_the_limits_its_readme_gives():
    assert speed_guard.LIMITS == LIMITS
