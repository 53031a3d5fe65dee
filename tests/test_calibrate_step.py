"""The shared training step (train.step): what it does to the model and optimizer."""
from __future__ import annotations

import pytest
import torch

from facts.presets import PRESETS
from train.models import build_model
from train.step import CLIP_NORM, make_optimizer, make_scaler, random_batch, torch_dtype, train_step

ARCH = PRESETS["tiny"]


def fresh(seed=0):
    model = build_model(ARCH, 16, seed)
    return model, make_optimizer(model)


def test_optimizer_is_opendiloco_inner_adamw():
    _, opt = fresh()
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.AdamW)
    assert (group["lr"], group["weight_decay"], group["betas"]) == (4e-4, 0.1, (0.9, 0.95))


def test_loss_falls_on_a_repeated_batch_and_grads_are_cleared():
    model, opt = fresh()
    batch = random_batch(ARCH.vocab_size, 4, 16, "cpu", torch.Generator().manual_seed(1))
    losses = [train_step(model, opt, batch, "fp32").item() for _ in range(30)]
    # memorising one batch: a deterministic fp32 run falls well below log(vocab) = 6.93
    assert losses[0] == pytest.approx(6.93, abs=0.1)
    assert losses[-1] < losses[0] - 0.5
    assert all(p.grad is None for p in model.parameters())


def test_loss_is_next_token_cross_entropy():
    model, opt = fresh()
    batch = random_batch(ARCH.vocab_size, 2, 16, "cpu", torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(input_ids=batch).logits
        expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, ARCH.vocab_size),
                                                     batch[:, 1:].reshape(-1))
    assert train_step(model, opt, batch, "fp32").item() == pytest.approx(expected.item(), rel=1e-5)


def test_gradient_is_clipped_before_the_update(monkeypatch):
    seen = []
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, max_norm: seen.append(max_norm) or real_clip(params, max_norm))
    model, opt = fresh()
    train_step(model, opt, random_batch(ARCH.vocab_size, 2, 16, "cpu"), "fp32")
    assert seen == [CLIP_NORM] == [1.0]


def test_same_seed_same_run():
    runs = []
    for _ in range(2):
        model, opt = fresh(seed=3)
        batch = random_batch(ARCH.vocab_size, 2, 16, "cpu", torch.Generator().manual_seed(4))
        runs.append([train_step(model, opt, batch, "fp32").item() for _ in range(3)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mixed_precision_on_cpu(dtype):
    model, opt = fresh()
    scaler = make_scaler("cpu", dtype)
    assert (scaler is not None) == (dtype == "fp16")
    batch = random_batch(ARCH.vocab_size, 2, 16, "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    loss = train_step(model, opt, batch, dtype, scaler)
    assert torch.isfinite(loss)
    assert all(p.dtype is torch.float32 for p in model.parameters())  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_scheduler_is_stepped():
    model, opt = fresh()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 10))
    train_step(model, opt, random_batch(ARCH.vocab_size, 1, 16, "cpu"), "fp32", scheduler=sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-4 * 2 / 10)


def test_dtype_names():
    assert torch_dtype("bf16") is torch.bfloat16 and torch_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="expected one of bf16, fp16, fp32"):
        torch_dtype("int8")
