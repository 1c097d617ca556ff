"""Checks for lab 07 (NVIDIA Dynamo: frontend, KV router and mocker workers). Expected values come from the run."""

from __future__ import annotations

from collections.abc import Sequence

from pdlab.exercises import CheckResult, check_close
from pdlab.metrics import RequestRecord

__all__ = ["check_round_robin_hit_share", "check_follow_up_ttft_ms"]


def _prefix_found(hash_ids: Sequence[int], cache: set[int]) -> int:
    k = 0
    while k < len(hash_ids) and hash_ids[k] in cache:
        k += 1
    return k


def check_round_robin_hit_share(value, requests: Sequence, workers: int) -> CheckResult:
    """Exercise 1: under round-robin (request ``i`` → worker ``i % workers``, in arrival order) with unlimited
    prefix caches, the share (0–1) of all prompt blocks that are a prefix its worker has already seen."""
    seen: list[set[int]] = [set() for _ in range(workers)]
    found = total = 0
    for i, r in enumerate(sorted(requests, key=lambda r: r.arrival_s)):
        cache = seen[i % workers]
        found += _prefix_found(r.hash_ids, cache)
        total += len(r.hash_ids)
        cache.update(r.hash_ids)
    expected = found / total if total else float("nan")
    return check_close("Exercise 1", value, expected, rel_tol=1e-6,
                       hint="Walk the requests in arrival order; worker i % KV_WORKERS; count the leading hash ids "
                            "already in that worker's set (stop at the first miss), then add all of them to it. "
                            "Divide by the number of blocks of all requests (a share, not a percentage).")


def check_follow_up_ttft_ms(value, records: Sequence[RequestRecord], requests: Sequence,
                            prefix_blocks: int = 4) -> CheckResult:
    """Exercise 2: the mean TTFT in milliseconds of the completed follow-up turns: requests whose first
    ``prefix_blocks`` hash ids belong to a conversation that an earlier request of the slice started."""
    started: set[tuple[int, ...]] = set()
    follow: set[int] = set()
    for r in sorted(requests, key=lambda r: r.arrival_s):
        key = tuple(r.hash_ids[:prefix_blocks])
        if key in started:
            follow.add(r.request_id)
        started.add(key)
    ttfts = [rec.ttft_s for rec in records if rec.request_id in follow and rec.ok and rec.ttft_s is not None]
    expected = 1e3 * sum(ttfts) / len(ttfts) if ttfts else float("nan")
    return check_close("Exercise 2", value, expected, rel_tol=1e-4, unit="ms",
                       hint="A follow-up turn is a request whose first four hash ids appeared in an earlier request "
                            "of the slice; average the TTFT of those (completed) requests only, in milliseconds.")
