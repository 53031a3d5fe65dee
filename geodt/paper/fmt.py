"""Formatting shared by the tables and the README: rounding as printed, markdown tables, CSV bytes."""
from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

import pandas as pd

from simulator.outputs.outputs import csv_bytes


def round_as_printed(x: float, places: int) -> float:
    """x rounded half-up at `places` decimals from its shortest repr (117.85 -> 117.9, as a person rounds)."""
    return float(Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def csv_text(frame: pd.DataFrame) -> str:
    """A table as CSV text: no index, floats to 9 significant digits (stable, loads straight into pandas)."""
    return csv_bytes(frame).decode()


def cell(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        text = f"{value:,.{digits}f}"
        return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # no "-0.00"
    return str(value)


def markdown(frame: pd.DataFrame, digits: dict[str, int] | None = None, default_digits: int = 2) -> str:
    """A DataFrame as a GitHub markdown table; numbers right-aligned, `digits` per column."""
    digits = digits or {}
    cols = list(frame.columns)
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c]) for c in cols]
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v.item() if hasattr(v, "item") else v, digits.get(c, default_digits))
                                       for c, v in zip(cols, row)) + " |")
    return "\n".join(lines)
