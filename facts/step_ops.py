"""The eager training step's ops in dispatch order, each with its FLOPs and bytes, for any Llama shape.

Reads facts/step_ops.csv (written by benchmarks/trace_step_ops.py from a FakeTensorMode trace of
train/step.py's step): per attention variant (mha, gqa) and dtype, the step as segments of ops,
a segment either run once or repeated per decoder layer, each op's work a polynomial in the
model's sizes (b batch, s seq_len, h hidden, kv kv size, nh heads, nkv kv heads, hd head size,
f ffn, V vocabulary, L layers). `step_ops` evaluates them for one shape: the simulator's eager
step pipeline (simulator/models/estimate.py) reads the result. Torch-free.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

PATH = Path(__file__).with_name("step_ops.csv")
SYMBOLS = ("b", "s", "h", "kv", "nh", "nkv", "hd", "f", "V", "L")
PHASES = ("forward", "backward", "optimizer")


class StepOpsError(ValueError):
    """facts/step_ops.csv is unreadable or lacks what was asked."""


@dataclass(frozen=True)
class StepOps:
    """One shape's eager step: per op in dispatch order, its work at batch 0 and per sequence."""

    flops: np.ndarray        # (2, N): FLOPs independent of the batch, and per sequence
    bytes: np.ndarray        # (2, N): bytes read + written, likewise
    attention: np.ndarray    # (N,) bool: the op is attention (FLOPs at attention's rate)
    optimizer_ops: int       # the last optimizer_ops ops are the optimizer step (once per step, not per micro-step)

    @property
    def micro_ops(self) -> int:
        """Ops of one micro-step (forward and backward)."""
        return self.flops.shape[1] - self.optimizer_ops


def _terms(text: str, where: str) -> list[tuple[float, tuple[int, ...]]]:
    """"coef*sym*sym + ..." as (coefficient, exponent per SYMBOLS) terms."""
    terms = []
    for term in text.split(" + "):
        factors = term.split("*")
        try:
            coef = float(factors[0])
            powers = [0] * len(SYMBOLS)
            for sym in factors[1:]:
                powers[SYMBOLS.index(sym)] += 1
        except ValueError:
            raise StepOpsError(f"{where}: expected a polynomial in {', '.join(SYMBOLS)}, got {text!r}") from None
        terms.append((coef, tuple(powers)))
    return terms


@cache
def _table(path: Path = PATH) -> dict:
    """(variant, dtype) → (per-op (per_layer, segment, phase, attention), terms matrices) as read."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise StepOpsError(f"{path}: cannot read ({exc.strerror})") from None
    grouped: dict = {}
    for n, row in enumerate(rows, start=2):
        where = f"{path}:{n}"
        if row.get("phase") not in PHASES:
            raise StepOpsError(f"{where}: phase: expected one of {', '.join(PHASES)}")
        grouped.setdefault((row["variant"], row["dtype"]), []).append(
            (int(row["segment"]), row["per_layer"] == "1", row["phase"], row["kind"] == "attention",
             _terms(row["flops"], f"{where}: flops"), _terms(row["bytes"], f"{where}: bytes")))
    table = {}
    for key, ops in grouped.items():
        # every term of every op as rows: (op index, which: 0 flops / 1 bytes, coefficient, exponents)
        index = [(i, which, coef, powers)
                 for i, op in enumerate(ops) for which in (0, 1) for coef, powers in op[4 + which]]
        table[key] = ([op[:4] for op in ops], np.array([t[0] for t in index]), np.array([t[1] for t in index]),
                      np.array([t[2] for t in index]), np.array([t[3] for t in index], dtype=float))
    return table


@lru_cache(maxsize=256)
def step_ops(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq_len: int,
             dtype: str) -> StepOps:
    """The eager step of a Llama of these sizes (grouped-query attention when kv_heads < heads)."""
    variant = "gqa" if kv_heads < heads else "mha"
    if (variant, dtype) not in _table():
        raise StepOpsError(f"{PATH}: no {variant} {dtype} rows; regenerate with benchmarks/trace_step_ops.py")
    ops, op_index, which, coef, powers = _table()[(variant, dtype)]
    hd = hidden // heads
    values = {"s": seq_len, "h": hidden, "kv": kv_heads * hd, "nh": heads, "nkv": kv_heads, "hd": hd, "f": ffn,
              "V": vocab, "L": layers}
    work = np.zeros((2, 2, len(ops)))  # (batch 0 / per sequence, flops / bytes, op)
    for at_b, b in enumerate((0.0, 1.0)):
        base = np.array([b if sym == "b" else float(values[sym]) for sym in SYMBOLS])
        terms = coef * np.prod(base ** powers, axis=1)
        np.add.at(work[at_b], (which, op_index), terms)
    work[1] -= work[0]  # linear in b (checked when traced): the per-sequence part
    order = []  # op indices of the whole step: once-segments once, per-layer segments `layers` times
    segments: dict[int, list[int]] = {}
    for i, (segment, *_rest) in enumerate(ops):
        segments.setdefault(segment, []).append(i)
    for segment in sorted(segments):
        order += segments[segment] * (layers if ops[segments[segment][0]][1] else 1)
    order = np.array(order)
    optimizer = sum(1 for i in order if ops[i][2] == "optimizer")
    if any(ops[i][2] == "optimizer" for i in order[:len(order) - optimizer]):
        raise StepOpsError(f"{PATH}: {variant} {dtype}: optimizer ops before the end of the step")
    return StepOps(flops=work[:, 0, order], bytes=work[:, 1, order],
                   attention=np.array([ops[i][3] for i in order]), optimizer_ops=optimizer)
