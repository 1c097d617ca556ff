"""Checks for lab 03 (the router). Expected values are computed, not stored."""

from __future__ import annotations

import math
from typing import Any

from pdlab.exercises import CheckResult, check_close
from pdlab.router.policies import TargetLoad

__all__ = ["check_colocated_break_even_output", "colocated_break_even_output"]


def colocated_break_even_output(latency: Any, load: TargetLoad, prompt_tokens: int, tpot_slo_s: float) -> float:
    """The predicted output length (tokens, a real number) at which the router's colocated TPOT
    estimate of a ``prompt_tokens`` request under ``load`` equals ``tpot_slo_s`` (seconds).

    The estimate is ``step + Q / (o − 1)``: ``step`` is one decode step with this request added
    (batch + 1, context + prompt), ``Q`` the prefill time of the queue and this prompt (Σ l² of the
    separate prompts). Solving ``step + Q / (o − 1) = SLO`` gives ``o = 1 + Q / (SLO − step)``;
    infinity when one decode step already misses the SLO."""
    if prompt_tokens <= 0 or tpot_slo_s <= 0:
        raise ValueError(f"prompt_tokens and tpot_slo_s must be positive, got {prompt_tokens}, {tpot_slo_s}")
    step = latency.step_time_s(0, 0.0, load.decode_batch + 1, int(load.decode_ctx_tokens + prompt_tokens))
    queue_and_prompt = latency.step_time_s(int(load.queued_prefill_tokens + prompt_tokens),
                                           float(load.queued_prefill_sq_tokens + prompt_tokens**2), 0, 0)
    if step >= tpot_slo_s:
        return math.inf
    return 1.0 + queue_and_prompt / (tpot_slo_s - step)


def check_colocated_break_even_output(value, latency: Any, load: TargetLoad, prompt_tokens: int,
                                      tpot_slo_s: float) -> CheckResult:
    """Exercise 1: the break-even predicted output length (tokens, not rounded) above which the
    colocated TPOT estimate meets the TPOT SLO (see :func:`colocated_break_even_output`)."""
    expected = colocated_break_even_output(latency, load, prompt_tokens, tpot_slo_s)
    return check_close("Exercise 1", value, expected, rel_tol=1e-3, unit="tokens",
                       hint="Solve step + Q/(o − 1) = SLO for o, not rounded. step: one decode step with this "
                            "request added (batch + 1, context + prompt). Q: the prefill of the queue and this "
                            "prompt, with Σl² of the separate prompts, not (queue + prompt)².")
