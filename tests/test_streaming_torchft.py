"""End to end against torchft's own `DiLoCo` (torchft 0.2.0, a test-only dependency): the
executor's Streaming DiLoCo run and torchft's, on the same model, data and seeds, end with the
same weights, for P ∈ {1, 2}, τ ∈ {0, 1}, α ∈ {0, 0.5}.

torchft's DiLoCo talks to the cluster only through its Manager. The harness below stands in
for it on a plain gloo process group of two processes (one per node): allreduce = an async
SUM all-reduce whose wait divides by the replicas (what Manager.allreduce does), quorum and
commit always succeed, and the step counts commits (it picks the fragment to sync). Both
sides use geodt's inner step (train/step.py) and learning-rate schedule, so what is
compared is the outer loop: fragments, delay, background average, outer Nesterov step, merge.
"""
from __future__ import annotations

import itertools
import os

import pytest
import torch

pytest.importorskip("torchft", reason="torchft (the test extra) is not installed")

import torch.distributed as dist
import torch.multiprocessing as mp

from facts.presets import load_arch
from real.core.config import load_run_spec
from real.core.data import make_shard
from real.core.diloco import inner_lr
from real.core.options import ExecOptions
from real.process.launch import launch
from tests.test_real_runs import SEQ_LEN, plan_text, scenario_text
from train.models import build_model
from train.step import make_optimizer, train_step

CASES = list(itertools.product((1, 2), (0, 1), (0.0, 0.5)))  # (P, τ, α)
NODES = [("a", 2, 4), ("b", 2, 4)]  # (name, batch, H): H = 4 allows τ = 1 with P = 2
ROUNDS = 3


class _AveragingWork:
    """An async SUM all-reduce; wait() completes it and divides by the replicas once."""

    def __init__(self, tensor: torch.Tensor, replicas: int):
        self.tensor, self.replicas = tensor, replicas
        self.work = dist.all_reduce(tensor, async_op=True)

    def wait(self, timeout=None) -> bool:
        if self.work is not None:
            self.work.wait()
            self.tensor.div_(self.replicas)
            self.work = None
        return True


class _HealthyManager:
    """The part of torchft's Manager that DiLoCo uses, for a cluster where nothing fails."""

    _use_async_quorum = False

    def __init__(self, replicas: int):
        self.replicas, self.step, self.state_fns = replicas, 0, {}

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False) -> _AveragingWork:
        assert not should_quantize
        return _AveragingWork(tensor, self.replicas)

    def start_quorum(self, *args, **kwargs) -> None:
        pass

    def should_commit(self, *args, **kwargs) -> bool:
        self.step += 1
        return True

    def current_step(self) -> int:
        return self.step

    def register_state_dict_fn(self, key, load_fn, save_fn) -> None:
        self.state_fns[key] = (load_fn, save_fn)

    def allow_state_dict_read(self) -> None:
        pass

    def disallow_state_dict_read(self) -> None:
        pass


def _fragments(model, fragments: int) -> list[torch.nn.Module]:
    """The tiny model's fragments as modules, written out by hand (the executor derives its own
    from parameter names): embedding with the first layer, the last layer with norm and head."""
    inner = model.model
    if fragments == 1:
        return [model]
    return [torch.nn.ModuleList([inner.embed_tokens, inner.layers[0]]),
            torch.nn.ModuleList([inner.layers[1], inner.norm, model.lm_head])]


def _torchft_node(rank: int, store: str, scenario: str, out_dir: str) -> None:
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    spec = load_run_spec(scenario)
    d = spec.diloco
    _, batch, steps = NODES[rank]
    total = ROUNDS * steps
    for p_count, tau, alpha in CASES:
        model = build_model(load_arch("tiny"), SEQ_LEN, seed=spec.seed)
        model.train()
        inner = make_optimizer(model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)
        fragments = _fragments(model, p_count)
        outer = [torch.optim.SGD(f.parameters(), lr=d.outer_lr, momentum=d.outer_momentum, nesterov=True)
                 for f in fragments]
        shard = make_shard(None, seed=spec.seed, vocab_size=1024, seq_len=SEQ_LEN, shard=rank, shards=2)
        with DiLoCo(_HealthyManager(2), fragments, inner, outer, sync_every=steps,
                    fragment_sync_delay=tau, fragment_update_alpha=alpha):
            for step in range(total):
                for group in inner.param_groups:
                    group["lr"] = inner_lr(step, d, total)
                train_step(model, inner, shard.batch(step * batch, batch), "fp32")
        if rank == 0:
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                       os.path.join(out_dir, f"torchft_{p_count}_{tau}_{alpha}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torchft")
    (tmp / "scenario.toml").write_text(scenario_text(rounds=ROUNDS))
    mp.start_processes(_torchft_node, args=(str(tmp / "store"), str(tmp / "scenario.toml"), str(tmp)),
                       nprocs=2, start_method="spawn")
    ours = {}
    for case in CASES:  # the settings travel in plan.csv, as `geodt run` gives them
        out = tmp / "geodt_{}_{}_{}".format(*case)
        plan = tmp / "plan_{}_{}_{}.csv".format(*case)
        lines = plan_text(NODES).splitlines()
        plan.write_text("\n".join([lines[0] + ",fragments,sync_delay_steps,fragment_alpha",
                                   *(f"{line},{case[0]},{case[1]},{case[2]}" for line in lines[1:])]) + "\n")
        options = ExecOptions(out_dir=str(out), threads=1, progress=False, summary=False)
        assert launch(plan, tmp / "scenario.toml", options) == 0
        ours[case] = torch.load(out / "final_weights.pt", weights_only=True)
    theirs = {case: torch.load(tmp / "torchft_{}_{}_{}.pt".format(*case), weights_only=True) for case in CASES}
    return ours, theirs


@pytest.mark.parametrize("case", CASES, ids=[f"P{p}-tau{t}-alpha{a}" for p, t, a in CASES])
def test_equals_torchft_diloco(runs, case):
    ours, theirs = runs
    assert ours[case].keys() == theirs[case].keys()
    worst = max(float((ours[case][n] - theirs[case][n]).abs().max()) for n in ours[case])
    # Both sides run the same inner steps and sum the same two pseudo-gradients; torch's SGD
    # (foreach kernels) and the executor's flat Nesterov step could round differently in the
    # last bit, which AdamW's next steps would carry on: a few fp32 ulps of weights of size
    # ~0.1. (With torch 2.13 on CPU every case is in fact equal bit for bit.)
    print(f"P={case[0]} tau={case[1]} alpha={case[2]}: max |w_geodt - w_torchft| = {worst:.3g}")
    assert worst <= 1e-6, f"max |Δw| = {worst:.3g}"


def test_the_cases_differ(runs):
    """The settings change the result (so equality above is not vacuous)."""
    ours, _ = runs
    ref = ours[(1, 0, 0.0)]
    for case in CASES[1:]:
        assert max(float((ours[case][n] - ref[n]).abs().max()) for n in ref) > 1e-4, case
