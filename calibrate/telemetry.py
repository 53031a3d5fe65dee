"""NVML telemetry: device facts and SM / memory utilisation and power sampled during steps.

NVML (pynvml, from nvidia-ml-py) numbers devices in PCI order, CUDA may not (and
CUDA_VISIBLE_DEVICES renumbers them), so a CUDA device is matched to its NVML handle by
UUID, falling back to the index. Anything NVML cannot give comes back as None, which the
profile writes as an empty cell; on CPU nothing is sampled.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NvmlInfo:
    name: str | None
    driver_version: str | None
    mem_total_bytes: int | None


def _nvml():
    try:
        import pynvml  # noqa: PLC0415  deferred: nvidia-ml-py (the calibrate extra) only on an NVIDIA GPU

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no library, no driver, no GPU: telemetry is optional
        return None


def nvml_handle(cuda_index: int):
    """(pynvml module, handle) for a CUDA device index, or (None, None) without NVML."""
    nvml = _nvml()
    if nvml is None:
        return None, None
    try:
        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        return nvml, nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        try:
            return nvml, nvml.nvmlDeviceGetHandleByIndex(cuda_index)
        except Exception:
            return None, None


def nvml_info(cuda_index: int) -> NvmlInfo:
    """Name, driver version and total memory of a CUDA device as NVML reports them."""
    nvml, handle = nvml_handle(cuda_index)
    if handle is None:
        return NvmlInfo(None, None, None)

    def ask(call):
        try:
            value = call()
            return value.decode() if isinstance(value, bytes) else value
        except Exception:
            return None

    return NvmlInfo(ask(lambda: nvml.nvmlDeviceGetName(handle)),
                    ask(nvml.nvmlSystemGetDriverVersion),
                    ask(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total)))


class NvmlSampler:
    """Samples utilisation and power in a background thread between start() and stop().

    NVML's utilisation counters are averages over its own sample period (1/6 s to 1 s
    depending on the GPU), so polling faster than `interval_s` = 50 ms gains nothing.
    """

    def __init__(self, cuda_index: int, interval_s: float = 0.05):
        self.nvml, self.handle = nvml_handle(cuda_index)
        self.interval_s = interval_s
        self._samples: list[tuple[float | None, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        nvml, handle = self.nvml, self.handle
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            sm, mem = float(util.gpu), float(util.memory)
        except Exception:
            sm = mem = None
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
        except Exception:
            power = None
        self._samples.append((sm, mem, power))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self.handle is None:
            return
        self._samples.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float | None]:
        """Means over the samples: sm_util_pct, mem_util_pct, power_w (None where unknown)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            if not self._samples:
                self._sample()
        keys = ("sm_util_pct", "mem_util_pct", "power_w")
        result: dict[str, float | None] = {}
        for i, key in enumerate(keys):
            values = [s[i] for s in self._samples if s[i] is not None]
            result[key] = sum(values) / len(values) if values else None
        return result
