"""Checks for lab 08 (NVIDIA Dynamo: frontend, KV router and mocker workers). Expected values come from the run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pdlab.exercises import CheckResult, check_close, check_true, record_expected
from pdlab.metrics import RequestRecord

__all__ = ["check_round_robin_hit_share", "check_turn_ttft_ms", "turn_ttft_ms"]


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
                       hint="Walk the requests in arrival order; request i goes to worker i % n, with n the number of "
                            "workers asked for (2 * KV_WORKERS); count the leading hash ids "
                            "already in that worker's set (stop at the first miss), then add all of them to it. "
                            "Divide by the number of blocks of all requests (a share, not a percentage).")


def _turn_kinds(requests: Sequence, prefix_blocks: int) -> dict[int, str]:
    """request_id → "first" or "follow-up": a follow-up's first ``prefix_blocks`` hash ids were started by an
    earlier request of the slice (arrival order)."""
    started: set[tuple[int, ...]] = set()
    kinds: dict[int, str] = {}
    for r in sorted(requests, key=lambda r: r.arrival_s):
        key = tuple(r.hash_ids[:prefix_blocks])
        kinds[r.request_id] = "follow-up" if key in started else "first"
        started.add(key)
    return kinds


def turn_ttft_ms(records: Sequence[RequestRecord], requests: Sequence, prefix_blocks: int = 4) -> dict[str, float]:
    """Mean TTFT in milliseconds of the completed first turns and follow-up turns of one run:
    ``{"first": ms, "follow-up": ms}`` (NaN for a kind with no completed request)."""
    kinds = _turn_kinds(requests, prefix_blocks)
    out = {}
    for kind in ("first", "follow-up"):
        ttfts = [rec.ttft_s for rec in records
                 if kinds.get(rec.request_id) == kind and rec.ok and rec.ttft_s is not None]
        out[kind] = 1e3 * sum(ttfts) / len(ttfts) if ttfts else float("nan")
    return out


def check_turn_ttft_ms(value: Mapping[str, Mapping[str, float]] | None,
                       records_by_router: Mapping[str, Sequence[RequestRecord]], requests: Sequence,
                       prefix_blocks: int = 4, rel_tol: float = 1e-4) -> CheckResult:
    """Exercise 2: ``{router: {"first": ms, "follow-up": ms}}``, the mean TTFT in milliseconds of the completed
    first turns and follow-up turns under each router (follow-up: its first ``prefix_blocks`` hash ids were
    started by an earlier request of the slice)."""
    expected = {router: turn_ttft_ms(recs, requests, prefix_blocks) for router, recs in records_by_router.items()}
    for router, kinds in expected.items():
        for kind, ms in kinds.items():
            record_expected(f"Exercise 2 ({router}, {kind})", ms, kind="measured")
    if value is None:
        return check_true("Exercise 2", None, False, good="", bad="")
    bad = []
    for router, kinds in expected.items():
        for kind, ms in kinds.items():
            try:
                got = float(dict(value)[router][kind])
            except (KeyError, TypeError, ValueError):
                bad.append(f"{router}/{kind}: missing")
                continue
            if not math.isclose(got, ms, rel_tol=rel_tol):
                bad.append(f"{router}/{kind}: {got:.6g} ms")
    return check_true("Exercise 2", value, not bad,
                      good="the four means match the runs",
                      bad=f"not these: {'; '.join(bad)}. A follow-up turn's first four hash ids appeared in an "
                          "earlier request of the slice; average the completed requests' TTFT of each kind, per "
                          "router, in milliseconds.")
