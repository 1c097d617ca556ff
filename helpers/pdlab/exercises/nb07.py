"""Checks for notebook 07 (Mooncake's KVCache-centric scheduling). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_gpu
from pdlab.kvcache import cache_hit_ratio
from pdlab.models import get_model
from pdlab.sched.conductor import mooncake_cluster
from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl

__all__ = ["check_theoretical_hit_ratio", "check_reuse_bandwidth_gbs", "check_remote_prefix_ttft_s",
           "reuse_bandwidth_threshold"]


def check_theoretical_hit_ratio(value, n_requests: int) -> CheckResult:
    """Exercise 1: unlimited-cache prefix hit ratio of the first ``n_requests`` of the conversation trace."""
    reqs = read_mooncake_jsonl(mooncake_trace_path("conversation"), limit=n_requests)
    expected = cache_hit_ratio(reqs).ratio
    return check_close("Exercise 1", value, expected, rel_tol=1e-6,
                       hint="Σ min(512 × leading hash_ids already seen, input) ÷ Σ input, in trace order.")


def reuse_bandwidth_threshold(prefix_tokens: int = 8192, model: str = "llama-3-70b", gpu: str = "a800",
                              gpus: int = 8, elem_bytes: int = 2, a: float = 4, b: float = 22) -> float:
    """FAST'25 §2.2: the load bandwidth (bytes/s) above which reusing a cached prefix beats recomputing it.

    B/G > 2·d·s / (gqa·(a·p·d + b·d²)), with G the node's FLOP/s, d the hidden size, s bytes per element,
    gqa = query heads / KV heads, p the prefix length.
    """
    m = get_model(model)
    d = m.hidden_size
    gqa = m.num_heads / m.num_kv_heads
    flops = gpus * get_gpu(gpu).peak_flops("bf16")
    return flops * 2 * d * elem_bytes / (gqa * (a * prefix_tokens * d + b * d * d))


def check_reuse_bandwidth_gbs(value, prefix_tokens: int = 8192, gpu: str = "a800") -> CheckResult:
    """Exercise 2: the reuse threshold for a ``prefix_tokens`` prefix of LLaMA3-70B on 8 × ``gpu``, in GB/s."""
    expected = reuse_bandwidth_threshold(prefix_tokens, gpu=gpu) / 1e9
    peak = get_gpu(gpu).peak_flops("bf16") / 1e12
    return check_close("Exercise 2", value, expected, rel_tol=0.01, unit="GB/s",
                       hint=f"G = 8 × {peak:g} TFLOP/s; d = 8192; gqa = 64/8; s = 2 bytes (bf16); a = 4, b = 22; "
                            f"p = {prefix_tokens}.")


def check_remote_prefix_ttft_s(value, prompt_tokens: int = 8192, prefix_tokens: int = 4096) -> CheckResult:
    """Exercise 3: Algorithm 1's TTFT estimate on an idle instance that fetches a ``prefix_tokens`` prefix
    held elsewhere for a ``prompt_tokens`` prompt (``mooncake_cluster()`` defaults)."""
    c = mooncake_cluster()
    rest = prompt_tokens - prefix_tokens
    expected = c.transfer_s(prefix_tokens) + c.prefill.time_s(rest, prefix_tokens)
    return check_close("Exercise 3", value, expected, rel_tol=0.01, unit="s",
                       hint=f"queue (0) + transfer of {prefix_tokens:,} tokens of KV + prefill of the other "
                            f"{rest:,} tokens after the prefix.")
