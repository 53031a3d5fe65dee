"""The stacks the catalog estimate prices ([training] stack) and each fitted stack's fit (facts/stack_fits.csv).

- geodt: geodt's own step (train/step.py), the one `geodt run` executes: eager or compiled as
  [training] compile says (simulator/models/estimate.py STEPS). Nothing fitted: every constant is a
  datasheet figure, a published kernel efficiency or an op count of that step.
- torchtitan-eager: torchtitan's FSDP2 step without torch.compile (its published Llama runs on
  A100 and H100 GPUs, benchmarks/estimate/published_throughput.csv, stack torchtitan-eager). Priced
  as the lean step with its activation and loss traffic B_act times `act_bytes_scale`: its eager
  elementwise kernels (RMSNorm, rotary, SwiGLU, the loss) move more than the lean count, and the
  larger the GPU's FLOPs per byte, the more that costs. The scale is fitted by
  benchmarks/fit_stacks.py to the rows marked `fit` (least squares of log error); the rows marked
  `held-out` are not used, and benchmarks/bench_bands.py reports whether they land inside the band.

A planning stack other than geodt prices GPU catalog nodes only (the published runs are GPU runs; a
`cpu` node keeps geodt's step), and `geodt run` refuses it: the executor runs geodt's step.
"""
from __future__ import annotations

import csv
import functools
from pathlib import Path

from formats.sections import EXECUTED_STACK, STACKS

FITS_CSV = Path(__file__).with_name("stack_fits.csv")
FIT_COLUMNS = ["stack", "act_bytes_scale", "fit_rows", "held_out_rows", "record"]
GEODT = EXECUTED_STACK
FITTED_STACKS = tuple(s for s in STACKS if s != GEODT)
# How a printed band names a fitted stack ("catalog estimate of torchtitan eager").
STACK_LABELS = {"torchtitan-eager": "torchtitan eager"}


@functools.cache
def load_fits(path: Path = FITS_CSV) -> dict[str, float]:
    """Fitted stack -> its act_bytes_scale (facts/stack_fits.csv, written by benchmarks/fit_stacks.py)."""
    with path.open(newline="", encoding="utf-8") as fh:
        return {r["stack"]: float(r["act_bytes_scale"]) for r in csv.DictReader(fh)}


def act_bytes_scale(stack: str) -> float:
    """The factor on the lean step's B_act that prices `stack` (1 for geodt's own step)."""
    if stack == GEODT:
        return 1.0
    if stack not in FITTED_STACKS:
        raise ValueError(f"unknown stack {stack!r}; expected one of {', '.join(STACKS)}")
    return load_fits()[stack]


def band_source(stack: str) -> str:
    """The source a fitted stack's catalog band is looked up by in facts/error_bands.csv."""
    return f"catalog-{stack}"
