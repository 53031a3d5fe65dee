"""Build transformers' LlamaForCausalLM from a preset or config.json; nothing is downloaded."""
from __future__ import annotations

import torch

from facts.presets import ModelArch


def llama_config(arch: ModelArch, seq_len: int):
    """The transformers LlamaConfig of an architecture."""
    # deferred: transformers (seconds) only in a process that builds a model
    from transformers import LlamaConfig  # noqa: PLC0415

    return LlamaConfig(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.ffn_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        max_position_embeddings=max(seq_len, 128),
        tie_word_embeddings=arch.tie_embeddings,
        rope_theta=arch.rope_theta,
        use_cache=False,
    )


def build_model(arch: ModelArch, seq_len: int, seed: int = 0):
    """A freshly initialised LlamaForCausalLM (fp32 weights; autocast handles mixed precision)."""
    # deferred: transformers (seconds) only in a process that builds a model
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(arch, seq_len))
