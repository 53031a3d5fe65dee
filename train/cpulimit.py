"""CPU limits for one process: core pinning and, where the machine allows, a CPU quota.

Makes a CPU behave like a slower device from real limits, not sleeps (geodt calibrate and the
executor apply the same limits, so a profile measures the device the executor runs):

    cleanup = apply_cpu_limits(cores=[0], quota=0.4, tag="geodt-slow-0")
    ...   # this process now runs on core 0 with 40% of one core's time
    cleanup()  # back to the parent cgroup, the cgroup removed

- cores: os.sched_setaffinity (Linux); threads the caller sets itself (torch.set_num_threads).
- quota (cores of CPU time, > 0): a cgroup of its own with quota = quota × period and the
  largest scheduler weight (so that it gets its quota on a shared machine, SHARES_V1). cgroup v2
  (`cpu.max` under /sys/fs/cgroup) or v1 (`cpu.cfs_quota_us` under /sys/fs/cgroup/cpu); needs
  write access (root) and the cpu controller: `cpu_quota_supported()` says whether it can work,
  and `apply_cpu_limits` raises CpuLimitError (one line) where it cannot.
- The cgroup is removed by cleanup() and at interpreter exit; groups left behind by killed
  processes (`<tag>.<pid>`, pid dead) are removed the next time that tag is used.

Torch-free and standard library only.
"""
from __future__ import annotations

import atexit
import os
import re
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The quota is enforced per period. With the kernel's default 100 ms, a 40-80 ms training step
# runs unthrottled or waits out the rest of a period, so step times split into two modes and
# their median misses their mean (by 7% at 0.6 of a core, measured here). 10 ms periods spread
# the throttling over every step: median and mean agree within about 1%.
PERIOD_US = 10_000
# The quota is a ceiling, not a guarantee: on a machine shared with other sessions (each its own
# scheduler autogroup, weight 1024) a group of default weight gets 1/(k+1) of its core against k
# busy sessions, so a 0.9-core and a 0.45-core device both ran at 0.25 of a core with 3 busy
# sessions on their core (nr_throttled 0: the quota never bound) and alike at ~0.12 s a step
# under seven. The largest weight makes the group win its core up to its quota, so the quota is
# what sets the device's speed; others keep what the quota leaves (cpu.shares max in v1, cpu.weight in v2).
SHARES_V1, WEIGHT_V2 = 262_144, 10_000
_TAG = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class CpuLimitError(RuntimeError):
    """Limits that cannot be applied here; str() is the one-line reason."""


def _v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def _base() -> Path | None:
    """Directory under which our cgroups go, or None without a usable cpu controller."""
    if _v2():
        if "cpu" not in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
            return None
        return CGROUP_ROOT
    v1 = CGROUP_ROOT / "cpu"
    return v1 if (v1 / "cpu.cfs_quota_us").exists() else None


def cpu_quota_supported() -> bool:
    """True when a per-process CPU quota can be set here (cpu controller present, writable)."""
    try:
        base = _base()
        return base is not None and os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK)
    except OSError:
        return False


def _own_cgroup_v1() -> Path:
    """The cpu cgroup this process is in now (to return to on cleanup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CGROUP_ROOT / "cpu" / path.lstrip("/")
    return CGROUP_ROOT / "cpu"


def _own_cgroup_v2() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return CGROUP_ROOT / line[3:].lstrip("/")
    return CGROUP_ROOT


def _prune_stale(base: Path, tag: str) -> None:
    """Remove `<tag>.<pid>` groups of dead processes (rmdir fails on live ones: fine)."""
    for group in base.glob(f"{tag}.*"):
        pid = group.name.rsplit(".", 1)[-1]
        if group.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                group.rmdir()
            except OSError:
                pass


def _set_quota(quota: float, tag: str) -> Callable[[], None]:
    base = _base()
    if base is None or not cpu_quota_supported():
        raise CpuLimitError("cpu_quota: this machine offers no writable cgroup cpu controller "
                            "(needs root and /sys/fs/cgroup/cpu or cgroup v2 with cpu enabled)")
    _prune_stale(base, tag)
    home = _own_cgroup_v2() if _v2() else _own_cgroup_v1()
    group = base / f"{tag}.{os.getpid()}"
    group.mkdir(exist_ok=True)
    quota_us = max(1000, round(quota * PERIOD_US))  # the kernel's minimum is 1 ms (a quota >= 0.1 core)
    try:
        if _v2():
            (group / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
            (group / "cpu.weight").write_text(str(WEIGHT_V2))
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
            (group / "cpu.shares").write_text(str(SHARES_V1))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        try:
            group.rmdir()
        except OSError:
            pass
        raise CpuLimitError(f"cpu_quota: cannot set a quota in {group} ({exc})") from None
    done = False

    def cleanup() -> None:
        nonlocal done
        if done:
            return
        done = True
        try:
            (home / "cgroup.procs").write_text(str(os.getpid()))
            group.rmdir()
        except OSError:
            pass  # left for _prune_stale

    atexit.register(cleanup)
    return cleanup


def set_own_quota(quota: float) -> None:
    """Change the quota of the cgroup apply_cpu_limits made for this process (a drift injected
    mid-run: real/process/worker.py). CpuLimitError where this process is not in a group of its own."""
    group = _own_cgroup_v2() if _v2() else _own_cgroup_v1()
    if not group.name.endswith(f".{os.getpid()}"):  # never a parent group shared with others
        raise CpuLimitError(f"cpu_quota: this process has no cgroup of its own ({group}); "
                            "expected a node with cpu_quota")
    quota_us = max(1000, round(quota * PERIOD_US))
    try:
        if _v2():
            (group / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
        else:
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
    except OSError as exc:
        raise CpuLimitError(f"cpu_quota: cannot change the quota in {group} ({exc})") from None


def device_cores(cores: list[int] | tuple[int, ...] | None, devices: int, index: int) -> list[int] | None:
    """The cores device `index` of a node of `devices` devices runs on: with at least one core per
    device each takes cores[index::devices], else all of them share every core (None: unpinned)."""
    if not cores:
        return None
    return list(cores[index::devices]) if len(cores) >= devices else list(cores)


def describe_limits(cores: list[int] | None, quota: float | None) -> str:
    """The limits as a profile's device_name carries them ('quota 0.6 cores, cores 0'); '' for none."""
    parts = ([f"quota {quota:g} cores"] if quota else []) + ([f"cores {','.join(map(str, cores))}"] if cores else [])
    return ", ".join(parts)


def apply_cpu_limits(cores: list[int] | None, quota: float | None, tag: str) -> Callable[[], None]:
    """Pin this process to `cores` and give it `quota` cores of CPU time; returns cleanup().

    None leaves that limit off. Raises CpuLimitError (one line) for a core this process may
    not use, a bad quota, or a quota where the machine has no writable cpu controller.
    """
    if not _TAG.match(tag):
        raise CpuLimitError(f"tag: expected letters, digits, '.', '_' or '-', got {tag!r}")
    previous = None
    if cores is not None:
        allowed = os.sched_getaffinity(0)
        wanted = set(cores)
        if not wanted or not wanted <= allowed:
            raise CpuLimitError(f"cpu_cores: expected core indices among {sorted(allowed)}, got {sorted(wanted)}")
        previous = allowed
        os.sched_setaffinity(0, wanted)
    undo_quota: Callable[[], None] = lambda: None
    if quota is not None:
        if not (isinstance(quota, (int, float)) and 0 < quota < float("inf")):
            raise CpuLimitError(f"cpu_quota: expected a positive number of cores, got {quota!r}")
        try:
            undo_quota = _set_quota(float(quota), tag)
        except CpuLimitError:
            if previous is not None:
                os.sched_setaffinity(0, previous)
            raise

    def cleanup() -> None:
        undo_quota()
        if previous is not None:
            os.sched_setaffinity(0, previous)

    return cleanup
