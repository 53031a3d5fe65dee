"""Model presets of what people train with DiLoCo: parameter counts against the published ones, GQA FLOPs."""
from __future__ import annotations

import json

import pytest

from facts.presets import PRESETS, load_arch

# Parameter counts as published: the safetensors totals of meta-llama/Llama-3.2-1B (1.24B),
# Llama-3.2-3B (3.21B), Llama-3.1-8B (8.03B), TinyLlama-1.1B (OpenDiLoCo's 1B), and INTELLECT-1's
# "10B" (model card; 10,211,381,248 from its 42-layer Llama-3-8B-shaped config).
PUBLISHED = {
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "llama-1b": 1_100_048_384,
    "intellect-1": 10_211_381_248,
    "llama-150m": 214_983_680,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_are_the_published_ones(name):
    assert PRESETS[name].params == PUBLISHED[name]


def test_public_config_values():
    a = PRESETS["llama-3.2-1b"]
    assert (a.hidden_size, a.num_layers, a.num_heads, a.num_kv_heads, a.ffn_size, a.vocab_size) == (2048, 16, 32, 8, 8192, 128256)
    assert a.tie_embeddings and a.rope_theta == 500000.0 and a.head_dim == 64
    b = PRESETS["llama-3.2-3b"]
    assert (b.hidden_size, b.num_layers, b.num_heads, b.num_kv_heads, b.head_dim) == (3072, 28, 24, 8, 128)
    c = PRESETS["llama-3.1-8b"]
    assert not c.tie_embeddings and (c.ffn_size, c.num_kv_heads) == (14336, 8)
    i = PRESETS["intellect-1"]
    assert (i.hidden_size, i.num_layers, i.num_heads, i.num_kv_heads, i.ffn_size) == (4096, 42, 32, 8, 14336)


def test_gqa_flops_count_the_smaller_kv_projections_and_full_attention():
    """6·N_matmul counts k/v at kv_heads·head_dim; attention scores use every query head (6·L·s·h)."""
    a = PRESETS["llama-3.1-8b"]
    h, kv, f, L, V, s = 4096, 8 * 128, 14336, 32, 128256, 8192
    matmul = L * (2 * h * h + 2 * h * kv + 3 * h * f) + V * h
    norms = L * 2 * h + h
    assert a.train_flops_per_token(s) == 6.0 * (matmul + norms) + 6.0 * L * s * h
    assert a.train_flops_per_token(s) == 51_471_998_976.0
    tied = PRESETS["llama-3.2-1b"]  # tied: the one shared matrix is the head's matmul
    assert tied.train_flops_per_token(0) == 6.0 * tied.params


def test_a_config_json_gives_the_same_architecture(tmp_path):
    cfg = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": True, "rope_theta": 500000.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    arch = load_arch(str(path))
    assert arch.params == PUBLISHED["llama-3.2-1b"] and arch.rope_theta == 500000.0


def test_rope_theta_reaches_the_transformers_config():
    pytest.importorskip("transformers")
    from train.models import llama_config

    def theta(cfg):  # transformers 5 keeps it in rope_parameters, 4.x as an attribute
        params = getattr(cfg, "rope_parameters", None)
        return params["rope_theta"] if params else cfg.rope_theta

    assert theta(llama_config(PRESETS["llama-3.1-8b"], 128)) == 500000.0
    assert theta(llama_config(PRESETS["tiny"], 128)) == 10000.0
