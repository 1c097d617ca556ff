"""Model configurations: read HF ``config.json`` files or the catalog; sizes and KV bytes.

Rules for HF configs outside the catalog:
- ``head_dim`` absent → ``hidden_size / num_attention_heads``;
- ``num_key_value_heads`` absent → full multi-head attention (KV heads = attention heads);
- ``kv_lora_rank`` present → MLA: per layer the cache holds the compressed latent
  (``kv_lora_rank``) plus the decoupled RoPE key (``qk_rope_head_dim``), with no factor 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlab.catalog import CatalogError, load_yaml, lookup
from pdlab.hardware import dtype_bytes

__all__ = [
    "ModelConfig",
    "get_model",
    "list_models",
    "from_hf_config",
    "load_config",
    "kv_bytes_per_token",
    "param_counts",
    "weight_bytes",
]

_UNGATED_TYPES = {"opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "gpt_bigcode"}


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer (sizes in elements, not bytes)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    tie_embeddings: bool = False
    # Mixture of experts (0 experts = dense)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek); 0 = standard attention
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    source: str = ""

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_kind(self) -> str:
        """``"MLA"``, ``"MHA"`` (KV heads = heads), ``"MQA"`` (1 KV head) or ``"GQA"``."""
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def from_hf_config(cfg: dict[str, Any], name: str = "custom", source: str = "") -> ModelConfig:
    """Build a :class:`ModelConfig` from the fields of an HF ``config.json`` dict."""
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(cfg, "num_attention_heads", "n_head")
    if hidden is None or layers is None or heads is None:
        raise ValueError(f"config {name!r} lacks hidden_size/num_hidden_layers/num_attention_heads")
    kv_heads = _first(cfg, "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _first(cfg, "head_dim", default=hidden // heads)
    ffn = _first(cfg, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    model_type = str(cfg.get("model_type", "")).lower()
    gated = not ("ffn_dim" in cfg or model_type in _UNGATED_TYPES)
    return ModelConfig(
        name=name,
        hidden_size=int(hidden),
        num_layers=int(layers),
        num_heads=int(heads),
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(ffn),
        vocab_size=int(_first(cfg, "vocab_size", default=32000)),
        gated_mlp=gated,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=int(_first(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0)),
        experts_per_token=int(_first(cfg, "num_experts_per_tok", default=0)),
        moe_intermediate_size=int(_first(cfg, "moe_intermediate_size", default=ffn)),
        num_shared_experts=int(_first(cfg, "n_shared_experts", default=0)),
        first_dense_layers=int(_first(cfg, "first_k_dense_replace", default=0)),
        kv_lora_rank=int(_first(cfg, "kv_lora_rank", default=0)),
        q_lora_rank=int(_first(cfg, "q_lora_rank", default=0)),
        qk_rope_head_dim=int(_first(cfg, "qk_rope_head_dim", default=0)),
        qk_nope_head_dim=int(_first(cfg, "qk_nope_head_dim", default=0)),
        v_head_dim=int(_first(cfg, "v_head_dim", default=0)),
        source=source,
    )


def load_config(path: str | Path) -> ModelConfig:
    """Read an HF ``config.json`` (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json at {path}")
    with open(path) as fh:
        cfg = json.load(fh)
    return from_hf_config(cfg, name=path.parent.name or "custom", source=str(path))


def get_model(name: str) -> ModelConfig:
    """A catalog model by name (``llama-3-70b``); unknown names raise UnknownNameError.

    >>> m = get_model("llama-3-8b")
    >>> m.num_layers, m.num_kv_heads, m.head_dim
    (32, 8, 128)
    """
    key, entry = lookup("model", load_yaml("models.yaml"), name)
    cfg = entry.get("config") if isinstance(entry, dict) else None
    if not isinstance(cfg, dict):
        raise CatalogError("models.yaml", key, "config", "must be a mapping of HF config.json fields")
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "vocab_size"):
        value = cfg.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise CatalogError("models.yaml", key, f"config.{field}", f"must be a whole number > 0, got {value!r}")
    try:
        return from_hf_config(cfg, name=key, source=entry.get("source", ""))
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise CatalogError("models.yaml", key, "config", str(exc)) from None


def list_models() -> list[ModelConfig]:
    """All catalog models, in catalog order."""
    return [get_model(k) for k in load_yaml("models.yaml")]


def kv_bytes_per_token(model: ModelConfig, dtype: str = "bf16") -> int:
    """KV-cache bytes one token occupies across all layers.

    Standard attention: ``2 (K and V) × layers × kv_heads × head_dim × bytes``.
    MLA: ``layers × (kv_lora_rank + qk_rope_head_dim) × bytes`` (one latent, no factor 2).

    >>> kv_bytes_per_token(get_model("llama-3-8b"))          # 2 × 32 layers × 8 KV heads × 128 × 2 B
    131072
    >>> kv_bytes_per_token(get_model("llama-3-8b"), "fp8")   # half the bytes per element
    65536
    """
    per_elem = dtype_bytes(dtype)
    if model.is_mla:
        elems = model.num_layers * (model.kv_lora_rank + model.qk_rope_head_dim)
    else:
        elems = 2 * model.num_layers * model.num_kv_heads * model.head_dim
    return int(math.ceil(elems * per_elem))


def _attention_params(m: ModelConfig) -> int:
    h = m.hidden_size
    if m.is_mla:
        qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * m.num_heads * qk_dim) if m.q_lora_rank else h * m.num_heads * qk_dim
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + m.num_heads * m.v_head_dim * h
    q_out = 2 * h * m.num_heads * m.head_dim
    kv = 2 * h * m.num_kv_heads * m.head_dim
    return q_out + kv


def _mlp_params(hidden: int, ffn: int, gated: bool) -> int:
    return (3 if gated else 2) * hidden * ffn


def param_counts(model: ModelConfig) -> dict[str, int]:
    """Parameter counts: ``total``, ``active`` (per token, MoE top-k), ``embedding``, ``per_layer_attention``.

    Norms and biases are left out (well under 0.1% of the total).
    """
    m = model
    attn = _attention_params(m)
    embed = m.vocab_size * m.hidden_size * (1 if m.tie_embeddings else 2)
    if m.is_moe:
        dense_layers = m.first_dense_layers
        moe_layers = m.num_layers - dense_layers
        expert = _mlp_params(m.hidden_size, m.moe_intermediate_size, m.gated_mlp)
        router = m.hidden_size * m.num_experts
        dense_mlp = _mlp_params(m.hidden_size, m.intermediate_size, m.gated_mlp)
        total_mlp = dense_layers * dense_mlp + moe_layers * (
            (m.num_experts + m.num_shared_experts) * expert + router)
        active_mlp = dense_layers * dense_mlp + moe_layers * (
            (m.experts_per_token + m.num_shared_experts) * expert + router)
    else:
        total_mlp = active_mlp = m.num_layers * _mlp_params(m.hidden_size, m.intermediate_size, m.gated_mlp)
    body = m.num_layers * attn
    return {
        "total": body + total_mlp + embed,
        "active": body + active_mlp + embed,
        "embedding": embed,
        "per_layer_attention": attn,
    }


def weight_bytes(model: ModelConfig, dtype: str = "bf16") -> float:
    """Bytes of all weights at a dtype (total parameters × bytes per element).

    >>> round(weight_bytes(get_model("opt-13b")) / 1e9, 1), round(weight_bytes(get_model("opt-13b"), "fp8") / 1e9, 1)
    (25.7, 12.8)
    """
    return param_counts(model)["total"] * dtype_bytes(dtype)
