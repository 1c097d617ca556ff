"""Checks for lab 06 (faults on a live 1P1D deployment). Expected values come from the run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pdlab.exercises import CheckResult, check_true

__all__ = ["check_recompute_prediction"]


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
