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

    def __init__(self, inner: RoutingPolicy, decisions: list[str] | None = None):
        self.inner, self.name, self.needs_estimates = inner, getattr(inner, "name", "yours"), inner.needs_estimates
        self.decisions = decisions

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        target = self.inner.decide(req, estimates)
        if target not in TARGETS:
            raise ValueError(f"a routing policy must return one of {TARGETS}, got {target!r}")
        if self.decisions is not None:
            self.decisions.append(target)
        return target


def routing_goodput(policy: RoutingPolicy, requests: Sequence[Any], rates_rps: Sequence[float], slo: SLO,
                    cluster: Mapping[str, Any], *, attainment: float = 0.9, seed: int = 0,
                    decisions: list[tuple[str, ...]] | None = None) -> float:
    """The lab's harness: goodput (req/s) of ``policy`` on the routed simulator, DistServe's way: the highest
    rate of ``rates_rps`` (ascending, tried in order) up to which every tried rate has ≥ ``attainment`` of the
    requests meeting ``slo``; 0 when the lowest rate already misses. ``cluster``: keywords of
    :func:`pdlab.router.sim.simulate_routed` (``gpu``, ``model``, pool sizes, ``tp``, ``link`` …); ``seed``
    draws the arrival times. ``decisions``, when given, receives the policy's targets, one tuple per tried rate."""
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
        made: list[str] = []
        res = simulate_routed(with_rate(requests, rate, seed=seed), gpu, model, policy=_Validated(policy, made),
                              **kwargs)
        if decisions is not None:
            decisions.append(tuple(made))
        if slo_attainment(res.records, slo) < attainment:
            break
        best = rate
    return best


def check_routing_policy(value, requests: Sequence[Any], rates_rps: Sequence[float], slo: SLO,
                         cluster: Mapping[str, Any], shipped: Mapping[str, RoutingPolicy], *,
                         attainment: float = 0.9, seed: int = 0, second_seed: int | None = None) -> CheckResult:
    """Exercise 2: a routing policy of your own passes when its goodput (:func:`routing_goodput`) on
    ``requests`` is **strictly more** than the best of the ``shipped`` policies' with arrivals drawn from
    ``seed``, and at least the best shipped policy's with arrivals drawn from ``second_seed`` (default
    ``seed + 1``), so that a policy tuned to one draw of arrivals does not pass by luck. A policy that
    makes the same decisions as a shipped one at every rate tried (a copy, under any name) fails."""
    second = seed + 1 if second_seed is None else int(second_seed)
    if second == seed:
        raise ValueError(f"second_seed must differ from seed ({seed}): it checks the policy on other arrivals")
    runs = {}
    for name, p in shipped.items():
        made: list[tuple[str, ...]] = []
        runs[name] = (routing_goodput(p, requests, rates_rps, slo, cluster, attainment=attainment, seed=seed,
                                      decisions=made), made)
    scores = {name: g for name, (g, _) in runs.items()}
    best_name = max(scores, key=scores.get)
    best = scores[best_name]
    if value is None:
        return check_true("Exercise 2", None, False, good="", bad="", expected=best, choice=True)
    made = []
    mine = routing_goodput(value, requests, rates_rps, slo, cluster, attainment=attainment, seed=seed, decisions=made)
    table = ", ".join(f"{n} {g:g}" for n, g in scores.items())
    copies = [name for name, (_, theirs) in runs.items() if theirs[:len(made)] == made[:len(theirs)]]
    if copies:
        return check_true("Exercise 2", value, False, expected=best, choice=True, good="",
                          bad=f"your policy makes the same decisions as the shipped {copies[0]} at every rate tried: "
                              "a copy of a shipped policy is not a policy of your own. Which requests' prefill "
                              "stalls the colocated decodes, and which pool is past its knee where it misses?")
    if mine <= best:
        return check_true("Exercise 2", value, False, expected=best, choice=True, good="",
                          bad=f"your policy's goodput is {mine:g} req/s; it must be more than the best shipped "
                              f"policy's, {best_name}'s {best:g} req/s (shipped: {table}). Which pool is past its "
                              "knee at the rate where the best shipped policy misses, and which one has room?")
    second_scores = {name: routing_goodput(p, requests, rates_rps, slo, cluster, attainment=attainment, seed=second)
                     for name, p in shipped.items()}
    second_best = max(second_scores, key=second_scores.get)
    mine_second = routing_goodput(value, requests, rates_rps, slo, cluster, attainment=attainment, seed=second)
    return check_true("Exercise 2", value, mine_second >= second_scores[second_best], expected=best, choice=True,
                      good=f"your policy's goodput {mine:g} req/s > the best shipped policy's ({best_name}, {best:g} "
                           f"req/s; shipped: {table}), and on other arrivals (seed {second}) {mine_second:g} ≥ "
                           f"{second_best}'s {second_scores[second_best]:g} req/s",
                      bad=f"your policy beats the shipped ones on seed {seed} ({mine:g} > {best:g} req/s) but not on "
                          f"other arrivals: seed {second} gives it {mine_second:g} req/s, below {second_best}'s "
                          f"{second_scores[second_best]:g}. A rule tuned to one draw of arrivals does not hold.")
