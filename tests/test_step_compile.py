"""The lean step ([training] compile): compiled blocks train as the eager step does, on CPU.

torch.compile fuses each decoder layer's ops (inductor's C++ kernels on CPU); the arithmetic
is the same up to float rounding (fused reductions sum in another order), so after a few AdamW
steps the weights agree to a tolerance far below what one step moves them.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from facts.presets import ModelArch  # noqa: E402
from formats.scenario import compiled_step  # noqa: E402
from train.models import build_model  # noqa: E402
from train.step import compile_blocks, make_optimizer, random_batch, train_step, use_compile  # noqa: E402

TINY = ModelArch("compile-tiny", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=64, vocab_size=128)


def test_compile_rule():
    assert [compiled_step(m, gpu) for m in ("auto", "on", "off") for gpu in (True, False)] == \
        [True, False, True, True, False, False]
    assert use_compile("auto", "cpu") is False and use_compile("on", "cpu") is True
    with pytest.raises(ValueError, match="compile 'yes'"):
        compiled_step("yes", True)


def _train(compiled: bool, steps: int = 3):
    model = build_model(TINY, 16, seed=0)
    if compiled:
        compile_blocks(model)
    optimizer = make_optimizer(model)
    generator = torch.Generator().manual_seed(1)
    losses = [float(train_step(model, optimizer, random_batch(TINY.vocab_size, 2, 16, "cpu", generator), "fp32"))
              for _ in range(steps)]
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_compiled_step_equals_eager_step():
    torch._dynamo.reset()
    eager_losses, eager = _train(False)
    compiled_losses, compiled = _train(True)
    assert set(compiled) == set(eager)  # compiling in place keeps the names checkpoints use
    # fp32 rounding of fused kernels: losses to 1e-5 relative, weights to 1e-5 absolute after 3 steps
    # of lr 4e-4 (each step moves a weight by up to ~4e-4, so the check would see one step's error).
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    worst = max(float((compiled[k] - eager[k]).abs().max()) for k in eager)
    moved = max(float((eager[k] - build_model(TINY, 16, seed=0).state_dict()[k]).abs().max()) for k in eager)
    assert worst < 1e-5 < moved
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
