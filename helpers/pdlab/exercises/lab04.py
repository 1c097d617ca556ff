"""Checks for lab 04 (the agentic benchmark). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.kvcache import cache_hit_ratio

__all__ = ["check_lru_hit_ratio"]


def check_lru_hit_ratio(value, requests, capacity_blocks: int) -> CheckResult:
    """Exercise 1: prefix-cache hit ratio of ``requests`` through one LRU of ``capacity_blocks`` blocks."""
    expected = cache_hit_ratio(requests, capacity_blocks).ratio
    return check_close("Exercise 1", value, expected, rel_tol=0.005,
                       hint="Replay the requests in arrival order through pdlab.kvcache.LRUBlockCache: per request "
                            "count the leading cached blocks (× 512 tokens, at most the prompt), then insert all its "
                            "blocks; divide the hit tokens by all prompt tokens.")
