"""train.cpulimit: pinning and a cgroup CPU quota, applied in a child process and undone.

The quota test checks the kernel's own accounting (cpu.cfs_quota_us / cpu.max written, the
process listed in the group, the group gone after cleanup), not speed: timing depends on load.
The contention test measures CPU time, not speed: the share of a core the process got while
other sessions kept that core busy, which the quota (not the other sessions) must set.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.cpulimit import CpuLimitError, apply_cpu_limits, cpu_quota_supported


def _child(queue, cores, quota, tag):
    try:
        cleanup = apply_cpu_limits(cores, quota, tag)
    except CpuLimitError as exc:
        queue.put(("error", str(exc)))
        return
    groups = [line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
              if "cpu" in line.split(":", 2)[1].split(",") or line.startswith("0::")]
    seen = {"affinity": sorted(os.sched_getaffinity(0)), "groups": groups}
    for path in Path("/sys/fs/cgroup").glob(f"**/{tag}.{os.getpid()}"):
        for name in ("cpu.cfs_quota_us", "cpu.max"):
            if (path / name).exists():
                seen["quota"] = (path / name).read_text().split()[0]
        for name in ("cpu.shares", "cpu.weight"):
            if (path / name).exists():
                seen["weight"] = int((path / name).read_text())
        seen["path"] = str(path)
    cleanup()
    seen["after"] = sorted(os.sched_getaffinity(0))
    queue.put(("ok", seen))


def _run(cores, quota, tag):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, cores, quota, tag))
    proc.start()
    result = queue.get(timeout=60)
    proc.join(timeout=60)
    return result


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pins_to_the_cores_given_and_restores():
    allowed = sorted(os.sched_getaffinity(0))
    status, seen = _run([allowed[0]], None, "geodt-test-pin")
    assert status == "ok"
    assert seen["affinity"] == [allowed[0]] and seen["after"] == allowed


def test_refuses_a_core_outside_the_allowed_set():
    status, message = _run([10_000], None, "geodt-test-pin")
    assert status == "error" and message.startswith("cpu_cores: expected core indices among")


@pytest.mark.skipif(not cpu_quota_supported(), reason="needs root and a cgroup cpu controller")
def test_quota_sets_the_cgroup_and_removes_it():
    status, seen = _run(None, 0.4, "geodt-test-quota")
    assert status == "ok"
    assert seen["quota"] == "4000"  # 0.4 × the 10 ms period, in µs
    assert seen["weight"] in (262_144, 10_000)  # the largest cpu.shares (v1) or cpu.weight (v2)
    assert any(g.endswith(Path(seen["path"]).name) for g in seen["groups"])
    assert not Path(seen["path"]).exists()


def test_unsupported_quota_is_one_line(monkeypatch):
    import train.cpulimit as cl

    monkeypatch.setattr(cl, "_base", lambda: None)
    with pytest.raises(CpuLimitError, match=r"^cpu_quota: this machine offers no writable cgroup"):
        cl.apply_cpu_limits(None, 0.5, "geodt-test-none")
    assert not cl.cpu_quota_supported()


def _share_child(queue, core, quota, seconds):
    """CPU time over wall time while spinning on `core` under `quota`."""
    cleanup = apply_cpu_limits([core], quota, "geodt-test-share")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    share = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    cleanup()
    queue.put(share)


BUSY = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.time() + float(sys.argv[2])\nwhile time.time() < end: pass\n"


@pytest.mark.skipif(not cpu_quota_supported() or not hasattr(os, "sched_setaffinity"),
                    reason="needs root, a cgroup cpu controller and CPU affinity")
def test_quota_binds_while_other_sessions_keep_the_core_busy():
    """Three busy processes, each a session of its own (its own scheduler autogroup, as another
    user's shell would be), on the core of a 0.6-core quota: the quota sets the share. Before the
    group took the largest weight it got 1/4 of the core (0.25, measured) and nr_throttled stayed 0."""
    core = sorted(os.sched_getaffinity(0))[-1]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY, str(core), "8"], start_new_session=True) for _ in range(3)]
    try:
        time.sleep(0.5)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_share_child, args=(queue, core, 0.6, 2.0))
        proc.start()
        share = queue.get(timeout=60)
        proc.join(timeout=60)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # The kernel enforces the quota every 10 ms period (200 here), so it cannot exceed 0.6 by more
    # than a period's rounding; 0.5 below it leaves room for kernel threads and another test's
    # quota'd group on the same core (equal weight), far from the 0.25 the busy sessions left before.
    assert 0.5 <= share <= 0.62, share


def _drift_child(queue):
    from train.cpulimit import set_own_quota

    try:
        set_own_quota(0.3)  # no group of its own yet: refused, the parent's group untouched
        queue.put(("changed a shared group", None))
        return
    except CpuLimitError as exc:
        refused = str(exc)
    cleanup = apply_cpu_limits(None, 0.5, "geodt-test-drift")
    group = next(Path("/sys/fs/cgroup").glob(f"**/geodt-test-drift.{os.getpid()}"))
    quota_file = group / ("cpu.max" if (group / "cpu.max").exists() else "cpu.cfs_quota_us")
    before = quota_file.read_text().split()[0]
    set_own_quota(0.5 / 1.25)  # a drift of factor 1.25 injected mid-run (real/process/worker.py)
    after = quota_file.read_text().split()[0]
    cleanup()
    queue.put((refused, (before, after)))


@pytest.mark.skipif(not cpu_quota_supported(), reason="needs root and a cgroup cpu controller")
def test_a_drift_lowers_the_quota_of_the_process_own_group_only():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_drift_child, args=(queue,))
    proc.start()
    refused, quotas = queue.get(timeout=60)
    proc.join(timeout=60)
    assert refused.startswith("cpu_quota: this process has no cgroup of its own")
    assert quotas == ("5000", "4000")  # µs per 10 ms period: 0.5 core, then 0.5 / 1.25
