"""Adaptive plans in the executor (real/rounds/adaptive.py): two CPU nodes (gloo, `tiny` model) run
rebalance and deadline rounds; the steps each round took follow formats/adaptive.py's rule on
the step times the trace measured, and the final weights are DiLoCo's with those steps and
token weights (a single-process reference)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_real_runs import SEQ_LEN, _distance, final_weights, plain_model, scenario_text

from formats.adaptive import rebalance_steps, round_time_s
from real.core.config import load_plan, load_run_spec
from real.core.data import make_shard
from real.core.diloco import inner_lr
from real.process.launch import launch
from real.process.worker import ExecOptions
from train.step import train_step

# The plan's step times are far below what the tiny model takes here, so the rounds must adapt:
# the plan gives a 9× the steps of b, the real steps are about alike (on a loaded machine one
# process may run up to ~3× slower than the other, which a 3× plan could not tell from the plan).
NODES = [("a", 2, 9, 0.001), ("b", 2, 1, 0.009)]
ROUNDS = 4


def run(tmp: Path, mode: str) -> Path:
    d = tmp / mode
    d.mkdir()
    rows = ["strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s,adapt"]
    rows += [f"{mode},{name},1,{b},{h},{t},{b * h * SEQ_LEN},0.0,{mode}" for name, b, h, t in NODES]
    (d / "plan.csv").write_text("\n".join(rows) + "\n")
    (d / "scenario.toml").write_text(scenario_text(ROUNDS, averaging="tokens"))
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    return d


def reference(d: Path, steps: np.ndarray) -> list[torch.Tensor]:
    """DiLoCo in one process: node i runs steps[r, i] inner steps in round r; token weights per round."""
    torch.set_num_threads(1)
    spec, plan = load_run_spec(d / "scenario.toml"), load_plan(d / "plan.csv")
    n = len(plan.nodes)
    nodes = [plain_model(spec) for _ in plan.nodes]
    shards = [make_shard(None, seed=spec.seed, vocab_size=1024, seq_len=SEQ_LEN, shard=i, shards=n) for i in range(n)]
    global_params = [p.detach().clone().requires_grad_(True) for p in nodes[0][0].parameters()]
    outer = torch.optim.SGD(global_params, lr=spec.diloco.outer_lr, momentum=spec.diloco.outer_momentum, nesterov=True)
    done = [0] * n
    for r in range(spec.training.rounds):
        deltas = []
        for i, ((model, opt), node) in enumerate(zip(nodes, plan.nodes)):
            with torch.no_grad():
                for p, g in zip(model.parameters(), global_params):
                    p.copy_(g)
            for _ in range(int(steps[r, i])):
                for group in opt.param_groups:  # the schedule's length is the plan's (worker.total_steps)
                    group["lr"] = inner_lr(done[i], spec.diloco, spec.training.rounds * node.local_steps)
                train_step(model, opt, shards[i].batch(done[i] * node.batch_size, node.batch_size), "fp32")
                done[i] += 1
            deltas.append([g.detach() - p.detach() for g, p in zip(global_params, model.parameters())])
        tokens = [int(steps[r, i]) * node.batch_size for i, node in enumerate(plan.nodes)]
        outer.zero_grad()
        for j, g in enumerate(global_params):
            g.grad = sum(t / sum(tokens) * delta[j] for t, delta in zip(tokens, deltas))
        outer.step()
    return [g.detach() for g in global_params]


@pytest.mark.parametrize("mode", ["rebalance", "deadline"])
def test_adaptive_rounds_follow_their_rule_and_train_as_diloco(tmp_path, mode):
    d = run(tmp_path, mode)
    trace = pd.read_csv(d / "out" / "trace.csv")
    steps = trace.pivot(index="round", columns="node", values="local_steps")[["a", "b"]].to_numpy()
    compute = trace.pivot(index="round", columns="node", values="compute_s")[["a", "b"]].to_numpy()
    batch = np.array([b for _, b, _, _ in NODES])
    units, plan_steps = batch.astype(float), np.array([h for _, _, h, _ in NODES])
    samples = float((plan_steps * units).sum())
    assert (trace.pivot(index="round", columns="node", values="tokens")[["a", "b"]].to_numpy()
            == steps * batch * SEQ_LEN).all()
    estimate = np.array([t for *_, t in NODES])
    for r in range(ROUNDS):
        if mode == "rebalance":
            # the rule on the trace's step times (9 digits in the CSV: either side of a breakpoint)
            options = {tuple(rebalance_steps(estimate * f, units, samples)) for f in (1 - 1e-6, 1, 1 + 1e-6)}
            assert tuple(steps[r]) in options if r else tuple(steps[r]) == tuple(plan_steps)
        else:
            # a node stops once its next step (its mean so far) would pass the deadline
            deadline = float(round_time_s(estimate, units, samples))
            assert (compute[r] * (1 + 1 / steps[r]) > deadline * (1 - 1e-6)).all()
        estimate = compute[r] / steps[r]
    assert (steps != plan_steps).any()  # the rounds did adapt
    got, want = final_weights(d), reference(d, steps)
    travelled = _distance(want, [p.detach() for p in plain_model(load_run_spec(d / "scenario.toml"))[0].parameters()])
    assert _distance(got, want) < 1e-4 * travelled  # the tolerance of test_real_runs' reference check
    fixed = reference(d, np.broadcast_to(plan_steps, steps.shape))
    assert _distance(got, fixed) > 1e-2 * travelled  # the check can fail: the plan's steps train elsewhere


def test_injected_drift_pads_emulated_steps_from_its_round(tmp_path):
    d = tmp_path / "drift"
    d.mkdir()
    rows = ["strategy,node,gpus,batch_size,local_steps,step_s,tokens_per_round,comm_s",
            f"baseline,a,1,2,4,0.08,{2 * 4 * SEQ_LEN},0.0", f"baseline,b,1,2,4,0.08,{2 * 4 * SEQ_LEN},0.0"]
    (d / "plan.csv").write_text("\n".join(rows) + "\n")
    (d / "scenario.toml").write_text(scenario_text(4))
    drift = ((1.0, 1.0, 1.5, 1.5), (1.0, 1.0, 1.0, 1.0))
    options = ExecOptions(out_dir=str(d / "out"), threads=1, progress=False, emulate=True, drift=drift)
    assert launch(d / "plan.csv", d / "scenario.toml", options) == 0
    trace = pd.read_csv(d / "out" / "trace.csv")
    a = trace[trace["node"] == "a"]["compute_s"].to_numpy()
    # padding makes 4 steps last at least 4 × 0.08 × factor (more where a step overran on a loaded machine)
    assert (a >= 4 * 0.08 * np.array(drift[0]) * (1 - 1e-3)).all()
    assert a[2:].min() > 1.3 * a[:2].max() or trace["overrun_steps"].sum() > 0
    b = trace[trace["node"] == "b"]
    idle_b, compute_b = b["idle_s"].to_numpy(), b["compute_s"].to_numpy()
    # b waits at the barrier until a is done (a's compute started with b's: within scheduling slack)
    assert (compute_b[2:] + idle_b[2:] >= a[2:] - 0.05).all()
    if b["overrun_steps"].iloc[2:].sum() == 0:  # b's steps kept their padded time: its wait is a's extra ~0.16 s
        assert idle_b[2:].min() > 0.1


def test_a_real_run_injects_drift_only_through_a_cpu_quota(tmp_path, capsys):
    from geodt.run_cmd import run_main

    status = run_main(["hetero-cpu", "--strategy", "rebalance", "--out", str(tmp_path / "x"),
                       "--set", 'nodes.medium.drift=[{kind="step", round=1, factor=1.2}]'])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err == ("geodt run: nodes.medium.drift: a real run injects drift through the node's CPU "
                                   "quota; expected cpu_quota on the node, or --emulate")
    assert not (tmp_path / "x").exists()
