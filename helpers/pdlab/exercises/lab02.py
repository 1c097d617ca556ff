"""Checks for lab 02 (SGLang PD behind sglang-router). Expected values are computed from the run."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close, check_true

__all__ = ["check_bootstrap_room_shared", "check_requests_per_worker"]


def check_bootstrap_room_shared(value, rooms_prefill: list, rooms_decode: list, *, real: bool = False,
                                all_completed: bool = True) -> CheckResult:
    """Exercise 1: every request went to a prefill and a decode worker with the same bootstrap room.

    With stand-ins the wire logs hold the rooms; with real SGLang (no wire log) the pairing shows as
    every request completing.
    """
    if real:
        expected = all_completed
    else:
        expected = bool(rooms_prefill) and None not in rooms_prefill and sorted(rooms_prefill) == sorted(rooms_decode)
    ok = value is not None and bool(value) == expected
    return check_true("Exercise 1", value, ok, good=f"{value}: the router paired both halves of each request",
                      bad=f"got {value}; compare the sorted lists of rooms seen by the prefill and the decode worker")


def check_requests_per_worker(value, decode_log: list | None, bench_results: list[dict],
                              wire_requests: int) -> CheckResult:
    """Exercise 2: POST requests the (single) decode worker received."""
    if decode_log is not None:
        expected = len(decode_log)
    else:
        expected = sum(r["completed"] + r["failed"] for r in bench_results) + wire_requests
    return check_close("Exercise 2", value, expected, rel_tol=1e-9, unit="requests",
                       hint="Count the POST entries of the decode worker's wire log (one per routed request).")
