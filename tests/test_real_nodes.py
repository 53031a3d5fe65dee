"""A node of G devices is G data-parallel processes: equal to one process at batch G·b.

One node of 2 devices at batch b runs 2 processes (gloo, one thread each) whose gradients
are averaged every step; one process at batch 2b on the same samples computes the mean loss
over the same 2b sequences. The two differ only in float summation order (the mean over
2b vs the mean of two means over b, and the all-reduce), which Adam's g/sqrt(v) can blow up
on weights with tiny gradients: the same tolerance as the multi-node reference test.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from facts.presets import load_arch
from real.process.launch import launch
from real.process.worker import ExecOptions
from tests.test_real_runs import SEQ_LEN, _distance, scenario_text
from train.models import build_model


def plan_text(nodes: list[tuple[str, int, int, int]]) -> str:
    lines = ["strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s"]
    lines += [f"test,{name},{g},{b},{h},0.01,{g * b * h * SEQ_LEN},0.0" for name, g, b, h in nodes]
    return "\n".join(lines) + "\n"


def run(tmp: Path, name: str, nodes, scenario: str) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "plan.csv").write_text(plan_text(nodes))
    (d / "scenario.toml").write_text(scenario)
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return d


def weights(d: Path) -> list[torch.Tensor]:
    return list(torch.load(d / "out" / "final_weights.pt", weights_only=True).values())


def test_two_device_node_equals_one_process_at_twice_the_batch(tmp_path):
    scenario = scenario_text(rounds=2)
    # Two nodes, so the outer sync runs across nodes too: node a with 2 devices vs 1 at 2b.
    ddp = run(tmp_path, "ddp", [("a", 2, 2, 3), ("b", 1, 3, 2)], scenario)
    single = run(tmp_path, "single", [("a", 1, 4, 3), ("b", 1, 3, 2)], scenario)
    got, want = weights(ddp), weights(single)
    start = [p.detach() for p in build_model(load_arch("tiny"), SEQ_LEN, seed=7).parameters()]
    travelled = _distance(want, start)
    assert _distance(got, want) < 1e-4 * travelled
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=5e-5)
    trace = pd.read_csv(ddp / "out" / "trace.csv")
    assert list(trace["node"]) == ["a", "b", "a", "b"]  # one row per node per round
    assert list(trace["batch_size"][:2]) == [2, 3] and list(trace["tokens"][:2]) == [2 * 2 * 3 * SEQ_LEN, 3 * 2 * SEQ_LEN]
    ref = pd.read_csv(single / "out" / "trace.csv")
    # The node's loss is the mean over its devices: the 2b-batch loss up to rounding.
    assert (trace["loss"] - ref["loss"]).abs().max() < 1e-4
    # The check can fail: a different per-device split of the same node batch is not the same run.
    other = run(tmp_path, "other", [("a", 1, 2, 3), ("b", 1, 3, 2)], scenario)
    assert _distance(weights(other), want) > 1e-2 * travelled


def test_cpu_limits_from_the_plan_are_applied_and_removed(tmp_path):
    import os

    import pytest

    from train.cpulimit import CGROUP_ROOT, cpu_quota_supported

    if not cpu_quota_supported() or not hasattr(os, "sched_getaffinity"):
        pytest.skip("needs root and a cgroup cpu controller")
    core = min(os.sched_getaffinity(0))
    d = tmp_path / "limited"
    d.mkdir()
    node = f"lim{os.getpid()}"  # its own cgroup names: another suite on this machine makes geodt-lim-*
    (d / "plan.csv").write_text(
        "strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,cpu_cores,cpu_quota\n"
        f"test,{node},2,1,2,0.01,{2 * 1 * 2 * SEQ_LEN},0.0,{core},0.5\n"
        f"test,free,1,1,2,0.01,{1 * 2 * SEQ_LEN},0.0,,\n")
    (d / "scenario.toml").write_text(scenario_text(rounds=1))
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    assert len(pd.read_csv(d / "out" / "trace.csv")) == 2
    assert not list(CGROUP_ROOT.glob(f"**/geodt-{node}-*"))  # the processes' cgroups are gone


def test_gradient_sync_plan_is_synchronous_data_parallel(tmp_path):
    """sync = gradients (sync-ddp): devices of b = 1, 1 (node a) and 2 (node b) per step equal
    one process stepping on the concatenated batch of 4, the global batch's mean loss."""
    from real.core.config import load_run_spec
    from real.core.data import make_shard
    from real.core.diloco import inner_lr
    from train.step import make_optimizer, train_step

    d = tmp_path / "sync"
    d.mkdir()
    (d / "plan.csv").write_text(
        "strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,rounds,sync\n"
        f"sync-ddp,a,2,1,1,0.01,{2 * SEQ_LEN},0.0,4,gradients\n"
        f"sync-ddp,b,1,2,1,0.01,{2 * SEQ_LEN},0.0,4,gradients\n")
    (d / "scenario.toml").write_text(scenario_text(rounds=1))
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, summary=False)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    spec = load_run_spec(d / "scenario.toml")
    torch.set_num_threads(1)
    model = build_model(load_arch("tiny"), SEQ_LEN, seed=spec.seed)
    dl = spec.diloco
    opt = make_optimizer(model, lr=dl.inner_lr, weight_decay=dl.weight_decay, betas=dl.betas)
    shards = [make_shard(None, seed=spec.seed, vocab_size=1024, seq_len=SEQ_LEN, shard=i, shards=2) for i in (0, 1)]
    for step in range(4):
        for group in opt.param_groups:
            group["lr"] = inner_lr(step, dl, 4)
        batch = torch.cat([shards[0].batch(2 * step, 2), shards[1].batch(2 * step, 2)])
        train_step(model, opt, batch, "fp32")
    got = weights(d)
    want = [p.detach() for p in model.parameters()]
    start = [p.detach() for p in build_model(load_arch("tiny"), SEQ_LEN, seed=7).parameters()]
    assert _distance(got, want) < 1e-4 * _distance(want, start)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=5e-5)
    trace = pd.read_csv(d / "out" / "trace.csv")
    assert len(trace) == 8 and (trace["bytes_sent"] > 0).all()
    # The check can fail: the same plan as DiLoCo rounds of one step is another algorithm.
    (d / "plan.csv").write_text((d / "plan.csv").read_text().replace("gradients", "diloco"))
    options = ExecOptions(out_dir=str(d / "out2"), threads=1, progress=False, summary=False)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    other = list(torch.load(d / "out2" / "final_weights.pt", weights_only=True).values())
    assert _distance(other, want) > 1e-2 * _distance(want, start)


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.cuda
@pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
def test_cuda_single_device_run_with_nccl(tmp_path):
    d = tmp_path / "gpu"
    d.mkdir()
    (d / "plan.csv").write_text(plan_text([("a", 1, 2, 3)]))
    (d / "scenario.toml").write_text(scenario_text(rounds=2))
    options = ExecOptions(out_dir=str(d / "out"), progress=False, summary=False, backend="nccl")
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    assert len(pd.read_csv(d / "out" / "trace.csv")) == 2


@pytest.mark.cuda
@pytest.mark.skipif(_gpus() < 3, reason="needs three CUDA GPUs")
def test_cuda_two_device_node_and_int8_partitioned_with_nccl(tmp_path):
    d = tmp_path / "gpu"
    d.mkdir()
    (d / "plan.csv").write_text(plan_text([("a", 2, 2, 3), ("b", 1, 3, 2)]).replace(
        "comm_s\n", "comm_s,collective,payload_dtype,link_gbps\n").replace(",0.0\n", ",0.0,partitioned,int8,1\n"))
    (d / "scenario.toml").write_text(scenario_text(rounds=2))
    options = ExecOptions(out_dir=str(d / "out"), progress=False, summary=False, backend="nccl")
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    trace = pd.read_csv(d / "out" / "trace.csv")
    assert list(trace["node"]) == ["a", "b", "a", "b"] and (trace["bytes_sent"] > 0).all()
