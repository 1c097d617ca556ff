"""Checks for lab 02 (SGLang PD behind sglang-router). Expected values are computed from the run."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close, check_true

__all__ = ["check_bootstrap_room_shared", "check_requests_per_worker", "paired_rooms"]


def paired_rooms(rooms_prefill: list, rooms_decode: list) -> list:
    """Sorted bootstrap rooms seen by both the prefill and the decode worker (a multiset intersection)."""
    from collections import Counter

    both = Counter(r for r in rooms_prefill if r is not None) & Counter(r for r in rooms_decode if r is not None)
    return sorted(both.elements())


def check_bootstrap_room_shared(value, rooms_prefill: list, rooms_decode: list, *, real: bool = False,
                                all_completed: bool = True) -> CheckResult:
    """Exercise 1: the sorted list of bootstrap rooms that reached both a prefill and a decode worker.

    A bare ``True`` does not pass: the answer is the list of 63-bit room ids read from the two wire
    logs. With real SGLang (no wire log) the rooms are not visible: the answer is ``[]`` and the
    pairing shows as every request completing.
    """
    if real:
        expected: list = []
        ok = isinstance(value, list | tuple) and list(value) == [] and all_completed
    else:
        expected = paired_rooms(rooms_prefill, rooms_decode)
        ok = (isinstance(value, list | tuple) and not isinstance(value, str) and len(expected) > 0
              and sorted(value) == expected)
    return check_true("Exercise 1", value, ok, expected=expected or None,
                      good=f"{len(expected)} rooms, each seen by both workers: the router paired both halves",
                      bad=f"got {value!r:.80}; expected a list: the rooms present in both the prefill and the decode "
                          "worker's log, sorted (count a room as many times as it appears in both)")


def check_requests_per_worker(value, decode_log: list | None, bench_results: list[dict],
                              wire_requests: int) -> CheckResult:
    """Exercise 2: POST requests the (single) decode worker received."""
    if decode_log is not None:
        expected = len(decode_log)
    else:
        expected = sum(r["completed"] + r["failed"] for r in bench_results) + wire_requests
    return check_close("Exercise 2", value, expected, rel_tol=1e-9, unit="requests",
                       hint="Count the POST entries of the decode worker's wire log (one per routed request).")
