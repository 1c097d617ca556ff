"""Checks for lab 03 (the router). Expected values are computed, not stored."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.metrics import SLO, slo_attainment
from pdlab.router.policies import TARGETS, Estimate, RouteRequest, RoutingPolicy, TargetLoad

__all__ = ["check_colocated_break_even_output", "check_routing_policy", "colocated_break_even_output",
           "routing_goodput"]


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


class _Validated(RoutingPolicy):
    """A student's policy, with every decision checked to be one of the two targets."""

    def __init__(self, inner: RoutingPolicy):
        self.inner, self.name, self.needs_estimates = inner, getattr(inner, "name", "yours"), inner.needs_estimates

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        target = self.inner.decide(req, estimates)
        if target not in TARGETS:
            raise ValueError(f"a routing policy must return one of {TARGETS}, got {target!r}")
        return target


def routing_goodput(policy: RoutingPolicy, requests: Sequence[Any], rates_rps: Sequence[float], slo: SLO,
                    cluster: Mapping[str, Any], *, attainment: float = 0.9, seed: int = 0) -> float:
    """The lab's harness: goodput (req/s) of ``policy`` on the routed simulator, DistServe's way: the highest
    rate of ``rates_rps`` (ascending, tried in order) up to which every tried rate has ≥ ``attainment`` of the
    requests meeting ``slo``; 0 when the lowest rate already misses. ``cluster``: keywords of
    :func:`pdlab.router.sim.simulate_routed` (``gpu``, ``model``, pool sizes, ``tp``, ``link`` …)."""
    from pdlab.router.sim import simulate_routed
    from pdlab.workloads import with_rate

    if not isinstance(policy, RoutingPolicy):
        raise TypeError(f"expected a RoutingPolicy (a class with decide(req, estimates)), got {type(policy).__name__}")
    rates = [float(r) for r in rates_rps]
    if not rates or any(b <= a for a, b in zip(rates, rates[1:], strict=False)) or rates[0] <= 0:
        raise ValueError(f"rates_rps must be positive and ascending, got {list(rates_rps)}")
    kwargs = dict(cluster)
    gpu, model = kwargs.pop("gpu"), kwargs.pop("model")
    best = 0.0
    for rate in rates:
        res = simulate_routed(with_rate(requests, rate, seed=seed), gpu, model, policy=_Validated(policy), **kwargs)
        if slo_attainment(res.records, slo) < attainment:
            break
        best = rate
    return best


def check_routing_policy(value, requests: Sequence[Any], rates_rps: Sequence[float], slo: SLO,
                         cluster: Mapping[str, Any], shipped: Mapping[str, RoutingPolicy], *,
                         attainment: float = 0.9, seed: int = 0) -> CheckResult:
    """Exercise 2: a routing policy of your own passes when its goodput (:func:`routing_goodput`) on
    ``requests`` is at least the best of the ``shipped`` policies' on the same harness."""
    scores = {name: routing_goodput(p, requests, rates_rps, slo, cluster, attainment=attainment, seed=seed)
              for name, p in shipped.items()}
    best_name = max(scores, key=scores.get)
    if value is None:
        return check_true("Exercise 2", None, False, good="", bad="", expected=scores[best_name], choice=True)
    mine = routing_goodput(value, requests, rates_rps, slo, cluster, attainment=attainment, seed=seed)
    table = ", ".join(f"{n} {g:g}" for n, g in scores.items())
    return check_true("Exercise 2", value, mine >= scores[best_name], expected=scores[best_name], choice=True,
                      good=f"your policy's goodput {mine:g} req/s ≥ the best shipped policy's ({best_name}, "
                           f"{scores[best_name]:g} req/s); shipped: {table}",
                      bad=f"your policy's goodput is {mine:g} req/s, below {best_name}'s {scores[best_name]:g} "
                          f"(shipped: {table}). Which requests' prefill stalls the colocated decodes, and which "
                          "pool is past its knee at the rate where you miss?")
