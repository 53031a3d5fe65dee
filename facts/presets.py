"""Model architectures by name, without torch: sizes, parameter counts, training FLOPs.

The same presets build real models in `train.models` (torch) and give the simulator its
parameter count and FLOPs per token (no torch). A preset may also be a path to a Hugging Face
`config.json` of a LLaMA-style model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from formats.files import read_regular_file, short

MAX_CONFIG_BYTES = 1 << 20
# The largest size a config may give (hidden size, layers, heads, vocabulary...): far beyond any
# model, small enough that the parameter count and FLOPs stay exact in float64.
MAX_SIZE = 1 << 24


class PresetError(ValueError):
    """An unknown preset name or an unreadable / incomplete config.json."""


@dataclass(frozen=True)
class ModelArch:
    """A LLaMA-style decoder: sizes as in transformers' LlamaConfig."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    tie_embeddings: bool = False
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_size", "vocab_size"):
            if getattr(self, field) <= 0:
                raise PresetError(f"model {self.name}: {field} must be a positive integer")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise PresetError(f"model {self.name}: hidden_size/num_heads/num_kv_heads do not divide")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def params(self) -> int:
        """Parameter count: embeddings, per layer (q, k, v, o, gate/up/down, 2 RMSNorms), final norm, head."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        per_layer = h * h + 2 * h * kv + h * h + 3 * h * self.ffn_size + 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return embed + self.num_layers * per_layer + h + head

    def train_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, Kaplan et al. (2020): 6·N_matmul + 6·L·seq·h.

        N_matmul counts every weight used in a matrix multiply (the input embedding is a
        lookup, so it is excluded; the LM head is included). The second term is attention's
        QKᵀ and AV products (2·L·seq·h per token forward, ×3 for forward + backward).
        """
        n_matmul = self.params - self.vocab_size * self.hidden_size
        if self.tie_embeddings:
            n_matmul += self.vocab_size * self.hidden_size
        return 6.0 * n_matmul + 6.0 * self.num_layers * seq_len * self.hidden_size


PRESETS: dict[str, ModelArch] = {
    # OpenDiLoCo's 150M model (the paper's): about 215M parameters with untied embeddings.
    "llama-150m": ModelArch("llama-150m", 1024, 12, 16, 16, 2688, 32000),
    "llama-60m": ModelArch("llama-60m", 1024, 3, 16, 16, 2688, 32000),
    # OpenDiLoCo's 1B (TinyLlama's architecture, GQA with 4 KV heads).
    "llama-1b": ModelArch("llama-1b", 2048, 22, 32, 4, 5632, 32000),
    # Meta's Llama 3.2 / 3.1 configs (Hugging Face config.json of meta-llama/Llama-3.2-1B, -3B,
    # Llama-3.1-8B): GQA with 8 KV heads, vocabulary 128,256, rope_theta 500,000 (their "llama3"
    # rope scaling, which changes no size or FLOP count, is not reproduced); 3.2 ties embeddings.
    "llama-3.2-1b": ModelArch("llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, tie_embeddings=True, rope_theta=500000.0),
    "llama-3.2-3b": ModelArch("llama-3.2-3b", 3072, 28, 24, 8, 8192, 128256, tie_embeddings=True, rope_theta=500000.0),
    "llama-3.1-8b": ModelArch("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, rope_theta=500000.0),
    # INTELLECT-1 (Prime Intellect, DiLoCo across continents): 42 layers, hidden 4096, 32 heads,
    # vocabulary 128,256 (its model card); 8 KV heads and FFN 14,336 (prime's llama3 "10B" config:
    # ffn_dim_multiplier 1.3, multiple_of 1024), untied, rope_theta 500,000. About 10.2B parameters.
    "intellect-1": ModelArch("intellect-1", 4096, 42, 32, 8, 14336, 128256, rope_theta=500000.0),
    # Small enough to train on a laptop CPU in seconds.
    "tiny": ModelArch("tiny", 64, 2, 2, 2, 256, 1024),
}


def load_arch(preset_or_path: str, base_dir: Path | None = None) -> ModelArch:
    """A preset by name, or a LLaMA config.json (relative paths resolve against base_dir)."""
    if preset_or_path in PRESETS:
        return PRESETS[preset_or_path]
    if not preset_or_path.endswith(".json"):
        raise PresetError(f"unknown model preset {preset_or_path!r}; expected one of "
                          f"{', '.join(PRESETS)} or a path to a config.json")
    path = Path(preset_or_path)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    data = read_regular_file(path, "a LLaMA config.json", MAX_CONFIG_BYTES, PresetError, "model config file")
    try:
        cfg = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise PresetError(f"{short(path)}: not UTF-8 ({exc.reason} at byte {exc.start}); "
                          "expected a JSON model config") from None
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise PresetError(f"{short(path)}: not a readable JSON model config ({exc})") from None
    if not isinstance(cfg, dict):
        raise PresetError(f"{short(path)}: expected a JSON object (a LLaMA config.json), got {type(cfg).__name__}")
    kv = cfg.get("num_key_value_heads")
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise PresetError(f"{short(path)}: key 'tie_word_embeddings': expected true or false, got {tie!r}")
    return ModelArch(
        name=str(path),
        hidden_size=_size(cfg, "hidden_size", path),
        num_layers=_size(cfg, "num_hidden_layers", path),
        num_heads=_size(cfg, "num_attention_heads", path),
        num_kv_heads=_size(cfg, "num_key_value_heads" if kv is not None else "num_attention_heads", path),
        ffn_size=_size(cfg, "intermediate_size", path),
        vocab_size=_size(cfg, "vocab_size", path),
        tie_embeddings=tie,
        rope_theta=_rope_theta(cfg, path),
    )


def _rope_theta(cfg: dict, path: Path) -> float:
    """config.json's rope_theta (transformers' default 10000 when absent), a positive number."""
    value = cfg.get("rope_theta", 10000.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1e12:
        raise PresetError(f"{short(path)}: key 'rope_theta': expected a positive number, got {value!r}")
    return float(value)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a config may hold")


def _size(cfg: dict, key: str, path: Path) -> int:
    """A positive integer size from config.json (an integral float is accepted), at most MAX_SIZE."""
    if key not in cfg:
        raise PresetError(f"{short(path)}: key {key!r} missing; expected a LLaMA config.json")
    value = cfg[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise PresetError(f"{short(path)}: key {key!r}: expected an integer from 1 to {MAX_SIZE}, got {value!r}")
    return value
