"""Checks for lab 06 (faults and overload on a live 1P1D deployment). Expected values come from the run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.metrics import SLO, RequestRecord, slo_attainment
from pdlab.serve.overload import is_rejected

__all__ = ["check_admitted_attainment", "check_faults_answered"]


def check_admitted_attainment(value, records: Sequence[RequestRecord], slo: SLO) -> CheckResult:
    """Exercise 1: the share (0–1) of the *admitted* requests of a run that met ``slo`` (TTFT and
    TPOT). Requests the front door refused (HTTP 503) are left out; an admitted request that failed
    later counts as a miss."""
    expected = slo_attainment([r for r in records if not is_rejected(r)], slo)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6,
                       hint="Leave out the requests refused with HTTP 503; of the rest, a request meets the SLO "
                            "when it completed with TTFT ≤ the TTFT bound and TPOT ≤ the TPOT bound (a "
                            "single-token answer has no TPOT). Use the looser SLO, not the run's.")


def check_faults_answered(value, outcomes: Iterable, policy: str) -> CheckResult:
    """Exercise 2: the set of faults after which the client still got the full answer under ``policy``
    (``outcomes``: :class:`pdlab.serve.faults.FaultOutcome` rows)."""
    expected = sorted({o.fault for o in outcomes if o.policy == policy and o.client == "answer"})
    got = None if value is None else sorted(set(value))
    return check_true("Exercise 2", got, got == expected, expected=expected, choice=True,
                      good=f"{len(expected)} of the faults left the client with its full answer under {policy!r}",
                      bad="Not that set: read the client column of the table for this policy; 'left' is the "
                          "client that hung up, not an answer.")
