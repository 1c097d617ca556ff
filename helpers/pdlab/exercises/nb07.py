"""Checks for notebook 07 (Mooncake's KVCache-centric scheduling). Expected values are computed, not stored."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_gpu
from pdlab.kvcache import BLOCK_TOKENS, cache_hit_ratio
from pdlab.models import get_model
from pdlab.sched.conductor import mooncake_cluster
from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl

__all__ = ["check_coarse_block_hit_ratio", "check_reuse_prefix_tokens", "check_remote_prefix_ttft_s",
           "coarse_blocks", "coarse_hit_ratio", "reuse_bandwidth_threshold", "reuse_break_even_prefix_tokens"]


@dataclass(frozen=True)
class _Coarse:
    """A request whose block keys are runs of ``merge`` consecutive trace keys (one coarser block each)."""

    hash_ids: tuple
    prompt_tokens: int


def coarse_blocks(hash_ids: Sequence[int], merge: int) -> list[tuple[int, ...]]:
    """Keys of blocks ``merge`` times larger: consecutive runs of ``merge`` trace keys (the last may be shorter).

    Because the trace's keys are prefix-chained, two requests share a coarse block exactly when they share
    every one of its fine keys.
    """
    if merge < 1:
        raise ValueError(f"merge must be a positive number of blocks, got {merge}")
    return [tuple(hash_ids[i:i + merge]) for i in range(0, len(hash_ids), merge)]


def coarse_hit_ratio(requests: Sequence, merge: int) -> float:
    """Unlimited-cache prefix hit ratio (reused ÷ prompt tokens) of ``requests`` in order, with blocks of
    ``merge`` × 512 tokens built from the trace's 512-token keys."""
    coarse = [_Coarse(tuple(coarse_blocks(r.hash_ids, merge)), r.prompt_tokens) for r in requests]
    return cache_hit_ratio(coarse, block_tokens=BLOCK_TOKENS * merge).ratio


def check_coarse_block_hit_ratio(value, n_requests: int, merge: int = 2) -> CheckResult:
    """Exercise 1: unlimited-cache prefix hit ratio of the first ``n_requests`` of the conversation trace
    when the cache keeps blocks of ``merge`` × 512 tokens instead of 512."""
    reqs = read_mooncake_jsonl(mooncake_trace_path("conversation"), limit=n_requests)
    expected = coarse_hit_ratio(reqs, merge)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6,
                       hint=f"a {BLOCK_TOKENS * merge}-token block hits only when all {merge} of its 512-token keys "
                            f"were seen: count leading coarse keys seen, reusable = min({BLOCK_TOKENS * merge} × that, "
                            "input); Σ reusable ÷ Σ input, in trace order.")


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


def reuse_break_even_prefix_tokens(load_bytes_per_s: float, model: str = "llama-3-70b", gpu: str = "h800",
                                   gpus: int = 8, elem_bytes: int = 2, a: float = 4, b: float = 22) -> float:
    """FAST'25 §2.2 solved for p: the prefix length (tokens) above which loading its KV at
    ``load_bytes_per_s`` beats recomputing it, p* = (2·s·G / (gqa·B) − b·d) / a (≤ 0: any prefix pays)."""
    if load_bytes_per_s <= 0:
        raise ValueError(f"load_bytes_per_s must be positive bytes/s, got {load_bytes_per_s}")
    m = get_model(model)
    d = m.hidden_size
    gqa = m.num_heads / m.num_kv_heads
    flops = gpus * get_gpu(gpu).peak_flops("bf16")
    return (2 * elem_bytes * flops / (gqa * load_bytes_per_s) - b * d) / a


def check_reuse_prefix_tokens(value, load_bytes_per_s: float = 6e9, gpu: str = "h800") -> CheckResult:
    """Exercise 2: the shortest LLaMA3-70B prefix whose KV, read at ``load_bytes_per_s``, beats recomputing it
    on 8 × ``gpu`` (tokens)."""
    expected = reuse_break_even_prefix_tokens(load_bytes_per_s, gpu=gpu)
    peak = get_gpu(gpu).peak_flops("bf16") / 1e12
    return check_close("Exercise 2", value, expected, rel_tol=0.01, unit="tokens",
                       hint=f"solve B/G = 2·d·s / (gqa·(a·p·d + b·d²)) for p: G = 8 × {peak:g} TFLOP/s, "
                            f"B = {load_bytes_per_s / 1e9:g} GB/s, d = 8192, gqa = 64/8, s = 2, a = 4, b = 22.")


def check_remote_prefix_ttft_s(value, prompt_tokens: int = 8192, prefix_tokens: int = 4096) -> CheckResult:
    """Exercise 3: Algorithm 1's TTFT estimate on an idle instance that fetches a ``prefix_tokens`` prefix
    held elsewhere for a ``prompt_tokens`` prompt (``mooncake_cluster()`` defaults)."""
    c = mooncake_cluster()
    rest = prompt_tokens - prefix_tokens
    expected = c.transfer_s(prefix_tokens) + c.prefill.time_s(rest, prefix_tokens)
    return check_close("Exercise 3", value, expected, rel_tol=0.01, unit="s",
                       hint=f"queue (0) + transfer of {prefix_tokens:,} tokens of KV + prefill of the other "
                            f"{rest:,} tokens after the prefix.")
