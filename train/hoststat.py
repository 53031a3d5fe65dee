"""The host's CPU time over a window, from /proc/stat: the share the hypervisor gave to other
tenants (steal) and the share the machine was busy, recorded beside a measured run as pyperf records
its environment with every value, so that a run slower than its calibration can be told from a run
whose host was taken from it (results/predict-the-run/). Torch-free; None where /proc/stat is not
there (not Linux)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# the aggregate "cpu" line's first eight fields (proc(5)); guest time is already in user and nice
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# Above this much steal over a calibration or a run, its steps are slower than this machine's own: on
# this project's VM the round error of a calibrated run followed the change in steal from the
# calibration to the run (correlation -0.91 over 10 runs, results/predict-the-run/five-runs-host/).
STEAL_WARN_PCT = 2.0


def cpu_times(path: Path = PROC_STAT) -> dict[str, int] | None:
    """The machine's CPU time so far, in clock ticks, per FIELDS; None when it cannot be read."""
    try:
        with path.open(encoding="ascii") as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 1 + len(FIELDS):
        return None
    return dict(zip(FIELDS, map(int, first[1:1 + len(FIELDS)])))


@dataclass(frozen=True)
class HostShare:
    """Shares of the machine's CPU time over a window, in %."""

    steal_pct: float  # taken by the hypervisor for other guests: time this machine's work did not get
    busy_pct: float   # spent working (all but idle and iowait), this machine's processes and the kernel

    def line(self) -> str:
        return (f"steal {self.steal_pct:.1f}% of the CPU time (the hypervisor's other tenants), "
                f"busy {self.busy_pct:.0f}%")

    def warning(self, what: str) -> str | None:
        """One line when the steal over `what` (e.g. "the run") made its steps slower than this machine's."""
        if self.steal_pct <= STEAL_WARN_PCT:
            return None
        return (f"warning: the host's other tenants took {self.steal_pct:.1f}% of the CPU time during {what} "
                f"(steal; above {STEAL_WARN_PCT:g}%): its steps were slower than this machine's when they do not")


def host_share(before: dict[str, int] | None, after: dict[str, int] | None) -> HostShare | None:
    """The shares between two cpu_times(); None when either is missing or no time passed."""
    if before is None or after is None:
        return None
    delta = {key: after[key] - before[key] for key in FIELDS}
    total = sum(delta.values())
    if total <= 0:
        return None
    idle = delta["idle"] + delta["iowait"]
    return HostShare(steal_pct=100 * delta["steal"] / total, busy_pct=100 * (total - idle - delta["steal"]) / total)


def say(host: HostShare | None, what: str, advice: str) -> None:
    """Print the host's shares over `what` (e.g. "the run"), and the warning with `advice` above the threshold."""
    if host is None:
        return
    print(f"host during {what}: {host.line()}")
    warning = host.warning(what)
    if warning is not None:
        print(f"{warning}; {advice}", file=sys.stderr)
