"""Checks for notebook 02 (KV-cache napkin math). Expected values are computed, not stored.

The exercises use parameters of their own (another model, dtype, length and link than the worked
example), passed in from the notebook, so that no answer is already printed on the page.
"""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import dtype_bytes, get_link
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.transfer import kv_transfer

__all__ = ["check_request_kv_gib", "check_transfer_ms", "check_mla_bytes", "check_kv_bytes_70b_fp8",
           "check_transfer_ms_ndr", "check_mla_bytes_fp8"]


def check_request_kv_gib(value, model: str, tokens: int, dtype: str) -> CheckResult:
    """Exercise 1: the KV cache of one ``tokens``-token request of ``model`` in ``dtype``, in GiB (2³⁰ B)."""
    expected = kv_bytes_per_token(get_model(model), dtype) * tokens / 2**30
    return check_close("Exercise 1", value, expected, rel_tol=0.005, unit="GiB",
                       hint="bytes per token = 2 (K and V) × layers × KV heads × head_dim × bytes per element; "
                            "× tokens; GiB = 2**30 B, not 1e9 B.")


def check_transfer_ms(value, model: str, tokens: int, dtype: str, link: str) -> CheckResult:
    """Exercise 2: milliseconds to ship that request's KV over ``link`` (per-direction, decimal bytes/s)."""
    expected = kv_transfer(get_model(model), tokens, dtype, get_link(link).bytes_per_s).transfer_s * 1e3
    return check_close("Exercise 2", value, expected, rel_tol=0.005, unit="ms",
                       hint="KV bytes ÷ the link's bytes/s (Gbit/s ÷ 8 = GB/s = 1e9 B/s); mind ms vs s and GB vs GiB.")


def check_mla_bytes(value, num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: str) -> CheckResult:
    """Exercise 3: KV bytes per token of an MLA model with the given config fields and cache dtype."""
    expected = num_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes(dtype)
    return check_close("Exercise 3", value, expected, rel_tol=1e-9, unit="B/token",
                       hint="MLA caches one latent (kv_lora_rank) plus the RoPE key (qk_rope_head_dim) per layer, "
                            "no factor 2.")


def check_kv_bytes_70b_fp8(value) -> CheckResult:
    """KV bytes per token of Llama-3-70B with an fp8 cache (the worked example; kept for the widget tests)."""
    expected = kv_bytes_per_token(get_model("llama-3-70b"), "fp8")
    return check_close("Worked example", value, expected, rel_tol=1e-9, unit="B/token",
                       hint="2 (K and V) × layers × KV heads × head_dim × bytes per element.")


def check_transfer_ms_ndr(value) -> CheckResult:
    """Milliseconds to ship 10,000 tokens of Llama-3-70B fp8 KV over InfiniBand NDR (the worked example)."""
    expected = kv_transfer(get_model("llama-3-70b"), 10_000, "fp8", get_link("ib-ndr").bytes_per_s).transfer_s * 1e3
    return check_close("Worked example", value, expected, rel_tol=0.01, unit="ms",
                       hint="NDR is 400 Gbit/s = 50 GB/s per direction; mind ms vs s and GB vs GiB.")


def check_mla_bytes_fp8(value) -> CheckResult:
    """KV bytes per token of DeepSeek-V3 (MLA) with an fp8 cache (the worked example's table)."""
    expected = kv_bytes_per_token(get_model("deepseek-v3"), "fp8")
    return check_close("Worked example", value, expected, rel_tol=1e-9, unit="B/token",
                       hint="MLA caches one latent (kv_lora_rank) plus the RoPE key (qk_rope_head_dim) per layer, no factor 2.")
