"""Checks for lab 06 (faults and overload on a live 1P1D deployment). Expected values come from the run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pdlab.exercises import CheckResult, check_close, check_true

__all__ = ["check_prefill_bound_rps", "check_recompute_prediction"]


def check_prefill_bound_rps(value, short_prefill_s: float, long_prefill_s: float, long_every: int) -> CheckResult:
    """Exercise 2: the highest arrival rate (req/s) the prefill server alone could sustain on the overload
    workload (one request in ``long_every`` has the long prompt, the others the short one), from the
    fitted unloaded prefill times in seconds: utilisation 1 at rate ``1 / mean prefill time``."""
    if min(short_prefill_s, long_prefill_s) <= 0 or long_every < 1:
        raise ValueError(f"prefill times must be > 0 s and long_every ≥ 1, got {short_prefill_s}, "
                         f"{long_prefill_s}, {long_every}")
    mean_s = (long_prefill_s + (long_every - 1) * short_prefill_s) / long_every
    return check_close("Exercise 2", value, 1.0 / mean_s, rel_tol=1e-3, unit="req/s", measured=True,
                       hint="The prefill server is busy t_p(l) seconds per request: average t_p over the mix "
                            "(one long prompt in long_every), then the rate that keeps it busy all the time is "
                            "1 / that mean. Use prefill_model.time_s, in seconds.")


def check_recompute_prediction(value: Mapping[str, bool] | None, outcomes: Iterable, policy: str) -> CheckResult:
    """Exercise 1: a prediction, for every fault the matrix ran, of whether the client ends with its full
    answer (True) or not (False) under ``policy``; graded against the run's
    :class:`pdlab.serve.experiments.faults.FaultOutcome` rows."""
    expected = {o.fault: o.client == "answer" for o in outcomes if o.policy == policy}
    got = None if value is None else {str(k): bool(v) for k, v in dict(value).items()}
    wrong = [] if got is None else sorted(f for f in expected if got.get(f) != expected[f])
    extra = [] if got is None else sorted(set(got) - set(expected))
    ok = got is not None and not wrong and not extra
    return check_true("Exercise 1", got, ok, expected=expected, choice=True,
                      good=f"all {len(expected)} predictions match the run under {policy!r}",
                      bad=(f"the run disagrees on: {', '.join(wrong) or 'none'}"
                           + (f"; not faults of this run: {', '.join(extra)}" if extra else "")
                           + ". Ask for each fault: is the KV (or the stream) the client needs still there, and "
                             "does the policy let the decode make it again?"))
