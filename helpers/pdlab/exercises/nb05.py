"""Checks for notebook 05 (DistServe placement). Expected values are computed, not stored."""

from __future__ import annotations

import math

from pdlab.exercises import CheckResult, check_close

__all__ = ["check_uneven_pipeline_ttft", "check_replicas_vs_intra_op", "check_2p1d_per_gpu",
           "uneven_pipeline_ttft_s", "replicas_vs_intra_op_rate"]


def uneven_pipeline_ttft_s(rate: float, stage_s: tuple[float, ...]) -> float:
    """Average TTFT (s) of a pipeline whose stages take ``stage_s`` seconds (DistServe §3.1, inter-op):
    an M/D/1 queue whose service is the slowest stage, ``D_m = max(stage_s)``, then the whole pipeline,
    ``D_s = sum(stage_s)``: ``D_s + R·D_m² / (2(1 − R·D_m))``; ``inf`` when R·D_m ≥ 1."""
    if rate < 0 or not stage_s or min(stage_s) <= 0:
        raise ValueError(f"rate must be ≥ 0 and every stage time positive, got {rate}, {stage_s}")
    d_m, d_s = max(stage_s), sum(stage_s)
    if rate * d_m >= 1:
        return math.inf
    return d_s + rate * d_m**2 / (2 * (1 - rate * d_m))


def replicas_vs_intra_op_rate(service_s: float, speedup: float, tol: float = 1e-12) -> float:
    """The rate (req/s) above which two 1-GPU replicas (each an M/D/1 queue at R/2, service D) give a
    lower average TTFT than one 2-GPU intra-op instance (service D/K): bisection on the difference of
    ``D + (R/2)·D² / (2(1 − R·D/2))`` and ``D/K + R·D² / (2K(K − R·D))`` over 0 < R < K/D."""
    if service_s <= 0 or not 1 < speedup <= 2:
        raise ValueError(f"service_s must be positive and 1 < speedup ≤ 2, got {service_s}, {speedup}")
    d, k = service_s, speedup

    def intra_minus_replicas(r: float) -> float:
        intra = d / k + r * d**2 / (2 * k * (k - r * d))
        replicas = d + (r / 2) * d**2 / (2 * (1 - r * d / 2))
        return intra - replicas

    lo, hi = 0.0, k / d * (1 - 1e-12)  # intra-op wins at R → 0 (D/K < D) and loses as R·D → K
    while hi - lo > tol * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if intra_minus_replicas(mid) <= 0 else (lo, mid)
    return (lo + hi) / 2


def check_uneven_pipeline_ttft(value, rate: float, stage_s: tuple[float, ...]) -> CheckResult:
    """Exercise 1: average TTFT of a 2-stage pipeline with unequal stages (see :func:`uneven_pipeline_ttft_s`)."""
    return check_close("Exercise 1", value, uneven_pipeline_ttft_s(rate, tuple(stage_s)), rel_tol=1e-3, unit="s",
                       hint="The queue admits a request every D_m = the SLOWEST stage (not D/2); each request then "
                            "spends D_s = the sum of the stages in the pipeline: D_s + R·D_m²/(2(1 − R·D_m)).")


def check_replicas_vs_intra_op(value, service_s: float, speedup: float) -> CheckResult:
    """Exercise 2: the rate above which two replicas beat one 2-way intra-op instance (req/s)."""
    expected = replicas_vs_intra_op_rate(service_s, speedup)
    return check_close("Exercise 2", value, expected, rel_tol=0.01, unit="req/s",
                       hint="Each replica sees R/2: compare D + (R/2)D²/(2(1 − RD/2)) with D/K + RD²/(2K(K − RD)) "
                            "and bisect (or scan a fine grid) on their difference; answer R in req/s, not R·D.")


def check_2p1d_per_gpu(value, prefill_rate: float, decode_rate: float) -> CheckResult:
    """Exercise 3: per-GPU goodput of 2 prefill GPUs + 1 decode GPU from the single-GPU rates."""
    expected = min(2 * prefill_rate, decode_rate) / 3
    return check_close("Exercise 3", value, expected, rel_tol=1e-3, unit="req/s per GPU",
                       hint="The pair serves min(2 × prefill rate, decode rate); divide by the 3 GPUs.")
