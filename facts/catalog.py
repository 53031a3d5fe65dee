"""The GPU catalog: datasheet figures per GPU, read from `gpu_catalog.csv` without torch.

One row per GPU, keyed by a catalog key (lower case, words joined by hyphens: `rtx-2080-ti`,
`a100-80gb`, `h100-sxm`). The simulator imports this module, so it must stay torch-free: it
uses only the standard library.

Conventions of the columns (all throughput figures are peak figures at the boost clock in
`boost_clock_mhz`, in 10^12 FLOP/s, and DENSE: NVIDIA's headline tensor figures for Ampere
and later are "with sparsity" (2:4 structured sparsity), twice the dense rate; they are
halved here):

- `memory_gb`: memory as marketed (GPU vendors' "GB" here means 2^30 bytes: an "11 GB"
  RTX 2080 Ti has 11264 MiB; the driver reports slightly less as usable).
- `memory_bandwidth_gbs`: peak memory bandwidth in GB/s (10^9 bytes/s).
- `fp32_tflops`: FP32 on the CUDA cores (non-tensor; TF32 is not used by the estimates).
- `fp16_tflops`: dense tensor FP16 with FP32 accumulate. This is the rate mixed-precision
  training (torch autocast, fp32 master weights) reaches, and what estimates should use.
- `fp16_acc16_tflops`: dense tensor FP16 with FP16 accumulate: the datasheet headline.
  GeForce and Titan cards (RTX 2080 Ti, RTX 3090, RTX 4090) run FP16 with FP32 accumulate
  at HALF this rate; TITAN RTX and the data-center and professional cards run both at the
  same rate.
- `bf16_tflops`: dense tensor BF16 (always with FP32 accumulate); empty where the GPU has no
  BF16 tensor support (Pascal, Volta, Turing), and then `bf16_supported` is false.
- `paper_tflops`: the figure paper 000 used for its five GPUs (2080 Ti 113.8, TITAN RTX 130,
  A30 165, RTX 3090 142, V100 125: FP16-accumulate headlines, BF16 for the A30; the 125 also
  on `v100-pcie`, the card geodt takes the paper's V100 to be); empty for every other GPU.
  Kept so the paper's tables can be reproduced.
- `intra_node_gbps`: the link between two GPUs of one node, per direction, in Gbit/s, as the
  intra-node gradient all-reduce sees it: NVLink for SXM parts (V100 SXM2 1200: NVLink 2, 150
  GB/s per direction; A100 SXM4 2400: NVLink 3; H100 SXM5 and H200 3600: NVLink 4, 450 GB/s),
  100 for every PCIe card (PCIe 3.0 x16 through the host, effective; kept at geodt's earlier
  fixed figure for all PCIe parts). A node mixing GPU types uses its slowest link.
- `nominal`: true for rows that describe no real product (`cpu`: a generic 2-core x86
  laptop-class CPU, so that CPU-emulated nodes can be described).
- `source`, `notes`: where the figures come from and what to know about them.

The TITAN Xp (Pascal) has no tensor cores; its native FP16 rate is 1/64 of FP32 and is
recorded as such. `cpu` has no half-precision matrix units: its fp16 columns are empty.

Two ways to read a GPU's speed, for two different uses:

- `peak_tflops(spec, dtype)`: the correct dense peak a training step in that dtype can
  reach. geodt's own estimates use it.
- `spec_tflops(spec, dtype)`: the figure the paper's convention uses (its figure where it
  has one, else the datasheet headline). Strategies `A` and `C` use it, as the paper did.
"""
from __future__ import annotations

import csv
import difflib
import math
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from formats.wire import MODEL_DTYPES

CATALOG_PATH = Path(__file__).with_name("gpu_catalog.csv")


_KEY_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class CatalogError(ValueError):
    """An unknown GPU key or dtype, or a malformed catalog file."""


@dataclass(frozen=True)
class GpuSpec:
    """One catalog row; see the module docstring for units and conventions. None = empty."""

    key: str
    name: str
    memory_gb: float
    memory_bandwidth_gbs: float
    fp32_tflops: float
    fp16_tflops: float | None
    fp16_acc16_tflops: float | None
    bf16_tflops: float | None
    bf16_supported: bool
    paper_tflops: float | None
    boost_clock_mhz: float | None
    intra_node_gbps: float
    nominal: bool
    source: str
    notes: str

    def __post_init__(self) -> None:
        where = f"GPU {self.key!r}"
        if not _KEY_RE.match(self.key):
            raise CatalogError(f"{where}: key must be lower case words joined by hyphens")
        if not self.name.strip():
            raise CatalogError(f"{where}: name must not be empty")
        if not self.source.strip():
            raise CatalogError(f"{where}: source must not be empty")
        for f in fields(self):
            value = getattr(self, f.name)
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if numeric and not (math.isfinite(value) and value > 0):
                raise CatalogError(f"{where}: {f.name} must be a positive number, got {value!r}")
        if self.bf16_supported != (self.bf16_tflops is not None):
            raise CatalogError(f"{where}: bf16_supported must be true exactly when bf16_tflops is given")
        if (self.fp16_tflops is None) != (self.fp16_acc16_tflops is None):
            raise CatalogError(f"{where}: fp16_tflops and fp16_acc16_tflops must both be given or both empty")
        if self.fp16_tflops is not None and self.fp16_tflops > self.fp16_acc16_tflops:
            raise CatalogError(f"{where}: fp16_tflops (FP32 accumulate) must not exceed fp16_acc16_tflops")

    @property
    def memory_bytes(self) -> int:
        """Marketed memory in bytes (memory_gb x 2^30); usable memory is a little less."""
        return int(self.memory_gb * 2**30)

    @property
    def has_tensor_cores(self) -> bool:
        """Whether half-precision matrix math runs faster than FP32 (tensor cores)."""
        return self.fp16_tflops is not None and self.fp16_tflops > self.fp32_tflops


_COLUMNS = tuple(f.name for f in fields(GpuSpec))
_FLOAT_COLUMNS = ("memory_gb", "memory_bandwidth_gbs", "fp32_tflops", "intra_node_gbps")
_OPTIONAL_FLOAT_COLUMNS = ("fp16_tflops", "fp16_acc16_tflops", "bf16_tflops", "paper_tflops", "boost_clock_mhz")
_BOOL_COLUMNS = ("bf16_supported", "nominal")


def _parse_row(path: Path, line: int, row: dict[str, str]) -> GpuSpec:
    key = row["key"].strip()
    where = f"{path}: line {line} (GPU {key!r})"
    values: dict[str, object] = {"key": key, "name": row["name"].strip(),
                                 "source": row["source"].strip(), "notes": row["notes"].strip()}
    for column in _FLOAT_COLUMNS + _OPTIONAL_FLOAT_COLUMNS:
        text = row[column].strip()
        if not text and column in _OPTIONAL_FLOAT_COLUMNS:
            values[column] = None
            continue
        try:
            values[column] = float(text)
        except ValueError:
            raise CatalogError(f"{where}: column {column}: expected a number, got {text!r}") from None
    for column in _BOOL_COLUMNS:
        text = row[column].strip().lower()
        if text not in ("true", "false"):
            raise CatalogError(f"{where}: column {column}: expected true or false, got {text!r}")
        values[column] = text == "true"
    try:
        return GpuSpec(**values)
    except CatalogError as exc:
        raise CatalogError(f"{path}: line {line}: {exc}") from None


def read_catalog(path: Path | str) -> dict[str, GpuSpec]:
    """Read and validate a catalog CSV (uncached); CatalogError names the file, line and column."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = tuple(reader.fieldnames or ())
            if header != _COLUMNS:
                raise CatalogError(f"{path}: header: expected columns {', '.join(_COLUMNS)}; "
                                   f"got {', '.join(header) or 'none'}")
            catalog: dict[str, GpuSpec] = {}
            for row in reader:
                line = reader.line_num
                if None in row or any(value is None for value in row.values()):
                    raise CatalogError(f"{path}: line {line}: expected {len(_COLUMNS)} fields")
                spec = _parse_row(path, line, row)
                if spec.key in catalog:
                    raise CatalogError(f"{path}: line {line}: duplicate key {spec.key!r}")
                catalog[spec.key] = spec
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the GPU catalog ({exc.strerror or exc})") from None
    except csv.Error as exc:
        raise CatalogError(f"{path}: malformed CSV ({exc})") from None
    if not catalog:
        raise CatalogError(f"{path}: expected at least one GPU row")
    return catalog


@lru_cache(maxsize=1)
def _shipped_catalog() -> tuple[GpuSpec, ...]:
    return tuple(read_catalog(CATALOG_PATH).values())


def load_catalog() -> dict[str, GpuSpec]:
    """The shipped catalog, key -> GpuSpec, in file order (read once; a fresh dict each call)."""
    return {spec.key: spec for spec in _shipped_catalog()}


def gpu_keys() -> list[str]:
    """All catalog keys, sorted."""
    return sorted(spec.key for spec in _shipped_catalog())


@lru_cache(maxsize=1)
def _by_key() -> dict[str, GpuSpec]:
    return {spec.key: spec for spec in _shipped_catalog()}


def get_gpu(key: str) -> GpuSpec:
    """The catalog entry of `key`; CatalogError naming the closest keys (difflib) if there is none."""
    spec = _by_key().get(key) if isinstance(key, str) else None
    if spec is not None:
        return spec

    close = difflib.get_close_matches(str(key).lower(), gpu_keys(), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise CatalogError(f"unknown GPU {key!r}; {hint}expected one of {', '.join(gpu_keys())}")


def _check_dtype(dtype: str) -> None:
    if dtype not in MODEL_DTYPES:
        raise CatalogError(f"unknown dtype {dtype!r}; expected one of {', '.join(MODEL_DTYPES)}")


def peak_tflops(spec: GpuSpec, dtype: str) -> float:
    """The dense peak TFLOPS a training step in `dtype` can reach on this GPU.

    - bf16: `bf16_tflops` where BF16 tensor math exists. Elsewhere (Pascal, Volta, Turing,
      `cpu`) bf16 is emulated: matmuls upcast and run no faster than FP32 (often slower), so
      the FP32 figure is the ceiling.
    - fp16: `fp16_tflops` (tensor FP16 with FP32 accumulate, which autocast uses: on GeForce
      cards half the headline), but never below FP32: without tensor cores (TITAN Xp, `cpu`)
      mixed-precision GEMMs compute in FP32, so the crippled native FP16 rate does not apply
      and FP32 is the ceiling.
    - fp32: `fp32_tflops`.
    """
    _check_dtype(dtype)
    if dtype == "bf16":
        return spec.bf16_tflops if spec.bf16_tflops is not None else spec.fp32_tflops
    if dtype == "fp16":
        return max(spec.fp16_tflops or 0.0, spec.fp32_tflops)
    return spec.fp32_tflops


def spec_tflops(spec: GpuSpec, dtype: str) -> float:
    """The TFLOPS figure the paper's convention uses (strategies `A` and `C`).

    - bf16 / fp16: `paper_tflops` where the paper gave one (its column is "FP16/BF16 TFLOPS",
      one figure per GPU whatever the dtype, so the paper's tables reproduce under either).
      Otherwise the datasheet headline: `fp16_acc16_tflops` for fp16, `bf16_tflops` for bf16;
      where there is no such figure or it is below FP32 (no BF16 support, no tensor cores),
      the FP32 figure, for the reason given in `peak_tflops`.
    - fp32: `fp32_tflops` (the paper's figures are half-precision figures and do not apply).
    """
    _check_dtype(dtype)
    if dtype == "fp32":
        return spec.fp32_tflops
    if spec.paper_tflops is not None:
        return spec.paper_tflops
    headline = spec.fp16_acc16_tflops if dtype == "fp16" else spec.bf16_tflops
    return max(headline or 0.0, spec.fp32_tflops)
