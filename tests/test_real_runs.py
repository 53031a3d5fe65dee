"""Multi-process DiLoCo runs (gloo on CPU, `tiny` model) against single-process references.

Each run spawns one process per node; the nodes use one torch thread each so that results
are reproducible bit for bit between runs of the same arithmetic.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from facts.presets import load_arch
from real.checkpoint.checkpoint import latest_state
from real.checkpoint.ckpt_set import load_set, read_manifest, write_set
from real.core.config import load_plan, load_run_spec
from real.core.data import make_shard
from real.core.diloco import inner_lr
from real.process.launch import launch
from real.process.worker import ExecOptions
from train.models import build_model
from train.step import make_optimizer, train_step

SEQ_LEN = 32


def scenario_text(rounds: int, averaging: str = "uniform", outer_lr: float = 0.7, momentum: float = 0.9) -> str:
    return f"""name = "test"
seed = 7
[model]
preset = "tiny"
seq_len = {SEQ_LEN}
dtype = "fp32"
[training]
rounds = {rounds}
[diloco]
inner_lr = 2e-3
weight_decay = 0.1
warmup_steps = 2
outer_lr = {outer_lr}
outer_momentum = {momentum}
averaging = "{averaging}"
"""


def plan_text(nodes: list[tuple[str, int, int]], step_s: float = 0.01) -> str:
    lines = ["strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s"]
    lines += [f"test,{name},1,{b},{h},{step_s},{b * h * SEQ_LEN},0.0" for name, b, h in nodes]
    return "\n".join(lines) + "\n"


def run(tmp: Path, name: str, nodes, scenario: str, **opts) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "plan.csv").write_text(plan_text(nodes))
    (d / "scenario.toml").write_text(scenario)
    out = d / "out"
    options = ExecOptions(out_dir=str(out), threads=1, progress=False, **opts)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return d


def final_weights(d: Path) -> list[torch.Tensor]:
    return list(torch.load(d / "out" / "final_weights.pt", weights_only=True).values())


def plain_model(spec):
    torch.manual_seed(0)
    model = build_model(load_arch("tiny"), SEQ_LEN, seed=spec.seed)
    d = spec.diloco
    return model, make_optimizer(model, lr=d.inner_lr, weight_decay=d.weight_decay, betas=d.betas)


def reference_diloco(d: Path) -> list[torch.Tensor]:
    """DiLoCo in one process, nodes looped, weights from the definitions, torch's Nesterov SGD."""
    torch.set_num_threads(1)
    spec, plan = load_run_spec(d / "scenario.toml"), load_plan(d / "plan.csv")
    n = len(plan.nodes)
    nodes = [plain_model(spec) for _ in plan.nodes]
    shards = [make_shard(None, seed=spec.seed, vocab_size=1024, seq_len=SEQ_LEN, shard=i, shards=n)
              for i in range(n)]
    global_params = [p.detach().clone().requires_grad_(True) for p in nodes[0][0].parameters()]
    outer = torch.optim.SGD(global_params, lr=spec.diloco.outer_lr, momentum=spec.diloco.outer_momentum,
                            nesterov=spec.diloco.outer_momentum > 0)
    tokens = [p.tokens_per_round(plan.seq_len) for p in plan.nodes]
    steps = [p.local_steps for p in plan.nodes]
    p_tok = [t / sum(tokens) for t in tokens]
    for r in range(spec.training.rounds):
        deltas = []
        for i, ((model, opt), node) in enumerate(zip(nodes, plan.nodes)):
            with torch.no_grad():
                for p, g in zip(model.parameters(), global_params):
                    p.copy_(g)
            for k in range(node.local_steps):
                step = r * node.local_steps + k
                for group in opt.param_groups:
                    group["lr"] = inner_lr(step, spec.diloco, spec.training.rounds * node.local_steps)
                train_step(model, opt, shards[i].batch(step * node.batch_size, node.batch_size), "fp32")
            deltas.append([g.detach() - p.detach() for g, p in zip(global_params, model.parameters())])
        mode = spec.diloco.averaging
        if mode == "uniform":
            w = [1 / n] * n
        elif mode == "tokens":
            w = p_tok
        else:  # FedNova: Σ p_i H_i · Σ p_i Δ_i / H_i
            w = [sum(pi * h for pi, h in zip(p_tok, steps)) * pi / h for pi, h in zip(p_tok, steps)]
        outer.zero_grad()
        for j, g in enumerate(global_params):
            g.grad = sum(wi * delta[j] for wi, delta in zip(w, deltas))
        outer.step()
    return [g.detach() for g in global_params]


def test_one_node_with_outer_lr_1_no_momentum_is_plain_adamw(tmp_path):
    d = run(tmp_path, "one", [("solo", 2, 3)], scenario_text(rounds=3, outer_lr=1.0, momentum=0.0))
    spec = load_run_spec(d / "scenario.toml")
    torch.set_num_threads(1)
    model, opt = plain_model(spec)
    shard = make_shard(None, seed=spec.seed, vocab_size=1024, seq_len=SEQ_LEN, shard=0, shards=1)
    for step in range(9):
        for group in opt.param_groups:
            group["lr"] = inner_lr(step, spec.diloco, 9)
        train_step(model, opt, shard.batch(2 * step, 2), "fp32")
    for got, want in zip(final_weights(d), model.parameters()):
        # θ_g − 1·(θ_g − θ) rounds once per round: a few ulps of the weights' scale
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-6)


def test_two_nodes_on_identical_data_give_each_nodes_own_update(tmp_path):
    scenario = scenario_text(rounds=2)
    one = run(tmp_path, "one", [("a", 2, 3)], scenario)
    two = run(tmp_path, "two", [("a", 2, 3), ("b", 2, 3)], scenario, replicate_data=True)
    for w1, w2 in zip(final_weights(one), final_weights(two)):
        assert torch.equal(w1, w2)  # (Δ + Δ) / 2 == Δ exactly; the rest is the same arithmetic
    trace = pd.read_csv(two / "out" / "trace.csv")
    by_node = trace.pivot(index="round", columns="node", values="loss")
    assert (by_node["a"] == by_node["b"]).all()


def _distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b))))


@pytest.mark.parametrize("averaging", ["uniform", "tokens", "normalized"])
def test_multi_process_matches_single_process_reference(tmp_path, averaging):
    nodes = [("a", 2, 2), ("b", 1, 4), ("c", 3, 3)]  # different b and H: the weights matter
    d = run(tmp_path, averaging, nodes, scenario_text(rounds=3, averaging=averaging))
    got, want = final_weights(d), reference_diloco(d)
    start = list(build_model(load_arch("tiny"), SEQ_LEN, seed=7).parameters())
    travelled = _distance(want, [p.detach() for p in start])
    # The same arithmetic in another float order (weights before vs after the sum, the
    # all-reduce's sum order) differs by rounding, which Adam's g/sqrt(v) can blow up to
    # ~1e-5 on weights with tiny gradients: allow 1e-4 of the distance trained, and per
    # weight 5e-5 (a fortieth of one inner step of lr 2e-3).
    assert _distance(got, want) < 1e-4 * travelled
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=5e-5)
    # The check can fail: another averaging mode's reference is far away.
    other = {"uniform": "tokens", "tokens": "normalized", "normalized": "uniform"}[averaging]
    (d / "scenario.toml").write_text(scenario_text(rounds=3, averaging=other))
    assert _distance(got, reference_diloco(d)) > 1e-2 * travelled
    trace = pd.read_csv(d / "out" / "trace.csv")
    assert len(trace) == 9 and list(trace["round"].unique()) == [0, 1, 2]
    assert list(trace["tokens"][:3]) == [b * h * SEQ_LEN for _, b, h in nodes]
    assert (trace["round_end_s"] >= trace["round_start_s"] + trace["compute_s"]).all()


def test_resume_after_stop_equals_uninterrupted(tmp_path):
    nodes = [("a", 2, 2), ("b", 1, 3)]
    scenario = scenario_text(rounds=3)
    whole = run(tmp_path, "whole", nodes, scenario)
    every = {"checkpoint_every": 1}  # a set every round, as the test reasons about them
    part = run(tmp_path, "part", nodes, scenario, stop_after=1, **every)
    assert pd.read_csv(part / "out" / "trace.csv")["round"].max() == 0

    def resume(**extra) -> None:
        options = ExecOptions(out_dir=str(part / "out"), threads=1, progress=False, resume=True, **every, **extra)
        assert launch(part / "plan.csv", part / "scenario.toml", options) == 0

    resume(stop_after=2)
    ckpts = part / "out" / "checkpoints"
    # A crash between two nodes' checkpoint writes: node b lost its round-2 set and keeps
    # only round 1. Both nodes must go back to round 1, the last one they share.
    shutil.rmtree(ckpts / "node1" / "round-000002")
    resume()
    for w1, w2 in zip(final_weights(whole), final_weights(part)):
        assert torch.equal(w1, w2)
    trace = pd.read_csv(part / "out" / "trace.csv")
    assert list(trace["round"]) == [0, 0, 1, 1, 2, 2]
    for _, rows in trace.groupby("node"):  # the resumed timeline continues after the stop
        assert (rows["round_start_s"].to_numpy()[1:] >= rows["round_end_s"].to_numpy()[:-1]).all()
    ckpt = latest_state(part / "out", 1)
    assert ckpt["rounds_done"] == 3 and ckpt["data_position"] == 3 * 3 * 1


def test_trains_on_a_text_file_as_byte_tokens(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    d = run(tmp_path, "text", [("a", 2, 3), ("b", 2, 3)], scenario_text(rounds=2), data_path=str(text),
            checkpoint_final=True)
    trace = pd.read_csv(d / "out" / "trace.csv")
    assert len(trace) == 4 and trace["loss"].notna().all()
    assert trace.groupby("round")["loss"].mean().is_monotonic_decreasing
    for rank in range(2):
        ckpt = latest_state(d / "out", rank)
        assert ckpt["data_position"] == 2 * 3 * 2


def _resume(d: Path, **extra) -> int:
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, resume=True, **extra)
    return launch(d / "plan.csv", d / "scenario.toml", options)


def test_resume_skips_a_corrupt_checkpoint_and_stale_temps(tmp_path, capfd):
    nodes = [("a", 2, 2), ("b", 1, 3)]
    scenario = scenario_text(rounds=3)
    whole = run(tmp_path, "whole", nodes, scenario)
    part = run(tmp_path, "part", nodes, scenario, stop_after=2, checkpoint_every=1)  # a set every round
    ckpts = part / "out" / "checkpoints"
    (ckpts / "node0" / ".round-000003.tmp4242").mkdir()  # a run killed mid-write
    (ckpts / "node0" / ".round-000003.tmp4242" / "node.pt").write_bytes(b"half a checkpoint")
    (ckpts / "node1" / "round-000002" / "node.pt").write_bytes(b"\x00" * 100)  # a file that no longer loads
    capfd.readouterr()
    assert _resume(part) == 0
    err = capfd.readouterr().err
    assert (f"{ckpts / 'node1' / 'round-000002'}: skipped: node.pt has 100 bytes, its manifest says" in err)
    assert "real: resuming from round 1, the newest every node holds intact; skipped round 2: node b has none" in err
    assert not (ckpts / "node0" / ".round-000003.tmp4242").exists()
    # Both nodes went back to round 1 (node b's intact previous copy) and redid round 2.
    for w1, w2 in zip(final_weights(whole), final_weights(part)):
        assert torch.equal(w1, w2)


@pytest.mark.parametrize("edit, key", [
    (("seed = 7", "seed = 8"), "seed"),
    (("inner_lr = 2e-3", "inner_lr = 3e-3"), "diloco.inner_lr"),
    (('averaging = "uniform"', 'averaging = "tokens"'), "diloco.averaging"),
    (("rounds = 3", "rounds = 4"), "training.rounds"),
])
def test_resume_refuses_other_settings(tmp_path, capfd, edit, key):
    part = run(tmp_path, "part", [("a", 2, 2), ("b", 1, 3)], scenario_text(rounds=3), stop_after=1)
    (part / "scenario.toml").write_text(scenario_text(rounds=3).replace(*edit))
    capfd.readouterr()
    assert _resume(part) == 2
    err = capfd.readouterr().err
    assert f": {key}: the checkpoints were made with" in err


def test_resume_refuses_global_weights_that_differ_between_nodes(tmp_path, capfd):
    part = run(tmp_path, "part", [("a", 2, 2), ("b", 1, 3)], scenario_text(rounds=3), stop_after=1)
    # One flipped bit in one weight of node b's θ_g, the set re-written with matching digests
    # (a set made by another run, or edited on purpose): the digests pass, the nodes disagree.
    directory = part / "out" / "checkpoints" / "node1" / "round-000001"
    state = load_set(directory)
    state["outer"]["global_flat"].view(torch.int32)[123] ^= 1 << 20
    outer = state.pop("outer")
    parts = {"global.pt": {"format": 4, "rounds_done": 1, "outer": outer}, "node.pt": state}
    write_set(part / "out", 1, 1, read_manifest(directory)["run_identity"], parts, 0.0)
    capfd.readouterr()
    assert _resume(part) == 2
    err = capfd.readouterr().err
    assert "hold different global weights" in err and "refusing to resume" in err
