"""Early rejection at the front door: predict a request's TTFT on arrival, refuse it when it would miss.

Mooncake (FAST'25 §7, arXiv 2407.00079v3) rejects a request on arrival when the prefill pool cannot
meet its TTFT objective, instead of admitting it and failing it later; notebook 07 simulates the
policy. This is the live version, for the P/D proxy (``pdlab.serve.proxy --admission-profile``):

- The proxy sees every prompt it sends to prefill. It keeps a **virtual prefill queue**: each
  admitted prompt of ``l`` tokens adds ``t_p(l)`` (the fitted prefill latency model,
  ``a_p + b_p·l + c_p·l²``, the same model lab 05 calibrates) to the time the prefill side is
  busy until. When a prefill leg comes back, the queue is reset to what is still in flight, so
  the prediction follows the real server rather than drifting.
- The model is fitted on an idle server; under load the same prefill runs slower (batching with
  other prompts, and on a small machine the cores it shares with the decode side and the proxy).
  So the policy learns a **slowdown**: when a leg comes back, the ratio of its measured time to
  the time the queue predicted for it at admission, averaged (EWMA, weight ``learn``); every
  prefill time is multiplied by it. ``learn=0`` turns this off (the unloaded model as fitted).
- Predicted TTFT = wait for the queue + slowdown·``t_p(l)`` + ``handoff_s`` (KV hand-off and first decode
  step). Above ``headroom`` × the TTFT SLO (default 1: the SLO itself; below 1 leaves room for
  what the prediction misses) the request is refused with HTTP 503 and ``Retry-After`` (whole
  seconds until the queue would admit it).

The class is pure (an injectable clock): the same object decides in the proxy and in an offline
replay of the same arrivals (:func:`replay_admission`), so live and simulated rejections can be
compared request by request.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PrefillModel", "AdmissionDecision", "TTFTAdmission", "replay_admission"]


@dataclass(frozen=True)
class PrefillModel:
    """Prefill time of one prompt alone: ``a_s + b_s_per_token·l + c_s_per_token2·l²`` (seconds)."""

    a_s: float
    b_s_per_token: float
    c_s_per_token2: float = 0.0

    def __post_init__(self) -> None:
        if min(self.a_s, self.b_s_per_token, self.c_s_per_token2) < 0 or not all(
                math.isfinite(v) for v in (self.a_s, self.b_s_per_token, self.c_s_per_token2)):
            raise ValueError(f"prefill coefficients must be finite and ≥ 0, got {self}")

    def time_s(self, tokens: int) -> float:
        return self.a_s + self.b_s_per_token * tokens + self.c_s_per_token2 * tokens * tokens

    @classmethod
    def from_profile(cls, path: str | Path) -> PrefillModel:
        """From a latency profile JSON (``pdlab.sim.latency.save_profile``: ``"prefill": [a, b, c]``)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            a, b, c = (float(v) for v in data["prefill"])
        except FileNotFoundError as exc:
            raise ValueError(f"admission profile {path} does not exist") from exc
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"admission profile {path} has no 'prefill': [a, b, c] coefficients ({exc})") from exc
        return cls(a, b, c)


@dataclass(frozen=True)
class AdmissionDecision:
    """The verdict on one arrival (seconds)."""

    admit: bool
    predicted_ttft_s: float
    wait_s: float
    retry_after_s: int = 0


@dataclass
class TTFTAdmission:
    """Admit a request only when its predicted TTFT meets ``ttft_slo_s`` (see the module docstring)."""

    model: PrefillModel
    ttft_slo_s: float
    handoff_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    learn: float = 0.2
    headroom: float = 1.0
    busy_until_s: float = field(default=float("-inf"), init=False)
    in_flight: dict[str, int] = field(default_factory=dict, init=False)
    slowdown: float = field(default=1.0, init=False)
    _legs: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)
    admitted: int = field(default=0, init=False)
    rejected: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not (self.ttft_slo_s > 0 and math.isfinite(self.ttft_slo_s)):
            raise ValueError(f"TTFT SLO must be a positive number of seconds, got {self.ttft_slo_s!r}")
        if self.handoff_s < 0:
            raise ValueError(f"hand-off time must be ≥ 0 s, got {self.handoff_s!r}")
        if not 0 <= self.learn <= 1:
            raise ValueError(f"learn must be in [0, 1], got {self.learn!r}")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom!r}")

    @property
    def target_s(self) -> float:
        """The predicted TTFT a request may have and be admitted: ``headroom`` × the SLO (s)."""
        return self.headroom * self.ttft_slo_s

    def prefill_s(self, prompt_tokens: int) -> float:
        """Predicted prefill time of one prompt now: the fitted model × the learned slowdown (s)."""
        return self.slowdown * self.model.time_s(prompt_tokens)

    def decide(self, prompt_tokens: int) -> AdmissionDecision:
        """Predict the TTFT of a prompt arriving now; count the verdict (call :meth:`start` to admit)."""
        now = self.clock()
        wait = max(self.busy_until_s - now, 0.0)
        predicted = wait + self.prefill_s(prompt_tokens) + self.handoff_s
        if predicted <= self.target_s:
            return AdmissionDecision(True, predicted, wait)
        self.rejected += 1
        return AdmissionDecision(False, predicted, wait, max(1, math.ceil(predicted - self.target_s)))

    def start(self, key: str, prompt_tokens: int) -> None:
        """An admitted request's prefill leg is sent: it joins the virtual queue."""
        now = self.clock()
        self.busy_until_s = max(self.busy_until_s, now) + self.prefill_s(prompt_tokens)
        self.in_flight[key] = prompt_tokens
        self._legs[key] = (now, self.busy_until_s - now)
        self.admitted += 1

    def done(self, key: str) -> None:
        """The prefill leg came back (or failed): the queue is what is still in flight."""
        if self.in_flight.pop(key, None) is None:
            return
        now = self.clock()
        sent, predicted = self._legs.pop(key)
        if self.learn > 0 and predicted > 0:
            ratio = min(max((now - sent) / predicted, 0.25), 20.0)
            self.slowdown = (1 - self.learn) * self.slowdown + self.learn * ratio
        self.busy_until_s = now + sum(self.prefill_s(t) for t in self.in_flight.values())

    def state(self) -> dict[str, float | int]:
        """Counters and the current predicted wait, for ``/proxy/admission``."""
        return {"admitted": self.admitted, "rejected": self.rejected, "in_flight": len(self.in_flight),
                "wait_s": max(self.busy_until_s - self.clock(), 0.0), "ttft_slo_s": self.ttft_slo_s,
                "headroom": self.headroom, "handoff_s": self.handoff_s, "slowdown": self.slowdown}


def replay_admission(arrivals_s: Sequence[float], prompt_tokens: Sequence[int], model: PrefillModel,
                     ttft_slo_s: float, handoff_s: float = 0.0, slowdown: float = 1.0,
                     headroom: float = 1.0) -> list[bool]:
    """The same policy on a list of arrivals, with the queue the model predicts (no live feedback).

    Each prefill leg is taken to end at its predicted time, when :meth:`TTFTAdmission.done` runs;
    every prefill time is the model's × ``slowdown`` (fixed: e.g. the one a live proxy learned).
    Returns one admit flag per request, in order.
    """
    if not (slowdown > 0 and math.isfinite(slowdown)):
        raise ValueError(f"slowdown must be a positive number, got {slowdown!r}")
    if len(arrivals_s) != len(prompt_tokens):
        raise ValueError("one prompt length per arrival")
    if any(b < a for a, b in zip(arrivals_s, arrivals_s[1:], strict=False)):
        raise ValueError("arrivals must be in time order")
    now = [0.0]
    policy = TTFTAdmission(model, ttft_slo_s, handoff_s, clock=lambda: now[0], learn=0.0, headroom=headroom)
    policy.slowdown = slowdown
    pending: list[tuple[float, str]] = []  # (predicted end of the prefill leg, key)
    flags = []
    for i, (t, tokens) in enumerate(zip(arrivals_s, prompt_tokens, strict=True)):
        for end, key in sorted(p for p in pending if p[0] <= t):
            now[0] = end
            policy.done(key)
            pending.remove((end, key))
        now[0] = t
        verdict = policy.decide(tokens)
        flags.append(verdict.admit)
        if verdict.admit:
            policy.start(str(i), tokens)
            pending.append((policy.busy_until_s, str(i)))
    return flags
