"""Shared fixtures: scenario files written into tmp_path."""
from __future__ import annotations

import textwrap

import pytest

SMALL = """
name = "small"
seed = 0
[model]
preset = "tiny"
seq_len = 64
dtype = "fp32"
[training]
rounds = 2
local_steps = 10
batch_size = 4
[network]
bandwidth_gbps = 1.0
latency_ms = 1.0
[[nodes]]
name = "a"
gpus = { "cpu" = 1 }
step_time_s = 0.1
[[nodes]]
name = "b"
gpus = { "cpu" = 1 }
step_time_s = 0.2
[[nodes]]
name = "c"
gpus = { "cpu" = 1 }
step_time_s = 0.25
"""


@pytest.fixture
def write_scenario(tmp_path):
    """write_scenario(text) -> path of a scenario file holding the dedented text."""
    def write(text: str = SMALL, name: str = "scenario.toml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write
