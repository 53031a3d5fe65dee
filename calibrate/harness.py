"""Measuring one device: step time and peak memory per batch size, OOM search, profile rows.

`Calibrator.measure(b)` runs `warmup` untimed steps then `repeats` timed ones of
`train.step.train_step` (the executor's step) on random tokens. CUDA steps are timed with
CUDA events (one pair per step, read after a single synchronize, so timing adds no sync
points); CPU steps with `time.perf_counter`. Peak memory is torch's peak allocated bytes on
CUDA, reset before each batch; on CPU it is not recorded (empty cells): torch's CPU
allocator keeps no peak statistic, and process RSS is dominated by the interpreter and
libraries. A `torch.OutOfMemoryError` becomes an OOM measurement, memory is freed and the
run goes on. `auto_search` doubles the batch until OOM and bisects to the largest that fits.

A compiled step ([training] compile, train/step.py compile_blocks) is compiled afresh at each
batch (torch._dynamo.reset() first), as a run at that batch compiles it: the warm-up steps'
wall time (`warmup_s`, compile included) is the startup a run pays, and each batch's steps run
the graph specialised to its shape.
"""
from __future__ import annotations

import gc
import platform
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import torch

from calibrate.telemetry import NvmlSampler, nvml_info
from facts.catalog import CATALOG_PATH
from facts.presets import ModelArch
from train.models import build_model
from train.step import compile_blocks, make_optimizer, make_scaler, random_batch, train_step, use_compile

# Doubling never goes past this on CUDA without --max-batch (OOM comes long before).
UNBOUNDED_MAX_BATCH = 1 << 20


class HarnessError(ValueError):
    """A device or option the harness cannot use (the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class DeviceInfo:
    device: str                  # torch device string: "cpu" or "cuda:N"
    device_name: str
    device_index: int | None
    gpu_key: str
    mem_total_bytes: int | None
    driver_version: str | None
    cuda_version: str | None


@dataclass
class Measurement:
    batch_size: int
    times_s: list[float] = field(default_factory=list)
    peak_mem_bytes: int | None = None
    oom: bool = False
    telemetry: dict[str, float | None] = field(default_factory=dict)
    warmup_s: float | None = None  # wall seconds of the warm-up steps (a compiled step's compile included)


def resolve_devices(spec: str) -> list[str]:
    """'cpu' | 'cuda' | 'cuda:N' | 'all' (every CUDA device) as torch device strings."""
    if spec == "cpu":
        return ["cpu"]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "all":
        if count == 0:
            raise HarnessError("--device all: no CUDA device found; expected a machine with GPUs (or --device cpu)")
        return [f"cuda:{i}" for i in range(count)]
    if spec == "cuda" or spec.startswith("cuda:"):
        index_text = spec.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise HarnessError(f"--device {spec}: expected cuda:N with N a device index")
        if int(index_text) >= count:
            raise HarnessError(f"--device {spec}: {count} CUDA device(s) visible; expected "
                               f"{f'cuda:0..cuda:{count - 1}' if count else 'cpu (no CUDA here)'}")
        return [f"cuda:{int(index_text)}"]
    raise HarnessError(f"--device {spec!r}: expected cpu, cuda:N or all")


def _catalog_keys() -> list[str]:
    path = CATALOG_PATH
    try:
        return [str(k) for k in pd.read_csv(path, usecols=["key"])["key"]]
    except (OSError, ValueError):
        return []


def gpu_key_for(device_name: str, keys: list[str] | None = None) -> str:
    """The catalog key of a device name, '' when none matches.

    Names are split into lower-case words (vendor words dropped); a key matches when all its
    words occur in the name, and the key with the most words wins: 'NVIDIA GeForce RTX 3090'
    -> rtx-3090, 'Tesla V100-PCIE-16GB' -> v100-pcie, 'Tesla V100-SXM2-32GB' -> v100.
    """
    keys = _catalog_keys() if keys is None else keys
    words = set(re.split(r"[^a-z0-9]+", device_name.lower())) - {"", "nvidia", "geforce", "tesla"}
    best, best_len = "", 0
    for key in keys:
        key_words = set(key.split("-"))
        if key_words <= words and len(key_words) > best_len:
            best, best_len = key, len(key_words)
    return best


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def scenario_device_name(cpu: str, limits: str, scenario: str, node: str, index: int, gpus: int,
                         where: str = "") -> str:
    """A scenario's emulated CPU device as its profile names it: `cpu` (describe_device("cpu")'s
    name in the measuring process, 'AMD EPYC (1 thread)') with its limits, scenario, node, device
    (1-based) of the node's and where it was timed: 'AMD EPYC (1 thread, quota 0.9 cores;
    wan-three q90 1/1)'."""
    return (f"{cpu[:-1]}{', ' + limits if limits else ''}; {scenario} {node} {index + 1}/{gpus}"
            f"{', ' + where if where else ''})")


def describe_device(device: str) -> DeviceInfo:
    """Facts about a device; on CPU the name carries torch's thread count (set it first)."""
    if device == "cpu":
        threads = torch.get_num_threads()
        return DeviceInfo("cpu", f"{cpu_name()} ({threads} thread{'s' if threads > 1 else ''})",
                          None, "cpu", None, None, None)
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    nvml = nvml_info(index)
    name = props.name
    key = gpu_key_for(name)
    return DeviceInfo(f"cuda:{index}", name, index, key, int(props.total_memory) or nvml.mem_total_bytes,
                      nvml.driver_version, torch.version.cuda)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Calibrator:
    """One model, optimizer and scaler on one device, measured at successive batch sizes."""

    def __init__(self, arch: ModelArch, seq_len: int, dtype: str, device: str,
                 repeats: int, warmup: int, seed: int = 0, compile_mode: str = "auto"):
        self.arch, self.seq_len, self.dtype = arch, seq_len, dtype
        self.device = torch.device(device)
        self.repeats, self.warmup = repeats, warmup
        self.model = build_model(arch, seq_len, seed).to(self.device)
        self.model.train()
        self.compiled = use_compile(compile_mode, self.device)
        if self.compiled:
            compile_blocks(self.model)
        self.optimizer = make_optimizer(self.model)
        self.scaler = make_scaler(self.device, dtype)
        self.generator = torch.Generator().manual_seed(seed)
        self.sampler = NvmlSampler(self.device.index or 0) if self.device.type == "cuda" else None

    def measure(self, batch_size: int) -> Measurement:
        """Warm up, then time `repeats` steps at this batch size; an OOM is a result, not an error."""
        result = Measurement(batch_size)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.compiled:
            torch._dynamo.reset()  # compile for this batch afresh, as a run at this batch would
        try:
            batch = random_batch(self.arch.vocab_size, batch_size, self.seq_len, self.device, self.generator)
            _sync(self.device)
            warmup_start = time.perf_counter()
            for _ in range(self.warmup):
                train_step(self.model, self.optimizer, batch, self.dtype, self.scaler)
            _sync(self.device)
            result.warmup_s = time.perf_counter() - warmup_start
            if self.sampler is not None:
                self.sampler.start()
            if cuda:
                events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in range(self.repeats)]
                for start, end in events:
                    start.record()
                    train_step(self.model, self.optimizer, batch, self.dtype, self.scaler)
                    end.record()
                _sync(self.device)
                result.times_s = [start.elapsed_time(end) / 1000.0 for start, end in events]
                result.peak_mem_bytes = int(torch.cuda.max_memory_allocated(self.device))
            else:
                for _ in range(self.repeats):
                    t0 = time.perf_counter()
                    train_step(self.model, self.optimizer, batch, self.dtype, self.scaler)
                    result.times_s.append(time.perf_counter() - t0)
        except torch.OutOfMemoryError:
            result.oom = True
        except RuntimeError as exc:  # the CPU allocator's failure is a plain RuntimeError
            if not is_allocator_error(exc):
                raise
            result.oom = True
        finally:
            if self.sampler is not None:
                result.telemetry = self.sampler.stop()
        if result.oom:
            result.times_s, result.peak_mem_bytes, result.telemetry = [], None, {}
            self.free_memory()
        return result

    def free_memory(self) -> None:
        """Drop gradients and cached blocks after an OOM so the next batch starts clean."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:  # an OOM between unscale_ and update leaves it mid-step
            self.scaler = make_scaler(self.device, self.dtype)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def is_allocator_error(exc: BaseException) -> bool:
    """Whether an exception is an allocator running out of memory (CPU or CUDA), not a bug."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text \
        or "not enough memory" in text


def profile_row(info: DeviceInfo, model: str, seq_len: int, dtype: str, m: Measurement,
                compiled: bool = False, warmup_steps: int | None = None) -> dict:
    """One profile CSV row (docs/DESIGN.md, "Profiles") from a measurement; warmup_steps: how many
    untimed steps `warmup_s` covers (None: not recorded)."""
    timed = bool(m.times_s) and not m.oom
    times = np.asarray(m.times_s, dtype=float)
    median = float(np.median(times)) if timed else None
    return {
        "device_name": info.device_name, "device_index": info.device_index, "gpu_key": info.gpu_key,
        "model": model, "seq_len": seq_len, "dtype": dtype, "batch_size": m.batch_size,
        "step_s_median": median,
        "step_s_mean": float(np.mean(times)) if timed else None,
        "step_s_p10": float(np.percentile(times, 10)) if timed else None,
        "step_s_p90": float(np.percentile(times, 90)) if timed else None,
        "repeats": len(m.times_s) if timed else None,
        "peak_mem_bytes": m.peak_mem_bytes, "mem_total_bytes": info.mem_total_bytes, "oom": m.oom,
        "tokens_per_s": m.batch_size * seq_len / median if timed else None,
        "sm_util_pct": m.telemetry.get("sm_util_pct"), "mem_util_pct": m.telemetry.get("mem_util_pct"),
        "power_w": m.telemetry.get("power_w"),
        "torch_version": torch.__version__, "cuda_version": info.cuda_version,
        "driver_version": info.driver_version, "host": socket.gethostname(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "compiled": compiled,
        "warmup_steps": warmup_steps if timed and m.warmup_s is not None else None,
        "warmup_s": m.warmup_s if timed and warmup_steps is not None else None,
    }


def auto_search(fits: Callable[[int], bool], start: int, max_batch: int) -> int | None:
    """The largest batch that fits: double from `start` until OOM (or `max_batch`), then bisect.

    Returns None when not even batch 1 fits. `fits` is called once per batch tried, in the
    order tried, so a profile records the search path.
    """
    last_ok, first_bad, batch = 0, None, start
    while True:
        if fits(batch):
            last_ok = batch
        else:
            first_bad = batch
            break
        if batch >= max_batch:
            break
        batch = min(2 * batch, max_batch)
    if first_bad is not None:
        lo, hi = last_ok, first_bad
        while hi - lo > 1:  # invariant: lo fits (or is 0), hi does not
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        last_ok = lo
    return last_ok or None
