"""Checks for lab 05 (sim-to-real calibration). Expected values are computed from the lab's own data."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.metrics import SLO, RequestRecord, slo_attainment
from pdlab.sim.latency import FittedLatency

__all__ = ["check_decode_step", "check_attainment_diff"]


def check_decode_step(value, latency: FittedLatency, batch: int, context_tokens: int) -> CheckResult:
    """Exercise 1: one decode step of ``batch`` requests of ``context_tokens`` each, from the fitted row (s)."""
    expected = latency.decode_time_s([context_tokens] * batch)
    return check_close("Exercise 1", value, expected, rel_tol=0.005, unit="s",
                       hint="decode = a + b·Σctx + c·batch, with Σctx = batch × context tokens (latency.decode).")


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
