"""Checks for notebook 05 (DistServe placement). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.sched.queueing import avg_ttft_inter_op, crossover_rate

__all__ = ["check_inter_op_ttft", "check_crossover", "check_2p1d_per_gpu"]


def check_inter_op_ttft(value, rate: float, service_s: float) -> CheckResult:
    """Exercise 1: average TTFT of a 2-stage pipeline (DistServe §3.1)."""
    return check_close("Exercise 1", value, avg_ttft_inter_op(rate, service_s), rel_tol=1e-3, unit="s",
                       hint="Latency D end to end, but an M/D/1 queue with service D/2: D + R(D/2)²/(2(1 − R·D/2)).")


def check_crossover(value, service_s: float, speedup: float) -> CheckResult:
    """Exercise 2: the rate where inter-op starts to beat intra-op."""
    return check_close("Exercise 2", value, crossover_rate(service_s, speedup), rel_tol=0.01, unit="req/s",
                       hint="Solve Avg_TTFT_intra(R) = Avg_TTFT_inter(R) numerically (bisection or a fine grid).")


def check_2p1d_per_gpu(value, prefill_rate: float, decode_rate: float) -> CheckResult:
    """Exercise 3: per-GPU goodput of 2 prefill GPUs + 1 decode GPU from the single-GPU rates."""
    expected = min(2 * prefill_rate, decode_rate) / 3
    return check_close("Exercise 3", value, expected, rel_tol=1e-3, unit="req/s per GPU",
                       hint="The pair serves min(2 × prefill rate, decode rate); divide by the 3 GPUs.")
