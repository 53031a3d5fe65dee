"""Streaming DiLoCo (real/streaming.py): layout, schedule, torchft's regression fixtures, and
executor runs (P = 1 against the classic loop bit for bit, payloads and collectives per
fragment, resume, overlap accounting, bad input)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from real.diloco import OuterState
from real.launch import launch
from real.options import ExecOptions
from real.plan import bytes_sent_per_sync
from real.streaming import FragmentedOuter, StreamingSpec, fragment_layout
from tests.test_real_runs import plan_text, scenario_text

FIXTURES = Path(__file__).parent / "fixtures" / "torchft"
FIXTURE_CASES = [(0, 0.0), (0, 0.5), (0, 1.0), (1, 0.0), (1, 0.5), (1, 1.0)]  # (τ, α) of files _0 .. _5


def test_layout_sequential_and_strided_with_embedding_first_and_head_last():
    names = ["model.embed_tokens.weight"] + [f"model.layers.{l}.{w}.weight" for l in range(4) for w in ("q", "mlp")] \
        + ["model.norm.weight", "lm_head.weight"]
    layer = lambda i: [1 + 2 * i, 2 + 2 * i]
    assert fragment_layout(names, 2, "sequential") == [[0] + layer(0) + layer(1), layer(2) + layer(3) + [9, 10]]
    assert fragment_layout(names, 2, "strided") == [[0] + layer(0) + layer(2), layer(1) + layer(3) + [9, 10]]
    assert fragment_layout(names, 3, "sequential") == [[0] + layer(0) + layer(1), layer(2), layer(3) + [9, 10]]
    assert fragment_layout(names, 1, "strided") == [list(range(11))]
    with pytest.raises(ValueError, match="fragments: expected at most the model's 4 layers"):
        fragment_layout(names, 5, "sequential")


def test_spec_schedule_and_validation():
    assert StreamingSpec(2, 1).schedule(6) == [(2, 3), (5, 6)]
    assert StreamingSpec(3, 0).schedule(7) == [(2, 2), (4, 4), (7, 7)]  # ⌊(k+1)·H/P⌋
    assert StreamingSpec().classic and not StreamingSpec(fragment_alpha=0.5).classic
    StreamingSpec(2, 1).check([4, 6], layers=2)
    with pytest.raises(ValueError, match="sync_delay_steps: expected less than local_steps / fragments = 2"):
        StreamingSpec(2, 2).check([4, 6], layers=2)
    with pytest.raises(ValueError, match="fragments: expected at most the model's 2 layers"):
        StreamingSpec(3).check([6], layers=2)
    for bad in ({"fragments": 0}, {"sync_delay_steps": -1}, {"fragment_alpha": 1.5}, {"fragment_pattern": "random"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StreamingSpec(**bad)


class _Plan:  # a plan object with the streaming attributes (the plan schema's names)
    fragments, sync_delay_steps, fragment_alpha, fragment_pattern = 2, 1, 0.5, "strided"


def test_spec_from_plan_reads_the_attributes_and_defaults_to_classic():
    assert StreamingSpec.from_plan(_Plan()) == StreamingSpec(2, 1, 0.5, "strided")
    assert StreamingSpec.from_plan(object()) == StreamingSpec()


@pytest.mark.parametrize("case", range(6))
def test_reproduces_torchft_regression_fixture(case):
    """torchft's mocked DiLoCo run (tests/fixtures/torchft/README.md) through FragmentedOuter:
    every replica's weights after every step, and the global weights after every sync, exactly
    (the values are small dyadic fractions, exact in fp32; torchft itself allows 1e-5)."""
    tau, alpha = FIXTURE_CASES[case]
    path = FIXTURES / f"torchft.diloco_regression_test.DiLoCoMockedUpdateTest.test_diloco_mocked_updates_{case}.json"
    fixture = json.loads(path.read_text())
    spec, sync_every = StreamingSpec(2, tau, alpha), 6
    names = ["layers.0.weight", "layers.1.weight"]
    replicas = []
    for _ in fixture:
        params = [torch.ones(1, 1) for _ in names]
        replicas.append((params, FragmentedOuter(OuterState(params), fragment_layout(names, 2, "sequential"))))
    history = {0: [[p.tolist() for p in params] for params, _ in replicas]}
    global_history = {0: [[o.outer.global_flat[i:i + 1].view(1, 1).tolist() for i in range(2)] for _, o in replicas]}
    prepare_at = {p: k for k, (p, _) in enumerate(spec.schedule(sync_every))}
    sync_at = {s: k for k, (_, s) in enumerate(spec.schedule(sync_every))}
    average = None
    for step in range(1, 16):
        for params, _ in replicas:
            for p in params:
                p.add_(torch.full_like(p, 2.0), alpha=-1.0)  # the mock inner step: lr 1, gradient 2
        s = (step - 1) % sync_every + 1
        if s in prepare_at:
            deltas = [o.pseudo_gradient(prepare_at[s], 1.0).clone() for _, o in replicas]
            average = sum(deltas[1:], deltas[0]) / len(deltas)  # torchft's manager: sum, then / replicas
        if s in sync_at:
            for _, o in replicas:
                o.apply(sync_at[s], average.clone(), lr=2.0, momentum=0.0, alpha=alpha)
            global_history[step] = [[o.outer.global_flat[i:i + 1].view(1, 1).tolist() for i in range(2)]
                                    for _, o in replicas]
        history[step] = [[p.tolist() for p in params] for params, _ in replicas]
    compared = 0
    for r, replica in enumerate(fixture):
        for step, values in replica[0]["history"].items():
            assert [values[n] for n in names] == history[int(step)][r], f"replica {r} step {step}"
            compared += 1
        for step, values in replica[0]["global_parameter_history"].items():
            assert [values[n] for n in names] == global_history[int(step)][r], f"replica {r} global, step {step}"
    assert compared == 2 * 16
