"""Checks for lab 05 (sim-to-real calibration). Expected values are computed from the lab's own data."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.metrics import SLO, RequestRecord, slo_attainment
from pdlab.sim.latency import FittedLatency

__all__ = ["max_decode_batch", "check_max_decode_batch", "check_attainment_diff"]


def max_decode_batch(latency: FittedLatency, context_tokens: int, step_budget_s: float) -> int:
    """The largest batch B whose decode step ``a + b·B·ctx + c·B`` fits ``step_budget_s`` (0 if none does)."""
    a, b, c = latency.decode
    per_seq = b * context_tokens + c
    if step_budget_s < a + per_seq:
        return 0
    if per_seq <= 0:
        raise ValueError(f"the fitted decode row (a, b, c) = {latency.decode} does not grow with the batch, so "
                         "no batch is the largest: the decode probe could not tell its batches apart (a "
                         "busy machine?); run the calibration again")
    return int(math.floor((step_budget_s - a) / per_seq + 1e-9))


def check_max_decode_batch(value, latency: FittedLatency, context_tokens: int, step_budget_s: float) -> CheckResult:
    """Exercise 1: the largest decode batch of ``context_tokens``-token requests whose step stays
    within ``step_budget_s`` (the TPOT SLO), from the fitted decode row."""
    expected = max_decode_batch(latency, context_tokens, step_budget_s)
    return check_close("Exercise 1", value, expected, rel_tol=1e-9, unit="requests",
                       hint="Solve a + b·B·ctx + c·B ≤ budget for B and round down: a batch one larger misses. "
                            "All three coefficients count (latency.decode = (a, b, c)).")


def check_attainment_diff(value, live: Sequence[RequestRecord], sim: Sequence[RequestRecord], slo: SLO
                          ) -> CheckResult:
    """Exercise 2: simulated minus measured SLO attainment, in percentage points."""
    expected = 100.0 * (slo_attainment(sim, slo) - slo_attainment(live, slo))
    if value is None:
        return check_true("Exercise 2", None, False, good="", bad="", expected=expected)
    try:
        got = float(value)
    except (TypeError, ValueError):
        return check_true("Exercise 2", value, False, good="", bad=f"expected a number, got {type(value).__name__}")
    ok = math.isfinite(got) and abs(got - expected) <= 0.05
    return check_true("Exercise 2", value, ok, good=f"{got:+.1f} percentage points",
                      bad=f"got {got:+.2f}; attainment counts failed requests as misses, and the difference is "
                          "(simulated − measured) × 100 percentage points (pdlab.metrics.slo_attainment)")
