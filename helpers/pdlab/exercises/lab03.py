"""Checks for lab 03 (the router). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.router.policies import LoadEstimator, RouteRequest, TargetLoad

__all__ = ["check_colocated_tpot_estimate"]


def check_colocated_tpot_estimate(value, latency, load: TargetLoad, req: RouteRequest) -> CheckResult:
    """Exercise 1: the predicted TPOT of ``req`` on a colocated instance with ``load`` (seconds)."""
    expected = LoadEstimator(latency, latency, latency).colocated(req, load).tpot_s
    return check_close("Exercise 1", value, expected, rel_tol=0.01, unit="s",
                       hint="One decode step with this request added (batch + 1, context + prompt), plus the "
                            "prefill time of the queue and this prompt spread over (predicted output − 1) tokens.")
