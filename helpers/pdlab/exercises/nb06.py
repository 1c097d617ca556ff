"""Checks for notebook 06 (interference and chunked prefill). Expected values are computed."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.sim.latency import LatencyModel

__all__ = ["check_stall", "check_chunks", "check_best_budget", "budget_choice"]

ONE_CALL_OK = {"Exercise 1": "the work is choosing step_time_s's arguments: no decodes in the iteration, "
                             "prefill_sq_tokens = l² for one unchunked prompt"}


def check_stall(value, latency: LatencyModel, prompt_tokens: int) -> CheckResult:
    """Exercise 1: how long running decodes stall while one prompt is prefilled unchunked."""
    expected = latency.prefill_time_s([prompt_tokens])
    return check_close("Exercise 1", value, expected, rel_tol=0.01, unit="s",
                       hint="Without chunking the prefill iteration holds no decodes: the stall is one prefill step.")


def check_chunks(value, prompt_tokens: int, budget: int, decodes: int) -> CheckResult:
    """Exercise 2: iterations a prompt needs under stall-free batching with running decodes."""
    per_iter = budget - decodes
    expected = -(-prompt_tokens // per_iter) if per_iter > 0 else float("inf")
    return check_close("Exercise 2", value, expected, rel_tol=1e-9, unit="iterations",
                       hint="Each iteration gives the running decodes one token each first; the prompt gets the rest "
                            "of the budget: ceil(prompt ÷ (budget − decodes)).")


def budget_choice(table, ttft_slo_s: float) -> int:
    """The token budget with the lowest TPOT p99 among the rows whose TTFT p99 meets the SLO; when no
    row meets it, the budget with the lowest TTFT p99 (the closest to the SLO)."""
    ok = table[table["ttft_p99_s"] <= ttft_slo_s]
    if len(ok):
        return int(ok.sort_values(["tpot_p99_s", "token_budget"]).iloc[0]["token_budget"])
    return int(table.sort_values(["ttft_p99_s", "token_budget"]).iloc[0]["token_budget"])


def check_best_budget(value, table, ttft_slo_s: float) -> CheckResult:
    """Exercise 3: the token budget with the lowest TPOT p99 among those whose TTFT p99 meets the SLO
    (if none meets it: the budget with the lowest TTFT p99). Always has exactly one right answer."""
    expected = budget_choice(table, ttft_slo_s)
    try:
        good = value is not None and not isinstance(value, bool) and int(value) == expected
    except (TypeError, ValueError):
        good = False
    return check_true("Exercise 3", value, good, good=f"budget {value} tokens", expected=expected, choice=True,
                      bad=f"got {value}; filter rows with ttft_p99_s ≤ SLO, then take the lowest tpot_p99_s "
                          "(no row meets the SLO: take the lowest ttft_p99_s)")
