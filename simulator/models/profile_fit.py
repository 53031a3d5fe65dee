"""Calibration profiles as a timing and memory model t(b), m(b) (torch-free: the simulator reads it).

A profile is the tidy CSV `geodt calibrate` writes (docs/DESIGN.md, "Profiles"): one row per batch
size tried, OOM rows included. `ProfileModel` turns it into

- step_s(b): exact at measured batches, piecewise linear between them, and the affine
  least-squares fit t0 + c·b outside them (above the largest and below the smallest). The fit
  minimises relative residuals (weights 1/t): step times span orders of magnitude across
  batches, and a plain fit lets the largest batches decide the line, which then misses the
  smallest by far (on a real CPU profile, 73% at batch 1 against 17% worst with weights);
- peak_mem_bytes(b): the same scheme over the rows that carry memory;
- fits(b) / max_batch(): OOM rows bound the batch; the memory model and the device's total
  memory bound it where no OOM was seen;
- compiled: whether the profiled step ran torch.compile'd blocks ([training] compile); startup_s:
  the largest one-time cost a row's warm-up paid beyond its steady steps (warmup_s − warmup_steps
  × the row's mean step: the process's CUDA initialisation on the first row, each batch's compile
  when compiled), what a run's first round pays once; 0 where the profile has no warm-up columns.

`leave_one_out` predicts each measured step time from the other rows (`geodt profile check`).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from facts.catalog import CatalogError, get_gpu, load_catalog
from facts.presets import PresetError, load_arch
from formats.profile import CHECKPOINT_COLUMNS, IDENTITY, OUTER_STEP_COLUMNS, ProfileError, read_profile_frame
from formats.wire import MODEL_DTYPES

_BOOL = {"true": True, "false": False, "1": True, "0": False}
# Upper bound of the search for the largest batch allowed by the memory model alone.
_SEARCH_CAP = 1 << 24


def _number(path, row: int, column: str, text: str, *, required: bool, positive: bool = True) -> float | None:
    if text.strip() == "":
        if required:
            raise ProfileError(f"{path}: row {row} {column}: empty; expected a number")
        return None
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{path}: row {row} {column}: {text!r}; expected a number") from None
    if not math.isfinite(value) or (positive and value <= 0):
        raise ProfileError(f"{path}: row {row} {column}: {text!r}; expected a positive finite number")
    return value


class _Curve:
    """Piecewise-linear interpolation inside the measured points, affine least squares outside."""

    def __init__(self, xs: np.ndarray, ys: np.ndarray):
        order = np.argsort(xs)
        self.xs, self.ys = xs[order].astype(float), ys[order].astype(float)
        if len(self.xs) >= 2:
            slope, intercept = np.polyfit(self.xs, self.ys, 1, w=1.0 / self.ys)
            self.intercept, self.slope = float(intercept), float(slope)
        else:
            # One point cannot fix a fixed cost: assume none (t proportional to b).
            self.intercept, self.slope = 0.0, float(self.ys[0] / self.xs[0])

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if xs[0] <= x <= xs[-1]:
            return float(np.interp(x, xs, ys))
        value = self.intercept + self.slope * x
        if value <= 0:
            # A fit with a negative fixed cost, far below the data: scale the nearest point.
            near = 0 if x < xs[0] else -1
            value = float(ys[near] * x / xs[near])
        return value


# A calibrated training step slower than this is a unit slip (milliseconds written as seconds), not a
# measurement: calibrate times single steps of batches that fit, seconds each on the slowest devices.
MAX_STEP_S = 60.0


def _peak_flops(gpu_key: str) -> float:
    """The most FLOP/s the profile's device can do at any precision: its catalog entry's largest
    figure, or for a nominal entry (a CPU) or an unknown key the fastest device in the catalog."""
    def best(spec) -> float:
        figures = (spec.fp32_tflops, spec.fp16_tflops, spec.fp16_acc16_tflops, spec.bf16_tflops)
        return 1e12 * max(f for f in figures if f is not None)
    try:
        spec = get_gpu(gpu_key)
    except CatalogError:
        spec = None
    if spec is not None and not spec.nominal:
        return best(spec)
    return max(best(s) for s in load_catalog().values())


def check_step_units(source: str, batches: list[int], times: list[float], gpu_key: str, model: str,
                     seq_len: int) -> None:
    """Refuse (ProfileError, one line) step times no device could have measured: slower than
    MAX_STEP_S, or more training FLOPs per second (Kaplan's 6·N + attention, a floor on the step's
    work) than the device's peak: a profile written in milliseconds, or scaled."""
    for batch, step_s in zip(batches, times):
        if step_s > MAX_STEP_S:
            raise ProfileError(f"{source}: column 'step_s_median': batch {batch}: {step_s:g} s; expected seconds, "
                               f"under {MAX_STEP_S:g} (is it in milliseconds?)")
    try:
        flops_per_sample = load_arch(model).train_flops_per_token(seq_len) * seq_len
    except (PresetError, OSError, ValueError):
        return  # a model geodt cannot count: only the minute applies
    peak = _peak_flops(gpu_key)
    for batch, step_s in zip(batches, times):
        achieved = flops_per_sample * batch / step_s
        if achieved > peak:
            raise ProfileError(f"{source}: column 'step_s_median': batch {batch}: {step_s:.3g} s would be "
                               f"{achieved / 1e12:,.0f} TFLOP/s of {model}, beyond the device's peak "
                               f"({peak / 1e12:,.0f}); expected seconds (is it scaled?)")


def _measured_rows(frame: pd.DataFrame, source: str) -> tuple[list, ...]:
    """The rows checked one by one: (batches, step times, memories, their batches, OOM batches,
    devices' total memories, step CVs)."""
    batches, times, mems, mem_batches, ooms, totals, cvs = [], [], [], [], [], [], []
    for i, row in enumerate(frame.to_dict("records"), start=1):
        try:
            batch = int(row["batch_size"])
        except ValueError:
            batch = 0
        if batch <= 0:
            raise ProfileError(f"{source}: row {i} batch_size: {row['batch_size']!r}; expected a positive integer")
        oom = _BOOL.get(row["oom"].strip().lower())
        if oom is None:
            raise ProfileError(f"{source}: row {i} oom: {row['oom']!r}; expected true or false")
        total = _number(source, i, "mem_total_bytes", row["mem_total_bytes"], required=False)
        if total is not None:
            totals.append(total)
        if batch in batches or batch in ooms:
            raise ProfileError(f"{source}: row {i} batch_size: {batch} appears twice; expected one row per batch")
        if oom:
            ooms.append(batch)
            continue
        batches.append(batch)
        # Rounds sum their steps, so the mean is what predicts them: step times under a CPU quota
        # or a shared host skew right, where the median runs 2-5% below the mean (measured here).
        median = _number(source, i, "step_s_median", row["step_s_median"], required=True)
        mean = _number(source, i, "step_s_mean", row["step_s_mean"], required=False)
        times.append(median if mean is None else mean)
        p10 = _number(source, i, "step_s_p10", row["step_s_p10"], required=False)
        p90 = _number(source, i, "step_s_p90", row["step_s_p90"], required=False)
        # A normal's p90 − p10 spans 2 × 1.2816 σ: the step's coefficient of variation.
        cvs.append(max(0.0, p90 - p10) / (2 * 1.2816 * times[-1]) if p10 and p90 else 0.0)
        mem = _number(source, i, "peak_mem_bytes", row["peak_mem_bytes"], required=False)
        if mem is not None:
            mems.append(mem)
            mem_batches.append(batch)
    return batches, times, mems, mem_batches, ooms, totals, cvs


class ProfileModel:
    """Step time and memory per batch size of one device, from a calibration profile."""

    def __init__(self, frame: pd.DataFrame, source: str = "<profile>"):
        """Build from a frame of profile rows (strings, as `read_profile_frame` returns)."""
        self.source = source
        frame = frame.astype(str)
        if len(frame) == 0:
            raise ProfileError(f"{source}: no rows; expected at least one measured batch size")
        for column in IDENTITY:
            values = sorted(set(frame[column]))
            if len(values) != 1:
                raise ProfileError(f"{source}: column {column!r} holds {values}; expected one value "
                                   "(one device, model, seq_len and dtype per profile)")
        first = frame.iloc[0]
        self.device_name: str = first["device_name"]
        self.gpu_key: str = first["gpu_key"]
        self.model: str = first["model"]
        self.dtype: str = first["dtype"]
        if self.dtype not in MODEL_DTYPES:
            raise ProfileError(f"{source}: column 'dtype': {self.dtype!r}; expected one of {', '.join(MODEL_DTYPES)}")
        self.seq_len = int(_number(source, 1, "seq_len", first["seq_len"], required=True))
        compiled_text = str(first["compiled"]).strip().lower() if "compiled" in frame.columns else ""
        compiled = _BOOL.get(compiled_text or "false")  # empty: a step from before the column, eager
        if compiled is None:
            raise ProfileError(f"{source}: column 'compiled': {first['compiled']!r}; expected true or false")
        self.compiled: bool = compiled
        self.startup_s: float = _startup_s(frame, source)
        # the host's outer step ("cpu" / "device" -> ns per parameter) and checkpoint ("snapshot" /
        # "write" -> ns per byte), where measured
        self.outer_step_ns_per_param: dict[str, float] = _host_figures(frame, first, source, OUTER_STEP_COLUMNS)
        self.checkpoint_ns_per_byte: dict[str, float] = _host_figures(frame, first, source, CHECKPOINT_COLUMNS)
        self.warmup_measured: bool = bool("warmup_s" in frame.columns and (frame["warmup_s"].str.strip() != "").any())

        batches, times, mems, mem_batches, ooms, totals, cvs = _measured_rows(frame, source)
        if not batches:
            raise ProfileError(f"{source}: column 'step_s_median': no batch ran without OOM; "
                               "expected at least one timed batch")
        check_step_units(source, batches, times, self.gpu_key, self.model, self.seq_len)
        if ooms and min(ooms) <= max(batches):
            raise ProfileError(f"{source}: column 'oom': batch {min(ooms)} ran out of memory but "
                               f"{max(batches)} did not; expected OOM only above every fitting batch")
        self.mem_total_bytes: float | None = min(totals) if totals else None
        self.measured_batches: tuple[int, ...] = tuple(sorted(batches))
        self.oom_batches: tuple[int, ...] = tuple(sorted(ooms))
        self._time = _Curve(np.array(batches), np.array(times))
        self._mem = _Curve(np.array(mem_batches), np.array(mems)) if mems else None
        self._measured_time = dict(zip(batches, times))
        order = np.argsort(batches)
        self._cv_batches, self._cvs = np.array(batches, float)[order], np.array(cvs)[order]

    @classmethod
    def from_csv(cls, path: str | Path, *, seq_len: int | None = None, dtype: str | None = None,
                 model: str | None = None, compiled: bool | None = None) -> ProfileModel:
        """Read and check a profile; one measured at another seq_len/dtype/model, or with another
        step (compiled or not), is an error."""
        profile = cls(read_profile_frame(path), source=str(path))
        words = {True: "true", False: "false", None: None}
        for column, want, have in (("seq_len", seq_len, profile.seq_len), ("dtype", dtype, profile.dtype),
                                   ("model", model, profile.model),
                                   ("compiled", words[compiled], words[profile.compiled])):
            if want is not None and str(want) != str(have):
                raise ProfileError(f"{path}: column {column!r}: measured at {have!r}; expected {want!r} "
                                   "(recalibrate for this scenario)")
        return profile

    def step_s(self, batch: int) -> float:
        """Seconds per training step at this batch size (see the module docstring)."""
        if batch <= 0:
            raise ValueError(f"batch {batch}: expected a positive integer")
        return self._time(batch)

    def step_cv(self, batch: int) -> float:
        """Coefficient of variation of one step, from the p10/p90 spread of the measured steps
        (interpolated between measured batches, held at the ends)."""
        return float(np.interp(batch, self._cv_batches, self._cvs))

    def fit(self) -> tuple[float, float]:
        """(t0_s, per_sample_s): the affine least-squares fit t0 + c·b of the measured step times."""
        return self._time.intercept, self._time.slope

    def peak_mem_bytes(self, batch: int) -> float | None:
        """Peak memory at this batch size, or None when the profile records no memory (CPU)."""
        if batch <= 0:
            raise ValueError(f"batch {batch}: expected a positive integer")
        return None if self._mem is None else self._mem(batch)

    def fits(self, batch: int) -> bool:
        """Whether a step at this batch size fits in the device's memory."""
        if self.oom_batches and batch >= self.oom_batches[0]:
            return False
        if batch in self._measured_time:
            return True
        mem = self.peak_mem_bytes(batch)
        return not (mem is not None and self.mem_total_bytes is not None and mem > self.mem_total_bytes)

    def max_batch(self) -> int | None:
        """The largest batch known to fit; None when nothing bounds it (no OOM, no memory model)."""
        has_memory_model = self._mem is not None and self.mem_total_bytes is not None
        if not self.oom_batches and not has_memory_model:
            return None
        lo = max(self.measured_batches)  # measured without OOM, so it fits
        if not has_memory_model:
            return lo
        hi = self.oom_batches[0] if self.oom_batches else _SEARCH_CAP
        if self.fits(hi - 1):
            if not self.oom_batches:
                return None  # the memory model never reaches the device's total
            return hi - 1
        while hi - lo > 1:  # fits(lo) and not fits(hi): memory grows with the batch
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fits(mid) else (lo, mid)
        return lo

    def measured_step_s(self) -> dict[int, float]:
        """The measured median step time of each non-OOM batch."""
        return dict(sorted(self._measured_time.items()))


def _host_figures(frame: pd.DataFrame, first, source: str, columns: dict[str, str]) -> dict[str, float]:
    """{name: figure} of the whole-profile columns that hold one (empty cells: not measured)."""
    figures = {}
    for name, column in columns.items():
        text = str(first[column]).strip() if column in frame.columns else ""
        if text:
            figures[name] = _number(source, 1, column, text, required=True)
    return figures


def _startup_s(frame: pd.DataFrame, source: str) -> float:
    """The largest warm-up cost beyond steady steps over the rows that record it (module docstring)."""
    extra = [0.0]
    for i, row in enumerate(frame.to_dict("records"), start=1):
        if _BOOL.get(row["oom"].strip().lower()) or not str(row.get("warmup_s", "")).strip():
            continue
        warmup_s = _number(source, i, "warmup_s", row["warmup_s"], required=True, positive=False)
        steps = _number(source, i, "warmup_steps", row["warmup_steps"], required=True, positive=False)
        mean = _number(source, i, "step_s_mean", row["step_s_mean"], required=False) or \
            _number(source, i, "step_s_median", row["step_s_median"], required=True)
        extra.append(max(0.0, warmup_s - steps * mean))
    return max(extra)


def leave_one_out(model_or_df: ProfileModel | pd.DataFrame) -> pd.DataFrame:
    """Predict each measured batch's step time from the other rows (needs two or more).

    Columns: batch_size, predicted_s, measured_s, error_pct (signed, of the measured value).
    A left-out end point is predicted by the fit of the others, an inner one by interpolation.
    """
    model = model_or_df if isinstance(model_or_df, ProfileModel) else ProfileModel(model_or_df, "<frame>")
    measured = model.measured_step_s()
    if len(measured) < 2:
        raise ProfileError(f"{model.source}: column 'batch_size': {len(measured)} timed batch; "
                           "expected at least 2 for leave-one-out")
    rows = []
    for batch, step_s in measured.items():
        others = {b: t for b, t in measured.items() if b != batch}
        curve = _Curve(np.array(list(others)), np.array(list(others.values())))
        predicted = curve(batch)
        rows.append({"batch_size": batch, "predicted_s": predicted, "measured_s": step_s,
                     "error_pct": 100.0 * (predicted - step_s) / step_s})
    return pd.DataFrame(rows, columns=["batch_size", "predicted_s", "measured_s", "error_pct"])
