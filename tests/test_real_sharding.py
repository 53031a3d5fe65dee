"""A sharded node (FSDP2 over its 2 processes, gloo) trains the same weights as an unsharded one.

Node a has 2 devices at batch 2 per device, node b 1 device; two rounds of DiLoCo, so the
sharded node's pseudo-gradient goes through the gather to its leader, the cross-node average
and the scatter back to the shards (real/sharding.py). Sharded and unsharded differ only in
float summation order: FSDP2 averages gradients by a reduce-scatter of each parameter where
the unsharded node all-reduces one flat vector, and the gradient norm for clipping is summed
over shards then across processes instead of over whole tensors. Those are rounding-level
differences per step (~1e-7 relative) that Adam's g/sqrt(v) can amplify on weights with tiny
gradients: the same tolerance as a 2-device node against one process at twice the batch
(tests/test_real_nodes.py). Activation checkpointing recomputes the same kernels on the same
inputs, so on CPU it changes no bit.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from calibrate.models import build_model
from calibrate.presets import load_arch
from real.launch import launch
from real.options import ExecOptions
from real.plan import NodePlan, bytes_sent_per_sync
from real.sharding import ShardingSpec
from tests.test_real_nodes import plan_text
from tests.test_real_runs import SEQ_LEN, _distance, scenario_text

NODES = [("a", 2, 2, 3), ("b", 1, 3, 2)]


@dataclass(frozen=True)
class _ShardedNode(NodePlan):
    """A node plan with the sharding columns (until plan.csv carries them)."""

    sharding: str = "none"
    activation_checkpointing: str = "none"


def _with_sharding(monkeypatch, per_node: dict[str, dict]) -> None:
    import real.launch as launch_module

    original = launch_module.check_inputs

    def check_inputs(*args, **kwargs):
        spec, plan = original(*args, **kwargs)
        nodes = tuple(_ShardedNode(**{f.name: getattr(n, f.name) for f in fields(NodePlan)}, **per_node.get(n.node, {}))
                      for n in plan.nodes)
        return spec, replace(plan, nodes=nodes)

    monkeypatch.setattr(launch_module, "check_inputs", check_inputs)


def _run(tmp: Path, name: str, monkeypatch, per_node: dict | None = None, **opts) -> Path:
    d = tmp / name
    d.mkdir(exist_ok=True)
    (d / "plan.csv").write_text(plan_text(NODES))
    (d / "scenario.toml").write_text(scenario_text(rounds=2))
    _with_sharding(monkeypatch, per_node or {})
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False, **opts)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return d


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return torch.load(d / "out" / "final_weights.pt", weights_only=True)


def test_sharded_node_equals_unsharded_node(tmp_path, monkeypatch):
    plain = _run(tmp_path, "none", monkeypatch)
    fsdp = _run(tmp_path, "fsdp", monkeypatch, {"a": {"sharding": "fsdp"}})
    recompute = _run(tmp_path, "fsdp_ac", monkeypatch, {"a": {"sharding": "fsdp", "activation_checkpointing": "full"}})
    want, got = _weights(plain), _weights(fsdp)
    assert list(got) == list(want)  # full tensors under the unsharded names
    start = [p.detach() for p in build_model(load_arch("tiny"), SEQ_LEN, seed=7).parameters()]
    travelled = _distance(list(want.values()), start)
    assert _distance(list(got.values()), list(want.values())) < 1e-4 * travelled
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=5e-5)
    for name, value in _weights(recompute).items():
        assert torch.equal(value, got[name]), name
    trace, ref = pd.read_csv(fsdp / "out" / "trace.csv"), pd.read_csv(plain / "out" / "trace.csv")
    assert (trace["loss"] - ref["loss"]).abs().max() < 1e-4
    # The leader sends the canonical full pseudo-gradient, as an unsharded node's.
    params = sum(p.numel() for p in start)
    assert list(trace["bytes_sent"]) == bytes_sent_per_sync(params, "fp32", "ring", [1.0, 1.0]) * 2
    assert (trace["peak_mem_bytes"] > 0).all() and (ref["peak_mem_bytes"] > 0).all()


def test_sharded_resume_is_exact(tmp_path, monkeypatch):
    sharded = {"a": {"sharding": "zero2"}}
    whole = _run(tmp_path, "whole", monkeypatch, sharded)
    _run(tmp_path, "split", monkeypatch, sharded, stop_after=1)
    resumed = _run(tmp_path, "split", monkeypatch, sharded, resume=True)
    want, got = _weights(whole), _weights(resumed)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    # The checkpoint holds the canonical form: full θ_g and full AdamW moments.
    state = torch.load(resumed / "out" / "checkpoints" / "node0.pt", weights_only=True)
    assert state["outer"]["global_flat"].numel() == sum(v.numel() for v in want.values())
    first = state["inner_optimizer"]["state"][0]["exp_avg"]
    assert first.shape == next(iter(want.values())).shape


def test_sharding_spec_defaults_and_validation():
    node = NodePlan(node="a", gpus=2, batch_size=1, local_steps=1, step_s=0.1)
    assert ShardingSpec.of(object(), node) == ShardingSpec("none", "none", "device")
    assert ShardingSpec.of(object(), _ShardedNode(**{f.name: getattr(node, f.name) for f in fields(NodePlan)},
                                                  sharding="fsdp")).sharding == "fsdp"
    with pytest.raises(ValueError, match="sharding: expected one of none, zero1, zero2, fsdp, got 'auto'"):
        ShardingSpec("auto")
