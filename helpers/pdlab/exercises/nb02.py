"""Checks for notebook 02 (KV-cache napkin math). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_link
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.transfer import kv_transfer

__all__ = ["check_kv_bytes_70b_fp8", "check_transfer_ms_ndr", "check_mla_bytes_fp8"]


def check_kv_bytes_70b_fp8(value) -> CheckResult:
    """Exercise 1: KV bytes per token of Llama-3-70B with an fp8 cache."""
    expected = kv_bytes_per_token(get_model("llama-3-70b"), "fp8")
    return check_close("Exercise 1", value, expected, rel_tol=1e-9, unit="B/token",
                       hint="2 (K and V) × layers × KV heads × head_dim × bytes per element.")


def check_transfer_ms_ndr(value) -> CheckResult:
    """Exercise 2: milliseconds to ship 10,000 tokens of Llama-3-70B fp8 KV over InfiniBand NDR."""
    expected = kv_transfer(get_model("llama-3-70b"), 10_000, "fp8", get_link("ib-ndr").bytes_per_s).transfer_s * 1e3
    return check_close("Exercise 2", value, expected, rel_tol=0.01, unit="ms",
                       hint="NDR is 400 Gbit/s = 50 GB/s per direction; mind ms vs s and GB vs GiB.")


def check_mla_bytes_fp8(value) -> CheckResult:
    """Exercise 3: KV bytes per token of DeepSeek-V3 (MLA) with an fp8 cache."""
    expected = kv_bytes_per_token(get_model("deepseek-v3"), "fp8")
    return check_close("Exercise 3", value, expected, rel_tol=1e-9, unit="B/token",
                       hint="MLA caches one latent (kv_lora_rank) plus the RoPE key (qk_rope_head_dim) per layer, no factor 2.")
