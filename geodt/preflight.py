"""Can this machine hold the run? `geodt run` / `geodt validate` ask before anything is written.

What a plan needs, against what the machine offers:
- processes: one per device of every node (under torchrun: LOCAL_WORLD_SIZE of them here);
- devices: a GPU per process when the backend is nccl (or auto finds one per process); without,
  every process trains on the CPU, whatever GPU the scenario names;
- memory per process: simulator/models/memory.py's peak of one training step at the node's batch and
  layout (weights, gradients, AdamW's moments, the outer state where it lives on the device,
  activations; no reserve). On a GPU that peak is compared with the GPU's memory; on the CPU
  each local process is priced by `host_process_bytes`, the one rule for host memory (geodt
  run/validate here, geodt calibrate device and scenario too): HOST_STEP_FACTOR x the peak +
  HOST_PROCESS_BYTES, and the processes' sum is compared with the memory available now
  (MemAvailable, and the cgroup's limit).
  Measured here (torch 2.13 CPU, 2026-11-28; peak RSS = VmHWM / ru_maxrss of each process, KiB
  x 1024): a rank of `geodt run` on a 2-node tiny scenario (batch 1, seq_len 64, fp32, one CPU
  device a node) peaks at 0.46 GB (both ranks; `import torch, torch.distributed` alone 0.23 GB,
  with transformers and the model 0.36 GB; gloo, the data and the trace the rest):
  HOST_PROCESS_BYTES. A step on the CPU keeps more than the traced one (tiny, seq_len 1024, one
  process, batch 1 and 8: 28.0 MB a sample in fp16 against the table's 22.6, 1.24x; fp32 1.10x):
  HOST_STEP_FACTOR. Check: a rank of paper/hybrid with --set model.preset=tiny (batch 64,
  seq_len 1024, fp16) peaked at 2.15 GB; the rule says 1.25 x 1.45 + 0.46 = 2.27 GB, so 16 of
  them need 36 GB and a 24 GB machine refuses the run (the rule before took the CUDA reserve
  off a peak that holds none and said 13.5 GB; the run was killed by the OOM killer in a minute).
A plan that does not fit is refused with one line saying why and what to do (PreflightError).
`--emulate` still computes every inner step (it pads each to the plan's time), so it needs the
same memory; the remedy for a large model is a smaller one.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from simulator.models.memory import Layout, memory_need_bytes

HOST_PROCESS_BYTES = 0.46e9  # a process's own resident bytes beside the step (measured: see above)
HOST_STEP_FACTOR = 1.25  # a CPU step's resident bytes over the traced peak (measured 1.24 fp16, 1.10 fp32)
GB = 1e9


class PreflightError(ValueError):
    """The machine cannot hold the plan; str() is the one-line report."""


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_bytes: float               # available now
    gpu_memory_bytes: tuple[float, ...]  # one entry per visible GPU


def available_memory_bytes() -> float:
    """MemAvailable, or the cgroup's remaining limit when that is smaller."""
    available = float("inf")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = float(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, float(limit) - used)
    except (OSError, ValueError):
        pass
    if available == float("inf"):
        available = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return available


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def this_machine() -> Machine:
    import torch  # noqa: PLC0415  deferred: torch; run --help and the calibrations' checks read preflight without it

    gpus = tuple(float(torch.cuda.get_device_properties(i).total_memory)
                 for i in range(torch.cuda.device_count())) if torch.cuda.is_available() else ()
    return Machine(available_cores(), available_memory_bytes(), gpus)


def process_bytes(scenario, node) -> float:
    """simulator/models/memory.py's peak of one of the node's processes (its layout, its per-device batch)."""
    layout = Layout(node.sharding or "none", node.activation_checkpointing or "none", node.gpus,
                    scenario.diloco.outer_state)
    return memory_need_bytes(scenario, node.batch_size, layout)


def host_process_bytes(step_bytes: float) -> float:
    """Resident bytes of one process training on the CPU whose step peaks at step_bytes
    (simulator/models/memory.py's figure, no reserve): the one rule for host memory (module docstring)."""
    return HOST_STEP_FACTOR * step_bytes + HOST_PROCESS_BYTES


def check_host_memory(what: str, need_bytes: float, available_bytes: float, remedy: str) -> None:
    """PreflightError (one line) when `what` needs more host memory than is available now."""
    if need_bytes > available_bytes:
        raise PreflightError(f"{what} need about {need_bytes / GB:.1f} GB of memory on the CPU "
                             f"(simulator/models/memory.py's step, geodt/preflight.py's rule) and "
                             f"{available_bytes / GB:.1f} GB available; "
                             f"{remedy}")


def local_nodes(plan) -> list:
    """The plan's nodes whose processes run here: all of them, or under torchrun this machine's."""
    if "LOCAL_WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return list(plan.nodes)
    first = int(os.environ["RANK"]) - int(os.environ.get("LOCAL_RANK", "0"))
    names = {plan.nodes[plan.node_of_rank(r)].node
             for r in range(first, min(first + int(os.environ["LOCAL_WORLD_SIZE"]), plan.world_size))}
    return [node for node in plan.nodes if node.node in names]


def check_machine(scenario, plan, backend: str, machine: Machine) -> list[str]:
    """PreflightError if the plan cannot run here; else the warnings to print before it starts."""
    nodes = local_nodes(plan)
    processes = sum(node.gpus for node in nodes)
    what = (f"{scenario.name}/{plan.strategy}: {processes} process{'es' if processes != 1 else ''} "
            f"of {scenario.model.preset or 'the model'}")
    gpu_nodes = [n.name for n in scenario.nodes if set(n.gpus) != {"cpu"} and n.name in {p.node for p in nodes}]
    on_gpu = backend == "nccl" or (backend == "auto" and gpu_nodes and len(machine.gpu_memory_bytes) >= processes)
    if backend == "nccl" and len(machine.gpu_memory_bytes) < processes:
        raise PreflightError(f"--backend nccl: {what} need a GPU each and this machine has "
                             f"{len(machine.gpu_memory_bytes) or 'no'} "
                             f"GPU{'s' if len(machine.gpu_memory_bytes) != 1 else ''}"
                             f"; expected --backend auto or gloo (processes then train on the CPU)")
    needs = [(node, process_bytes(scenario, node)) for node in nodes]
    if on_gpu:
        smallest = min(machine.gpu_memory_bytes[:processes])
        node, need = max(needs, key=lambda item: item[1])
        if need > smallest:
            raise PreflightError(f"{what}: node {node.node} needs {need / GB:.1f} GB per GPU "
                                 f"(simulator/models/memory.py) and this machine's smallest GPU holds "
                                 f"{smallest / GB:.1f} GB; use a smaller model or "
                                 "batch (--set model.preset=..., --set training.batch_size=...) or another scenario")
        return []
    host = sum(node.gpus * host_process_bytes(need) for node, need in needs)
    where = ("no GPU" if not machine.gpu_memory_bytes
             else f"{len(machine.gpu_memory_bytes)} GPUs for {processes} processes")
    smaller = "" if scenario.model.preset == "tiny" else "a smaller model (--set model.preset=tiny), "
    check_host_memory(f"{what} ({max(host_process_bytes(need) for _, need in needs) / GB:.2f} GB a process at most;"
                      f" this machine has {where})", host, machine.memory_bytes,
                      f"run {smaller}a smaller batch or sequence (--set training.batch_size=..., "
                      f"--set model.seq_len=...), fewer devices, or the scenario hetero-cpu (--emulate computes "
                      f"every step too)")
    if gpu_nodes:
        return [(f"node{'s' if len(gpu_nodes) > 1 else ''} {', '.join(gpu_nodes)}: the scenario names GPUs and this "
                f"machine runs {'their' if len(gpu_nodes) > 1 else 'its'} processes on the CPU, so measured times "
                "say nothing about those GPUs (--emulate pads each step to the plan's time: a schedule check)")]
    return []


def check_host(host: str, allow_any: bool = False) -> None:
    """--host: resolves, is not 0.0.0.0 unless allowed, and this machine can bind to it (LaunchError,
    one line, otherwise; the launcher prints the unauthenticated warning)."""
    # deferred: torch; run --help and the calibrations' checks read preflight without it
    from real.process.launch import LaunchError, check_host_policy, resolve_host, under_torchrun  # noqa: PLC0415

    if under_torchrun():
        return
    ip = resolve_host(host)
    check_host_policy(host, ip, allow_any)
    if ipaddress.ip_address(ip).is_loopback:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError as exc:
            raise LaunchError(f"--host: cannot bind to {host} ({ip}): {exc.strerror}; expected an address of this "
                              "machine") from None
