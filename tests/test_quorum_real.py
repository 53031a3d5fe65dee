"""Quorum rounds run for real (real/rounds/round_quorum.py): a quorum of everyone is DiLoCo, late nodes
pull and go on, validate compares staleness, and what a quorum run refuses (its checkpoints:
tests/test_quorum_checkpoint.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import pandas as pd
import torch

from real.core.options import ExecOptions
from real.core.streaming import StreamingSpec
from real.process.launch import LaunchError, check_inputs
from real.rounds.round_quorum import node_shares
from tests.test_async_real import PLAN_HEADER, run
from tests.test_real_runs import final_weights, scenario_text


def write_quorum_run(d, nodes, quorum: float, grace_s: float = 0.0, rounds: int = 3, averaging: str = "uniform"):
    d.mkdir()
    rows = [f"t,{name},1,{b},{h},0.01,{b * h * 32},0.0,quorum,{quorum},{grace_s}" for name, b, h in nodes]
    (d / "plan.csv").write_text("\n".join([PLAN_HEADER + ",quorum,grace_s", *rows]) + "\n")
    (d / "scenario.toml").write_text(scenario_text(rounds, averaging=averaging))
    return d


def write_diloco_run(d, nodes, rounds: int = 3, averaging: str = "uniform"):
    d.mkdir()
    rows = [f"t,{name},1,{b},{h},0.01,{b * h * 32},0.0,diloco" for name, b, h in nodes]
    (d / "plan.csv").write_text("\n".join([PLAN_HEADER, *rows]) + "\n")
    (d / "scenario.toml").write_text(scenario_text(rounds, averaging=averaging))
    return d


# tokens: the server scales each push by c_i/D and divides by Σ shares (1 up to rounding), the ring
# sums c_i·Δ_i and divides by D; a last-bit difference after round 0 is carried through two rounds
# of AdamW, which divides by √v: measured 1.7e-6 at most, one weight of 65,536.
@pytest.mark.parametrize("averaging, atol", [("uniform", 1e-6), ("tokens", 1e-5)])
def test_a_quorum_of_everyone_is_diloco(tmp_path, averaging, atol):
    """quorum 1.0: every close waits for every node, so each round is DiLoCo's average of all the
    pseudo-gradients (each node's share renormalised over all: Σ = 1) and its Nesterov outer step.
    The peer is the DiLoCo executor's ring all-reduce: equal up to the order of float additions."""
    nodes = [("a", 2, 1), ("b", 3, 2), ("c", 2, 3)]
    run(write_diloco_run(tmp_path / "diloco", nodes, averaging=averaging))
    trace = run(write_quorum_run(tmp_path / "quorum", nodes, quorum=1.0, averaging=averaging))
    assert len(trace) == 9 and (trace["staleness"] == 0).all()
    for got, want in zip(final_weights(tmp_path / "quorum"), final_weights(tmp_path / "diloco")):
        torch.testing.assert_close(got, want, rtol=0, atol=atol)


def test_late_node_pulls_and_goes_on(tmp_path):
    """a and b (one step a round) make the quorum of 2 without c (eight steps): c arrives after at
    least one close and is late; it does not wait, its work merges into a later close, and the run
    ends with every push merged. A late push's staleness counts the closes since its pull."""
    trace = run(write_quorum_run(tmp_path / "r", [("a", 2, 1), ("b", 2, 1), ("c", 2, 8)], quorum=0.5, rounds=4))
    assert len(trace) == 12 and (trace["staleness"] >= 0).all()
    c = trace[trace["node"] == "c"].sort_values("round")
    assert c["staleness"].iloc[0] >= 1
    late = trace[trace["staleness"] > 0]
    assert (late["idle_s"] <= late["compute_s"]).all()  # a late node waits for no close
    assert all(torch.isfinite(w).all() for w in final_weights(tmp_path / "r"))


def test_shares_sum_to_one(tmp_path):
    from formats.plan import load_plan

    d = write_quorum_run(tmp_path / "r", [("a", 2, 1), ("b", 2, 3)], quorum=0.5)
    plan = load_plan(d / "plan.csv", seq_len=32)
    assert node_shares(plan, "uniform") == [0.5, 0.5]
    assert node_shares(plan, "tokens") == [0.25, 0.75]


def test_validate_compares_a_quorum_runs_staleness(tmp_path, capsys):
    from geodt.run_cmd import validate_main

    out = tmp_path / "v"
    assert validate_main(["hetero-cpu", "--strategy", "quorum", "--emulate", "--set", "training.rounds=3",
                          "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "staleness (global updates applied between a node's pull and its merge)" in printed
    table = pd.read_csv(out / "validation.csv")
    assert "measured_run_staleness_mean" in table.columns
    assert set(pd.read_csv(out / "trace.csv")["strategy"]) == {"quorum"}


@pytest.mark.parametrize("opts, expected", [
    ({"on_node_loss": "continue"}, "--on-node-loss continue: a lost node stops a quorum run"),
    ({"streaming": StreamingSpec(fragments=1, sync_delay_steps=0)},
     "Streaming DiLoCo's fragments: a quorum node pushes whole rounds"),
])
def test_what_a_quorum_run_refuses(tmp_path, opts, expected):
    d = write_quorum_run(tmp_path / "r", [("a", 2, 1), ("b", 2, 2)], quorum=0.5)
    with pytest.raises(LaunchError) as info:
        check_inputs(d / "plan.csv", d / "scenario.toml", ExecOptions(out_dir=str(d / "out"), **opts))
    assert str(info.value).startswith("strategy t (sync quorum): ") and expected in str(info.value)
    assert "\n" not in str(info.value)


def test_a_quorum_run_takes_checkpoint_options(tmp_path):
    """Its checkpoints are consistent cuts (tests/test_quorum_checkpoint.py, which resumes): none is refused."""
    d = write_quorum_run(tmp_path / "r", [("a", 2, 1), ("b", 2, 2)], quorum=0.5)
    for opts in ({"stop_after": 1}, {"checkpoint_every": 1}, {"checkpoint_final": True}):  # --resume: its own test
        check_inputs(d / "plan.csv", d / "scenario.toml", ExecOptions(out_dir=str(d / "out"), **opts))
