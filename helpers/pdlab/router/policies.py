"""Routing policies: send each request to the colocated pool or to the prefill/decode pair.

A policy sees one request — its prompt length and a *predicted* output length — and, when it asks
for them, latency estimates of both targets under their current load (:class:`Estimate`), and
answers ``"colocated"`` or ``"disaggregated"``. The same policy objects drive the live HTTP router
(:mod:`pdlab.router.server`) and the simulator (:mod:`pdlab.router.sim`); each environment fills
in the :class:`TargetLoad` of its targets and a latency model, and :class:`LoadEstimator` turns
them into predicted TTFT and TPOT.

Policies:

- :class:`AllColocated`, :class:`AllDisaggregated` — the monolithic baselines;
- :class:`Threshold` — disaggregate prompts of at least ``prompt_threshold`` tokens (their prefill
  would stall the colocated decodes) whose predicted output is at least ``min_output_tokens``;
- :class:`SLOAware` — predict TTFT and TPOT on both targets and send the request where both fit
  its SLO; when both fit (or neither), where the larger of TTFT/SLO and TPOT/SLO is smaller.

Output-length predictors: :class:`ConstantPredictor` (a fixed guess, e.g. the trace's mean) and
:class:`HistoryPredictor` (learned from recently finished requests, per prompt-length bucket and
per key — e.g. the hash of the prompt's first block, which identifies an agent's system prompt).

Units: tokens and seconds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdlab.metrics import SLO

__all__ = [
    "TARGETS",
    "RouteRequest",
    "Estimate",
    "TargetLoad",
    "LoadEstimator",
    "OutputPredictor",
    "ConstantPredictor",
    "HistoryPredictor",
    "make_predictor",
    "RoutingPolicy",
    "AllColocated",
    "AllDisaggregated",
    "Threshold",
    "SLOAware",
    "ROUTING_POLICIES",
    "make_policy",
]

TARGETS = ("colocated", "disaggregated")


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows about a request: prompt tokens, predicted output tokens, and a key
    (anything hashable that groups similar requests, or None)."""

    prompt_tokens: int
    predicted_output_tokens: float
    key: Hashable | None = None


@dataclass(frozen=True)
class Estimate:
    """Predicted TTFT and TPOT (seconds) of a request on one target."""

    ttft_s: float
    tpot_s: float

    def score(self, slo: SLO) -> float:
        """max(TTFT / TTFT SLO, TPOT / TPOT SLO): ≤ 1 means the request is predicted to meet its SLO."""
        parts = [0.0]
        if slo.ttft_s is not None:
            parts.append(self.ttft_s / slo.ttft_s)
        if slo.tpot_s is not None:
            parts.append(self.tpot_s / slo.tpot_s)
        return max(parts)


@dataclass
class TargetLoad:
    """Load of one instance as a router sees it (tokens).

    ``queued_prefill_tokens`` and ``queued_prefill_sq_tokens`` (Σ l²) describe prompts waiting for
    (or in) prefill; ``decode_batch`` the requests decoding, ``decode_ctx_tokens`` their total
    context. The simulator reads them off its instances; the live router counts its own in-flight
    requests (before the first token: prefill; after: decode).
    """

    queued_prefill_tokens: float = 0.0
    queued_prefill_sq_tokens: float = 0.0
    decode_batch: int = 0
    decode_ctx_tokens: float = 0.0


class LoadEstimator:
    """Predict TTFT and TPOT on each target from its load and a latency model.

    ``colocated_latency``, ``prefill_latency`` and ``decode_latency`` are
    :class:`pdlab.sim.latency.LatencyModel` objects (anything with ``step_time_s(prefill_tokens,
    prefill_sq_tokens, decode_batch, decode_ctx_tokens)``); ``transfer_s(tokens)`` is the KV
    transfer time (0 by default).

    - colocated (vLLM without chunked prefill: a prefill iteration stalls every decode):
      TTFT = prefill time of the queue plus this prompt; TPOT = one decode step with this request
      added + the prefill time of the queue and this prompt spread over the predicted output
      (those prefills stall this request and the ones already running).
    - disaggregated: TTFT = prefill of the prefill queue plus this prompt + KV transfer + one decode
      step; TPOT = one decode step on the decode instance with this request added.
    """

    def __init__(self, colocated_latency: Any, prefill_latency: Any, decode_latency: Any, *,
                 transfer_s: Any = None):
        self.colocated_latency = colocated_latency
        self.prefill_latency = prefill_latency
        self.decode_latency = decode_latency
        self.transfer_s = transfer_s or (lambda tokens: 0.0)

    @staticmethod
    def _prefill_s(lm: Any, load: TargetLoad, p: int) -> float:
        return lm.step_time_s(int(load.queued_prefill_tokens + p), float(load.queued_prefill_sq_tokens + p * p), 0, 0)

    def colocated(self, req: RouteRequest, load: TargetLoad) -> Estimate:
        lm, p = self.colocated_latency, req.prompt_tokens
        prefill = self._prefill_s(lm, load, p)
        step = lm.step_time_s(0, 0.0, load.decode_batch + 1, int(load.decode_ctx_tokens + p))
        return Estimate(prefill, step + prefill / max(1.0, req.predicted_output_tokens - 1))

    def disaggregated(self, req: RouteRequest, prefill_load: TargetLoad, decode_load: TargetLoad) -> Estimate:
        p = req.prompt_tokens
        step = self.decode_latency.step_time_s(0, 0.0, decode_load.decode_batch + 1,
                                               int(decode_load.decode_ctx_tokens + p))
        ttft = self._prefill_s(self.prefill_latency, prefill_load, p) + float(self.transfer_s(p)) + step
        return Estimate(ttft, step)


# ------------------------------------------------------------------------------------- predictors


class OutputPredictor:
    """Predicts a request's output length (tokens) before it runs; ``observe`` feeds back the truth."""

    name = "base"

    def predict(self, prompt_tokens: int, key: Hashable | None = None) -> float:
        raise NotImplementedError

    def observe(self, prompt_tokens: int, output_tokens: int, key: Hashable | None = None) -> None:
        """A request finished with ``output_tokens`` (ignored by predictors that do not learn)."""

    def reset(self) -> None:
        """Forget what was learned."""


@dataclass
class ConstantPredictor(OutputPredictor):
    """Always ``tokens`` (e.g. a trace's mean output, 182 for Mooncake's tool & agent trace)."""

    tokens: float = 182.0
    name: str = "constant"

    def predict(self, prompt_tokens: int, key: Hashable | None = None) -> float:
        return float(self.tokens)


@dataclass
class HistoryPredictor(OutputPredictor):
    """The mean output of the last ``window`` finished requests like this one.

    "Like this one": same ``key`` (when given and seen at least ``min_count`` times), else the same
    prompt-length bucket (powers of two: 1–1, 2–3, 4–7, ... tokens), else any request; with no
    history yet, ``default`` tokens. A sliding window follows a changing mix.
    """

    window: int = 256
    default: float = 182.0
    min_count: int = 4
    name: str = "history"
    _hist: deque = field(default_factory=deque, repr=False)

    def reset(self) -> None:
        self._hist.clear()

    @staticmethod
    def bucket(prompt_tokens: int) -> int:
        return int(math.log2(max(1, prompt_tokens)))

    def observe(self, prompt_tokens: int, output_tokens: int, key: Hashable | None = None) -> None:
        self._hist.append((key, self.bucket(prompt_tokens), int(output_tokens)))
        while len(self._hist) > self.window:
            self._hist.popleft()

    def predict(self, prompt_tokens: int, key: Hashable | None = None) -> float:
        if not self._hist:
            return float(self.default)
        if key is not None:
            same = [o for k, _, o in self._hist if k == key]
            if len(same) >= self.min_count:
                return sum(same) / len(same)
        b = self.bucket(prompt_tokens)
        near = [o for _, kb, o in self._hist if kb == b]
        if len(near) >= self.min_count:
            return sum(near) / len(near)
        return sum(o for _, _, o in self._hist) / len(self._hist)


def make_predictor(name: str | OutputPredictor, **kwargs: Any) -> OutputPredictor:
    """``"constant"`` or ``"history"`` (keywords go to the class), or an object as is."""
    if isinstance(name, OutputPredictor):
        return name
    table = {"constant": ConstantPredictor, "history": HistoryPredictor}
    if name not in table:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(table)}")
    return table[name](**kwargs)


# --------------------------------------------------------------------------------------- policies


class RoutingPolicy:
    """Base class: ``decide(request, estimates) -> "colocated" | "disaggregated"``.

    Policies with ``needs_estimates = True`` get ``estimates`` (target → :class:`Estimate`);
    the others get None.
    """

    name = "base"
    needs_estimates = False

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.describe().items() if k != "policy")
        return f"{type(self).__name__}({args})"


class AllColocated(RoutingPolicy):
    """Every request to the colocated pool (the monolithic colocated baseline)."""

    name = "all-colocated"

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        return "colocated"


class AllDisaggregated(RoutingPolicy):
    """Every request to the prefill/decode pair (the monolithic disaggregated baseline)."""

    name = "all-disaggregated"

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        return "disaggregated"


class Threshold(RoutingPolicy):
    """Disaggregate when ``prompt_tokens ≥ prompt_threshold`` and the predicted output is at least
    ``min_output_tokens``: long prefills are the ones that stall colocated decodes, and a request
    with (almost) no decode has nothing to protect and no KV worth shipping."""

    name = "threshold"

    def __init__(self, prompt_threshold: int = 2048, min_output_tokens: float = 2.0):
        if prompt_threshold < 0 or min_output_tokens < 0:
            raise ValueError("thresholds must be >= 0")
        self.prompt_threshold = int(prompt_threshold)
        self.min_output_tokens = float(min_output_tokens)

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        if req.prompt_tokens >= self.prompt_threshold and req.predicted_output_tokens >= self.min_output_tokens:
            return "disaggregated"
        return "colocated"

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "prompt_threshold": self.prompt_threshold,
                "min_output_tokens": self.min_output_tokens}


class SLOAware(RoutingPolicy):
    """Route where the predicted TTFT and TPOT fit ``slo``.

    Targets whose :meth:`Estimate.score` is ≤ ``headroom`` (1 = exactly the SLO) are feasible. With
    one feasible target, take it; otherwise the lower score wins (ties → ``prefer``).
    """

    name = "slo-aware"
    needs_estimates = True

    def __init__(self, slo: SLO, *, headroom: float = 1.0, prefer: str = "colocated"):
        if prefer not in TARGETS:
            raise ValueError(f"prefer must be one of {TARGETS}, got {prefer!r}")
        if not headroom > 0:
            raise ValueError(f"headroom must be positive, got {headroom}")
        self.slo, self.headroom, self.prefer = slo, float(headroom), prefer

    def decide(self, req: RouteRequest, estimates: Mapping[str, Estimate] | None = None) -> str:
        if not estimates:
            raise ValueError("the slo-aware policy needs latency estimates of both targets")
        scores = {t: e.score(self.slo) for t, e in estimates.items()}
        feasible = [t for t, s in scores.items() if s <= self.headroom]
        if len(feasible) == 1:
            return feasible[0]
        other = "disaggregated" if self.prefer == "colocated" else "colocated"
        if other in scores and scores[other] < scores.get(self.prefer, math.inf):
            return other
        return self.prefer if self.prefer in scores else next(iter(scores))

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "ttft_slo_s": self.slo.ttft_s, "tpot_slo_s": self.slo.tpot_s,
                "headroom": self.headroom, "prefer": self.prefer}


ROUTING_POLICIES: dict[str, type[RoutingPolicy]] = {
    "all-colocated": AllColocated,
    "all-disaggregated": AllDisaggregated,
    "threshold": Threshold,
    "slo-aware": SLOAware,
}


def make_policy(name: str | RoutingPolicy, **kwargs: Any) -> RoutingPolicy:
    """A policy from its name (keywords go to the class; ``slo-aware`` needs ``slo=SLO(...)``)."""
    if isinstance(name, RoutingPolicy):
        return name
    if name not in ROUTING_POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(ROUTING_POLICIES)}")
    return ROUTING_POLICIES[name](**kwargs)
