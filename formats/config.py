"""Typed construction of frozen config dataclasses from TOML tables, with one-line errors.

`build(cls, table, key)` checks for unknown and missing keys, coerces TOML values to the
field's annotated type, then calls the dataclass (whose `__post_init__` checks ranges and
raises FieldError). Every error carries the dotted key it is about.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

from formats.errors import FieldError, did_you_mean

_MISSING = dataclasses.MISSING


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if tp in names:
        return names[tp]
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """value as type tp (int, float, str, bool, Optional[...], tuple[str, ...], dict[str, int], a config dataclass)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(args) == 1:  # Optional[X]: X's own error, with its own key (a list's index)
            return coerce(value, args[0], key)
        errors = []
        for arg in args:
            try:
                return coerce(value, arg, key)
            except FieldError as exc:
                errors.append(exc.expected)
        raise FieldError(key, " or ".join(errors))
    if origin is tuple:
        (item,) = {a for a in typing.get_args(tp) if a is not Ellipsis}
        if isinstance(value, (list, tuple)):
            return tuple(coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
        raise FieldError(key, f"expected a list, got {value!r}")
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise FieldError(key, f"expected a table like {{ \"name\" = 1 }}, got {value!r}")
        return {coerce(k, key_tp, key): coerce(v, value_tp, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):  # a table of its own (a list of them: tuple[cls, ...])
        return build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config type {tp!r}")
    raise FieldError(key, f"expected {_type_name(tp)}, got {value!r}")


@functools.cache
def _type_hints(cls: type) -> dict:
    """typing.get_type_hints, once per class: it evaluates every annotation (1 ms a call; a
    scenario of 4096 nodes builds 4096 NodeConfigs)."""
    return typing.get_type_hints(cls)


def build(cls: type, table: Any, key: str = "") -> Any:
    """An instance of dataclass cls from a TOML table; errors name `key` (dotted path)."""
    prefix = f"{key}." if key else ""
    if not isinstance(table, dict):
        raise FieldError(key or "(top level)", f"expected a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _type_hints(cls)
    for name in table:
        if name not in fields:
            raise FieldError(f"{prefix}{name}", f"unknown key; expected one of {', '.join(fields)}"
                             f"{did_you_mean(name, fields)}")
    kwargs = {}
    for name, field in fields.items():
        if name in table:
            kwargs[name] = coerce(table[name], hints[name], f"{prefix}{name}")
        elif field.default is _MISSING and field.default_factory is _MISSING:
            raise FieldError(f"{prefix}{name}", "missing; this key is required")
    try:
        return cls(**kwargs)
    except FieldError as exc:
        # __post_init__ names the field only; add the section it lives in
        raise FieldError(f"{prefix}{exc.key}", exc.expected) from None


def require_positive(obj: Any, *names: str) -> None:
    """FieldError for each named field that is not > 0 (None is allowed: it means unset)."""
    for name in names:
        value = getattr(obj, name)
        try:
            ok = value is None or (value > 0 and math.isfinite(value))
        except OverflowError:  # an integer beyond any float
            ok = False
        if not ok:
            raise FieldError(name, f"expected a positive finite number, got {value!r}")


def require_range(obj: Any, name: str, lo: float, hi: float, unit: str = "") -> None:
    """FieldError unless lo <= value <= hi (None is allowed: unset). Limits on sizes are checked up
    front, so that no later product overflows, runs out of memory or loses all precision."""
    value = getattr(obj, name)
    if value is not None and not (lo <= value <= hi):
        what = f"an integer from {lo} to {hi}" if isinstance(lo, int) and isinstance(hi, int) \
            else f"a number from {lo:g} to {hi:g}"
        raise FieldError(name, f"expected {what}{unit}, got {value!r}")


def require_choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise FieldError(name, f"expected one of {', '.join(choices)}, got {value!r}")


def as_table(obj: Any) -> dict:
    """A dataclass as a TOML-ready dict: None fields dropped, tuples as lists."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None or not f.init:
            continue
        if dataclasses.is_dataclass(value):
            value = as_table(value)
        elif isinstance(value, tuple):
            value = [as_table(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[f.name] = value
    return out
