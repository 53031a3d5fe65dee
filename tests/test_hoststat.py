"""train/hoststat.py: the host's CPU shares over a window, from /proc/stat's aggregate line."""
from __future__ import annotations

import pytest

from train.hoststat import HostShare, cpu_times, host_share

LINE = "cpu  {} {} {} {} {} 0 {} {} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def _stat(tmp_path, name, user, nice, system, idle, iowait, softirq, steal):
    path = tmp_path / name
    path.write_text(LINE.format(user, nice, system, idle, iowait, softirq, steal))
    return cpu_times(path)


def test_steal_and_busy_are_shares_of_all_the_time_that_passed(tmp_path):
    before = _stat(tmp_path, "a", 100, 0, 50, 800, 10, 0, 40)
    after = _stat(tmp_path, "b", 400, 20, 130, 1200, 30, 10, 90)
    # deltas: user 300, nice 20, system 80, idle 400, iowait 20, softirq 10, steal 50: 880 ticks
    share = host_share(before, after)
    assert share == HostShare(steal_pct=pytest.approx(100 * 50 / 880), busy_pct=pytest.approx(100 * 410 / 880))
    assert share.line() == "steal 5.7% of the CPU time (the hypervisor's other tenants), busy 47%"


def test_nothing_to_say_without_proc_stat_or_without_time(tmp_path):
    assert cpu_times(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert cpu_times(tmp_path / "odd") is None
    same = _stat(tmp_path, "c", 1, 1, 1, 1, 1, 1, 1)
    assert host_share(same, same) is None
    assert host_share(None, same) is None


def test_this_machine_reads():
    times = cpu_times()
    if times is None:
        pytest.skip("no /proc/stat here")
    assert set(times) == {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}
    assert all(v >= 0 for v in times.values())


def test_a_host_taken_from_the_work_is_said_in_one_line():
    assert HostShare(steal_pct=2.0, busy_pct=90.0).warning("the run") is None  # at the threshold: quiet
    line = HostShare(steal_pct=29.3, busy_pct=64.0).warning("the run")
    assert line == ("warning: the host's other tenants took 29.3% of the CPU time during the run (steal; above 2%): "
                    "its steps were slower than this machine's when they do not")
