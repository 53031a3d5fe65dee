"""DiLoCo arithmetic in one process: LR schedule, averaging weights, outer step, data corpus."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from formats.scenario import DilocoConfig
from real.core.data import ArrayShard, SyntheticShard, make_chain
from real.core.diloco import OuterState, averaging_weights, inner_lr, outer_sync


def test_inner_lr_warmup_then_cosine_to_min_ratio():
    spec = DilocoConfig(inner_lr=1e-3, warmup_steps=4, cosine_min_lr_ratio=0.1)
    lrs = [inner_lr(s, spec, total_steps=14) for s in range(16)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3)                       # cosine starts at the peak
    assert lrs[9] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))   # halfway down
    assert lrs[14] == pytest.approx(1e-4) and lrs[15] == pytest.approx(1e-4)  # floor, held
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))


def test_averaging_weights_match_their_definitions():
    tokens, steps = [100.0, 300.0], [10, 30]
    assert averaging_weights("uniform", tokens, steps) == ([1.0, 1.0], 2.0)
    assert averaging_weights("tokens", tokens, steps) == ([100.0, 300.0], 400.0)
    coefs, divisor = averaging_weights("normalized", tokens, steps)
    # FedNova: p = (0.25, 0.75), Σ p H = 25; average = 25 · Σ p_i Δ_i / H_i
    assert coefs == pytest.approx([0.25 / 10, 0.75 / 30])
    assert divisor == pytest.approx(1 / 25)
    with pytest.raises(ValueError):
        averaging_weights("median", tokens, steps)


def test_outer_step_matches_torch_sgd_nesterov():
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7)]
    ref = [p.clone().requires_grad_(True) for p in params]
    sgd = torch.optim.SGD(ref, lr=0.7, momentum=0.9, nesterov=True)
    state = OuterState(params)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        sgd.step()
        state.outer_step(torch.cat([g.reshape(-1) for g in grads]), lr=0.7, momentum=0.9)
    torch.testing.assert_close(state.global_flat, torch.cat([r.detach().reshape(-1) for r in ref]),
                               rtol=0, atol=1e-6)  # same formula; foreach kernels may round differently


def test_outer_sync_is_sum_then_divide_of_weighted_pseudo_gradients():
    global_params = [torch.ones(4)]
    state = OuterState(global_params)
    global_params[0].sub_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # the node's inner steps moved it
    # A stand-in all-reduce: another node contributed c·Δ = (10, 10, 10, 10).
    outer_sync(state, DilocoConfig(outer_lr=1.0, outer_momentum=0.0), coef=2.0, divisor=4.0,
               all_reduce=lambda t: t.add_(10.0))
    # Δ_self·2 = (2, 4, 6, 8); sum (12, 14, 16, 18) / 4 = (3, 3.5, 4, 4.5); θ = 1 − that
    assert global_params[0].tolist() == [-2.0, -2.5, -3.0, -3.5]


def test_markov_entropy_rate_matches_empirical_transitions():
    chain = make_chain(seed=3, vocab_size=64, states=16, branching=3)
    assert chain.stationary.sum() == pytest.approx(1.0)
    h = chain.entropy_rate()
    assert 0 < h <= math.log(3)
    shard = SyntheticShard(chain, seq_len=64, seed=3, shard=0)
    seqs = shard.batch(0, 1024).numpy()
    # Empirical conditional entropy of the generated pairs: within sampling error (≈ 65k pairs).
    counts = np.zeros((16, 16))
    np.add.at(counts, (seqs[:, :-1].ravel(), seqs[:, 1:].ravel()), 1)
    p_pair = counts / counts.sum()
    p_cond = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    empirical = -(p_pair[counts > 0] * np.log(p_cond[counts > 0])).sum()
    assert empirical == pytest.approx(h, abs=0.02)


def test_synthetic_shards_are_deterministic_and_distinct():
    chain = make_chain(seed=0, vocab_size=1024)
    a = SyntheticShard(chain, 32, seed=0, shard=0)
    again = SyntheticShard(chain, 32, seed=0, shard=0)
    other = SyntheticShard(chain, 32, seed=0, shard=1)
    assert torch.equal(a.batch(300, 8), again.batch(300, 8))  # resumable from a position
    assert torch.equal(a.batch(0, 300)[250:258], again.batch(250, 8))
    assert not torch.equal(a.batch(0, 8), other.batch(0, 8))
    assert int(a.batch(0, 8).max()) < 256


def test_array_shards_are_disjoint_slices_and_wrap():
    tokens = np.arange(100)
    s0 = ArrayShard(tokens, seq_len=10, shard=0, shards=2, source="x")
    s1 = ArrayShard(tokens, seq_len=10, shard=1, shards=2, source="x")
    assert s0.batch(0, 1).tolist() == [list(range(10))]
    assert s1.batch(0, 1).tolist() == [list(range(50, 60))]
    assert s0.batch(5, 1).tolist() == [list(range(10))]  # 5 windows per shard: wraps
