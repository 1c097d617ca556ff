"""Checks for lab 02 (SGLang PD behind smg). Expected values are computed from the run."""

from __future__ import annotations

from pdlab.exercises import FAILED, PASSED, CheckResult, check_close, check_true, report

__all__ = ["check_bootstrap_room_shared", "check_dispatch_gap_ms", "dispatch_gaps_ms", "paired_rooms"]


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


def dispatch_gaps_ms(prefill_log: list[dict], decode_log: list[dict]) -> list[float]:
    """Per bootstrap room seen by both workers: |decode receive time − prefill receive time|, milliseconds
    (wire-log entries carry ``t`` in seconds and the request ``body``)."""
    t_prefill = {e["body"].get("bootstrap_room"): e["t"] for e in prefill_log
                 if e.get("body") and e["body"].get("bootstrap_room") is not None}
    return [abs(e["t"] - t_prefill[room]) * 1e3 for e in decode_log
            if e.get("body") and (room := e["body"].get("bootstrap_room")) in t_prefill]


def check_dispatch_gap_ms(value, prefill_log: list[dict] | None, decode_log: list[dict] | None, *,
                          real: bool = False) -> CheckResult:
    """Exercise 2: the largest gap (ms) between the moments the prefill and the decode worker received the
    two halves of one request. With real SGLang there is no wire log: the answer is ``None``."""
    if real:
        ok = value is None
        return report(CheckResult("Exercise 2", PASSED if ok else FAILED,
                                  "real SGLang logs no wire: nothing to measure" if ok
                                  else "with real SGLang there is no wire log; answer None"))
    gaps = dispatch_gaps_ms(prefill_log or [], decode_log or [])
    if not gaps:
        raise ValueError("no bootstrap room appears in both wire logs: run the wire check (section 2) first")
    return check_close("Exercise 2", value, max(gaps), rel_tol=1e-6, unit="ms", measured=True,
                       hint="pair the entries by body['bootstrap_room'], subtract the prefill entry's t from the "
                            "decode entry's t (seconds), take the absolute value, ×1000, and the largest.")
