"""Checks for notebook 04 (goodput and SLOs). Expected values are computed from the inputs."""

from __future__ import annotations

from collections.abc import Sequence

from pdlab.exercises import CheckResult, check_close
from pdlab.metrics import SLO, RequestRecord, goodput_rps, slo_attainment

__all__ = ["check_tpot", "check_attainment", "check_goodput"]


def check_tpot(value, record: RequestRecord) -> CheckResult:
    """Exercise 1: TPOT of one record, computed by hand from its times."""
    return check_close("Exercise 1", value, record.tpot_s, rel_tol=1e-6, unit="s",
                       hint="TPOT = (E2E − TTFT) / (output tokens − 1): the first token is excluded.")


def check_attainment(value, records: Sequence[RequestRecord], slo_ttft_s: float, slo_tpot_s: float) -> CheckResult:
    """Exercise 2: SLO attainment of a record set (both SLOs, failed requests count as misses)."""
    expected = slo_attainment(records, SLO(ttft_s=slo_ttft_s, tpot_s=slo_tpot_s))
    return check_close("Exercise 2", value, expected, rel_tol=1e-6,
                       hint="A request counts only if TTFT ≤ SLO and TPOT ≤ SLO; divide by all requests.")


def check_goodput(value, records: Sequence[RequestRecord], slo_ttft_s: float, slo_tpot_s: float) -> CheckResult:
    """Exercise 3: goodput (req/s) of a record set, vLLM's definition."""
    expected = goodput_rps(records, SLO(ttft_s=slo_ttft_s, tpot_s=slo_tpot_s))
    return check_close("Exercise 3", value, expected, rel_tol=1e-6, unit="req/s",
                       hint="Requests meeting every SLO divided by first arrival → last finish.")
