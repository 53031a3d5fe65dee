"""simulator/outputs/outputs.py's csv_bytes: the same bytes as pandas' to_csv(index=False, float_format="%.9g").

The fast path formats column by column; every committed CSV must come out byte for byte as
pandas wrote it before, so frames of every column kind the code writes (floats with and
without NaN, inf, -0.0, ints, bools, text that needs quoting, categoricals, text with gaps)
are compared with pandas' own output.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.outputs.outputs import csv_bytes


def pandas_csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False, float_format="%.9g").encode()


TEXT = st.text(alphabet=st.sampled_from(list("ab ,\"\n\r'x-1é")), max_size=6)
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def frames(draw):
    rows = draw(st.integers(0, 12))
    kinds = draw(st.lists(st.sampled_from(["float", "float_nan", "int", "bool", "text", "text_gaps", "category",
                                           "float32"]), min_size=2, max_size=6))
    data = {}
    for j, kind in enumerate(kinds):
        name = draw(TEXT) + str(j)
        if kind == "float":
            values = draw(st.lists(st.floats(allow_nan=False, width=64), min_size=rows, max_size=rows))
            data[name] = np.array(values, dtype=float)
        elif kind == "float_nan":
            data[name] = np.array(draw(st.lists(FLOATS, min_size=rows, max_size=rows)), dtype=float)
        elif kind == "float32":
            data[name] = np.array(draw(st.lists(st.floats(allow_nan=False, width=32), min_size=rows, max_size=rows)),
                                  dtype=np.float32)
        elif kind == "int":
            data[name] = np.array(draw(st.lists(st.integers(-2**62, 2**62), min_size=rows, max_size=rows)),
                                  dtype=np.int64)
        elif kind == "bool":
            data[name] = np.array(draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), dtype=bool)
        elif kind == "text":
            data[name] = draw(st.lists(TEXT, min_size=rows, max_size=rows))
        elif kind == "text_gaps":
            data[name] = pd.Series(draw(st.lists(st.one_of(TEXT, st.none()), min_size=rows, max_size=rows)),
                                   dtype=object)
        else:
            data[name] = pd.Categorical(draw(st.lists(st.sampled_from(["n1", "a,b", 'q"t', ""]),
                                                      min_size=rows, max_size=rows)))
    return pd.DataFrame(data)


@settings(max_examples=300, deadline=None)
@given(frames())
def test_same_bytes_as_pandas(frame):
    assert csv_bytes(frame) == pandas_csv(frame)


def test_timeline_and_plan_frames():
    from simulator.engines.engine import simulate, summary
    from simulator.scenario import load_scenario
    from simulator.strategies import STRATEGIES, make_plan

    scenario = load_scenario("paper")
    for strategy in STRATEGIES:
        plan = make_plan(scenario, strategy)
        timeline = simulate(scenario, plan, "simpy")  # categorical strategy and node columns
        for frame in (timeline, summary(timeline, plan), plan.to_frame(scenario)):
            assert csv_bytes(frame) == pandas_csv(frame)


def test_fallbacks_still_match():
    one_column = pd.DataFrame({"a": ["", "x"]})  # csv writes a lone empty cell as ""
    mixed = pd.DataFrame({"a": [1.5, "x", None], "b": [1, 2, 3]})  # object column holding a float
    dates = pd.DataFrame({"a": pd.to_datetime(["2026-01-01", "2026-01-02"]), "b": [1.0, 2.0]})
    for frame in (one_column, mixed, dates):
        assert csv_bytes(frame) == pandas_csv(frame)
