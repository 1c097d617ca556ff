"""Checks for lab 07 (overload and admission on a live 1P1D deployment). Expected values come from the run."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close

__all__ = ["check_prefill_bound_rps"]


def check_prefill_bound_rps(value, short_prefill_s: float, long_prefill_s: float, long_every: int) -> CheckResult:
    """Exercise 1: the highest arrival rate (req/s) the prefill server alone could sustain on the overload
    workload (one request in ``long_every`` has the long prompt, the others the short one), from the
    fitted unloaded prefill times in seconds: utilisation 1 at rate ``1 / mean prefill time``."""
    if min(short_prefill_s, long_prefill_s) <= 0 or long_every < 1:
        raise ValueError(f"prefill times must be > 0 s and long_every ≥ 1, got {short_prefill_s}, "
                         f"{long_prefill_s}, {long_every}")
    mean_s = (long_prefill_s + (long_every - 1) * short_prefill_s) / long_every
    return check_close("Exercise 1", value, 1.0 / mean_s, rel_tol=1e-3, unit="req/s", measured=True,
                       hint="The prefill server is busy t_p(l) seconds per request: average t_p over the mix "
                            "(one long prompt in long_every), then the rate that keeps it busy all the time is "
                            "1 / that mean. Use prefill_model.time_s, in seconds.")
