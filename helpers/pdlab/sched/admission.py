"""Early rejection at the front door: predict a request's TTFT on arrival, refuse it when it would miss.

Mooncake (FAST'25 §7, arXiv 2407.00079v3) rejects a request on arrival when the prefill pool cannot
meet its TTFT objective, instead of admitting it and failing it later. :class:`TTFTAdmission` is that
decision as one pure object (an injected clock and an injected engine-state source): the live P/D
proxy (:mod:`pdlab.serve.proxy.admission`, ``--admission-profile``) and the simulator (the engine's
admission hook, :mod:`pdlab.sim.admission`; :func:`simulate_admission` sets it up for one prefill
engine) run the same object, so their decisions can be compared request by request.

What it predicts from:

- **Its own bookkeeping** of the prefill legs it sent: each admitted prompt of ``l`` tokens adds
  ``t_p(l)`` (the fitted prefill model ``a + b·l + c·l²``, the one lab 05 calibrates) to the time the
  prefill side is busy until; when a leg comes back the queue is reset to what is still in flight.
- **The prefill cost under the current load, at its tail**: the fit is made on an idle engine, and
  under load the same prefill runs slower. When a leg comes back, the ratio of its measured time
  (queue and prefill) to the time predicted at admission is kept; ``slowdown``, which multiplies
  every prefill time, is the ``tail_quantile`` (0.9) of the last ``tail_window`` ratios, so the
  prediction covers the legs the TTFT p90 is judged on, not only the mean one.
  ``tail_quantile=None``: the mean instead, an EWMA of the ratios with weight ``learn``;
  ``learn=0``: the fit as is.
- **The engines' own state** (optional, ``engine_state``): a recent :class:`EngineState` reading —
  the prefill engine's waiting and running requests, the decode engine's KV-cache usage and size
  (vLLM's ``/metrics``). The queue in requests is then the engine's count plus the legs this policy
  sent, minus those that came back, since the reading: the freshest of the two accounts. The
  predicted wait is the larger of that count × the mean in-flight prefill time and the
  bookkeeping's own wait (the engine sees prompts the proxy's fit under-prices; the proxy sees legs
  the engine has not received yet). A reading that is missing, failed or older than
  ``max_state_age_s`` is ignored with a logged warning: the bookkeeping decides, nothing waits.
- **Decode KV headroom**: with the decode engine's KV size known, a request whose prompt + output
  tokens would take its KV usage (plus the KV of the legs still in prefill) above ``kv_limit`` is refused.

- **The rest of the TTFT under load** (``learn_handoff``): the KV hand-off and the first decode step
  grow with the sequences the decode engine runs. With ``learn_handoff`` each measured rest of a TTFT
  (:meth:`TTFTAdmission.observe_handoff`) is averaged (EWMA, weight ``learn``) and the prediction
  adds the larger of that and ``handoff_s``.

Predicted TTFT = wait + slowdown·``t_p(l)`` + hand-off (KV hand-off and first decode step).
Above ``headroom`` × the TTFT SLO the request is refused (HTTP 503 with ``Retry-After``: whole
seconds until the queue would admit it).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PrefillModel", "EngineState", "AdmissionDecision", "TTFTAdmission", "replay_admission",
           "SimulatedAdmission", "simulate_admission"]

log = logging.getLogger(__name__)


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
class EngineState:
    """One reading of the engines' own state, taken at ``at_s`` (the policy's clock, seconds).

    ``prefill_waiting``/``prefill_running``: requests queued and being computed on the prefill engine;
    ``decode_kv_usage``: the decode engine's KV-cache usage (0–1); ``decode_kv_tokens``: its KV-cache
    size in tokens (None when unknown: no KV check).
    """

    at_s: float
    prefill_waiting: int
    prefill_running: int
    decode_kv_usage: float = 0.0
    decode_kv_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_waiting < 0 or self.prefill_running < 0:
            raise ValueError(f"request counts must be ≥ 0, got {self.prefill_waiting} waiting, "
                             f"{self.prefill_running} running")
        if not 0 <= self.decode_kv_usage <= 1:
            raise ValueError(f"KV-cache usage must be in [0, 1], got {self.decode_kv_usage!r}")
        if self.decode_kv_tokens is not None and self.decode_kv_tokens <= 0:
            raise ValueError(f"KV-cache size must be a positive number of tokens, got {self.decode_kv_tokens!r}")


@dataclass(frozen=True)
class AdmissionDecision:
    """The verdict on one arrival (seconds). ``reason``: ``""`` (admitted), ``"ttft"`` or ``"decode_kv"``;
    ``source``: what the wait came from, ``"bookkeeping"`` or ``"engine"``."""

    admit: bool
    predicted_ttft_s: float
    wait_s: float
    retry_after_s: int = 0
    reason: str = ""
    source: str = "bookkeeping"


@dataclass
class TTFTAdmission:
    """Admit a request only when its predicted TTFT meets ``ttft_slo_s`` (see the module docstring)."""

    model: PrefillModel
    ttft_slo_s: float
    handoff_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    learn: float = 0.2
    headroom: float = 1.0
    engine_state: Callable[[], EngineState | None] | None = None
    max_state_age_s: float = 1.0
    kv_limit: float = 0.95
    learn_handoff: bool = False
    tail_quantile: float | None = 0.9
    tail_window: int = 64
    handoff_learned_s: float = field(default=0.0, init=False)
    busy_until_s: float = field(default=float("-inf"), init=False)
    in_flight: dict[str, int] = field(default_factory=dict, init=False)
    slowdown: float = field(default=1.0, init=False)
    _legs: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)
    _events: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=10_000), init=False)
    _ratios: deque[float] = field(default_factory=deque, init=False)
    _state_ok: bool = field(default=True, init=False)
    admitted: int = field(default=0, init=False)
    rejected: int = field(default=0, init=False)
    state_fallbacks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not (self.ttft_slo_s > 0 and math.isfinite(self.ttft_slo_s)):
            raise ValueError(f"TTFT SLO must be a positive number of seconds, got {self.ttft_slo_s!r}")
        if self.handoff_s < 0:
            raise ValueError(f"hand-off time must be ≥ 0 s, got {self.handoff_s!r}")
        if not 0 <= self.learn <= 1:
            raise ValueError(f"learn must be in [0, 1], got {self.learn!r}")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom!r}")
        if not self.max_state_age_s > 0:
            raise ValueError(f"max_state_age_s must be positive, got {self.max_state_age_s!r}")
        if not 0 < self.kv_limit <= 1:
            raise ValueError(f"kv_limit must be in (0, 1], got {self.kv_limit!r}")
        if self.tail_quantile is not None and not 0 < self.tail_quantile <= 1:
            raise ValueError(f"tail_quantile must be in (0, 1] or None, got {self.tail_quantile!r}")
        if self.tail_window < 1:
            raise ValueError(f"tail_window must be ≥ 1 leg, got {self.tail_window!r}")
        self._ratios = deque(maxlen=self.tail_window)
        self.handoff_learned_s = self.handoff_s

    @property
    def handoff_now_s(self) -> float:
        """The hand-off added to a prediction now: ``handoff_s``, or the larger learned one (s)."""
        return max(self.handoff_s, self.handoff_learned_s) if self.learn_handoff else self.handoff_s

    def observe_handoff(self, seconds: float) -> None:
        """A request's measured TTFT minus its prefill leg (s): averaged into the learned hand-off."""
        if self.learn_handoff and seconds >= 0 and math.isfinite(seconds):
            w = self.learn or 0.2
            self.handoff_learned_s = (1 - w) * self.handoff_learned_s + w * seconds

    @property
    def target_s(self) -> float:
        """The predicted TTFT a request may have and be admitted: ``headroom`` × the SLO (s)."""
        return self.headroom * self.ttft_slo_s

    def prefill_s(self, prompt_tokens: int) -> float:
        """Predicted prefill time of one prompt now: the fitted model × the learned slowdown (s)."""
        return self.slowdown * self.model.time_s(prompt_tokens)

    def _reading(self, now: float) -> EngineState | None:
        """The engine-state reading to use now, or None (no source, or a bad one: warned once per outage)."""
        if self.engine_state is None:
            return None
        try:
            state = self.engine_state()
            problem = "no reading" if state is None else (
                f"the last reading is {now - state.at_s:.2f} s old" if now - state.at_s > self.max_state_age_s else "")
        except Exception as exc:  # noqa: BLE001 — any failure of the source falls back, never blocks
            state, problem = None, f"{type(exc).__name__}: {exc}"
        if problem:
            self.state_fallbacks += 1
            if self._state_ok:
                log.warning("engine state unusable (%s): admission falls back to the proxy's bookkeeping", problem)
            self._state_ok = False
            return None
        if not self._state_ok:
            log.warning("engine state usable again: admission reads the engines' queue")
        self._state_ok = True
        return state

    def decide(self, prompt_tokens: int, output_tokens: int = 0) -> AdmissionDecision:
        """Predict the TTFT of a prompt arriving now; count a refusal (call :meth:`start` to admit)."""
        now = self.clock()
        wait, source = max(self.busy_until_s - now, 0.0), "bookkeeping"
        state = self._reading(now)
        if state is not None:
            since = sum(d for t, d in self._events if t > state.at_s)
            queued = max(state.prefill_waiting + state.prefill_running + since, 0)
            tokens = self.in_flight.values() or [prompt_tokens]
            engine_wait = queued * sum(self.prefill_s(t) for t in tokens) / len(tokens)
            if engine_wait > wait:
                wait, source = engine_wait, "engine"
        predicted = wait + self.prefill_s(prompt_tokens) + self.handoff_now_s
        if predicted > self.target_s:
            self.rejected += 1
            return AdmissionDecision(False, predicted, wait, max(1, math.ceil(predicted - self.target_s)),
                                     "ttft", source)
        if state is not None and state.decode_kv_tokens:
            pending = sum(self.in_flight.values()) + prompt_tokens + output_tokens
            if state.decode_kv_usage + pending / state.decode_kv_tokens > self.kv_limit:
                self.rejected += 1
                return AdmissionDecision(False, predicted, wait, 1, "decode_kv", source)
        return AdmissionDecision(True, predicted, wait, source=source)

    def start(self, key: str, prompt_tokens: int) -> None:
        """An admitted request's prefill leg is sent: it joins the virtual queue."""
        now = self.clock()
        self.busy_until_s = max(self.busy_until_s, now) + self.prefill_s(prompt_tokens)
        self.in_flight[key] = prompt_tokens
        self._legs[key] = (now, self.busy_until_s - now)
        self._events.append((now, +1))
        self.admitted += 1

    def done(self, key: str) -> None:
        """The prefill leg came back (or failed): the queue is what is still in flight."""
        if self.in_flight.pop(key, None) is None:
            return
        now = self.clock()
        self._events.append((now, -1))
        sent, predicted = self._legs.pop(key)
        if self.learn > 0 and predicted > 0:
            ratio = min(max((now - sent) / predicted, 0.25), 20.0)
            if self.tail_quantile is None:
                self.slowdown = (1 - self.learn) * self.slowdown + self.learn * ratio
            else:
                self._ratios.append(ratio)
                self.slowdown = _quantile(self._ratios, self.tail_quantile)
        self.busy_until_s = now + sum(self.prefill_s(t) for t in self.in_flight.values())

    def state(self) -> dict[str, float | int | bool]:
        """Counters and the current predicted wait, for ``/proxy/admission``."""
        return {"admitted": self.admitted, "rejected": self.rejected, "in_flight": len(self.in_flight),
                "wait_s": max(self.busy_until_s - self.clock(), 0.0), "ttft_slo_s": self.ttft_slo_s,
                "headroom": self.headroom, "handoff_s": self.handoff_now_s, "slowdown": self.slowdown,
                "tail_quantile": self.tail_quantile,
                "engine_state": self.engine_state is not None, "state_fallbacks": self.state_fallbacks}


def _quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation between order statistics, numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _check_arrivals(arrivals_s: Sequence[float], prompt_tokens: Sequence[int]) -> None:
    if len(arrivals_s) != len(prompt_tokens):
        raise ValueError("one prompt length per arrival")
    if any(b < a for a, b in zip(arrivals_s, arrivals_s[1:], strict=False)):
        raise ValueError("arrivals must be in time order")


class _Recorder:
    """The admission hook between the engine and a :class:`TTFTAdmission`: forwards every call and
    records the policy's inputs (the arrivals and leg returns, and the engine-state reading of each
    arrival), so the same inputs can be replayed through another caller of the class."""

    def __init__(self, policy: TTFTAdmission, reading: Callable[[], EngineState | None] | None) -> None:
        self.policy, self.reading = policy, reading
        self.events: list[tuple[str, float, int]] = []
        self.states: list[EngineState | None] = []
        self.decisions: list[AdmissionDecision] = []

    @property
    def clock(self) -> Callable[[], float]:
        return self.policy.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.policy.clock = clock

    def decide(self, prompt_tokens: int, output_tokens: int = 0) -> AdmissionDecision:
        now = self.policy.clock()
        self.states.append(self.reading() if self.reading is not None else None)
        self.events.append(("arrive", now, len(self.decisions)))
        verdict = self.policy.decide(prompt_tokens, output_tokens)
        self.decisions.append(verdict)
        return verdict

    def start(self, key: str, prompt_tokens: int) -> None:
        self.policy.start(key, prompt_tokens)

    def done(self, key: str) -> None:
        if key in self.policy.in_flight:
            self.events.append(("done", self.policy.clock(), int(key)))
        self.policy.done(key)


@dataclass
class SimulatedAdmission:
    """What :func:`simulate_admission` did (seconds from the first arrival).

    ``events``: the policy's inputs in order — ``("arrive", t, i)``, ``("done", t, i)`` — and
    ``states[i]``: the :class:`EngineState` the policy read at arrival ``i`` (None: bookkeeping only),
    so the same inputs can be replayed through another caller of the class (the live proxy's path).
    ``decisions[i]``: the verdict; ``ttft_s[i]``: the admitted request's simulated TTFT (its prefill's
    end + the policy's hand-off; NaN if refused); ``records``: the engine's records, in request order.
    """

    decisions: list[AdmissionDecision]
    ttft_s: list[float]
    states: list[EngineState | None]
    events: list[tuple[str, float, int]]
    records: list = field(default_factory=list)

    def admitted(self) -> list[bool]:
        return [d.admit for d in self.decisions]


def simulate_admission(arrivals_s: Sequence[float], prompt_tokens: Sequence[int], policy: TTFTAdmission, *,
                       engine_slowdown: float = 1.0, poll_s: float | None = 0.5,
                       output_tokens: Sequence[int] | None = None, decode_kv_tokens: int | None = None,
                       prefill_batch: int = 1, prefill_batch_tokens: int | None = None) -> SimulatedAdmission:
    """The arrivals through the simulator (:class:`pdlab.sim.Simulator`, one prefill and one decode
    instance) with ``policy`` as its admission hook: the live proxy's class, on a simulated engine.

    The prefill instance runs the policy's own fitted model × ``engine_slowdown`` (how much slower the
    loaded engine is than the idle fit: the load the policy has to learn), up to ``prefill_batch``
    prompts and ``prefill_batch_tokens`` tokens per step (1 prompt: one at a time, first come first
    served; a prompt alone is never cut); a prefill's end is the leg's
    return (:meth:`TTFTAdmission.done`). With ``poll_s`` the policy reads the simulated engines' state
    (waiting and running prefills; decode KV usage, and with ``decode_kv_tokens`` the KV check),
    refreshed at most every ``poll_s`` seconds, as the live proxy's ``/metrics`` poller does
    (``policy.engine_state`` is set for the run); ``poll_s=None``: bookkeeping only. Decode steps cost
    nothing here: the verdicts depend on the prefill side alone. ``policy`` is used as it is (its
    headroom, learning, tail quantile) and keeps what it learned.
    """
    from pdlab.sim import ConstantLatency, FittedLatency, InstanceSpec, Simulator
    from pdlab.workloads import Request

    _check_arrivals(arrivals_s, prompt_tokens)
    if not (engine_slowdown > 0 and math.isfinite(engine_slowdown)):
        raise ValueError(f"engine_slowdown must be a positive number, got {engine_slowdown!r}")
    if poll_s is not None and not poll_s > 0:
        raise ValueError(f"poll_s must be positive or None, got {poll_s!r}")
    if prefill_batch < 1:
        raise ValueError(f"prefill_batch must be ≥ 1 prompt, got {prefill_batch!r}")
    if prefill_batch_tokens is not None and prefill_batch_tokens < 1:
        raise ValueError(f"prefill_batch_tokens must be ≥ 1 token, got {prefill_batch_tokens!r}")
    outs = list(output_tokens) if output_tokens is not None else [1] * len(arrivals_s)
    if len(outs) != len(arrivals_s):
        raise ValueError("one output length per arrival")
    m, k = policy.model, engine_slowdown
    longest = max([*prompt_tokens, 1])
    prefill = InstanceSpec(FittedLatency((k * m.a_s, k * m.b_s_per_token, k * m.c_s_per_token2), (0.0, 0.0, 0.0)),
                           kv_capacity_tokens=longest * max(prefill_batch, 1) + 1, role="prefill",
                           max_num_seqs=prefill_batch, max_batched_tokens=prefill_batch_tokens or longest * prefill_batch)
    capacity = decode_kv_tokens or 10 * (sum(prompt_tokens) + sum(outs)) + 1
    decode = InstanceSpec(ConstantLatency(0.0, 1e-3), kv_capacity_tokens=capacity, role="decode",
                          handoff_reservation="none")
    sim = Simulator([prefill, decode], record_token_times=False)
    last: list[EngineState | None] = [None]

    def reading() -> EngineState:
        now = sim.clock()
        if last[0] is None or now - last[0].at_s >= poll_s:
            p, d = sim.front[0], sim.decode[0]
            running = sum(len(b.prefill) for b in p.inflight)
            last[0] = EngineState(now, len(p.waiting), running, min(d.kv_used / d.capacity, 1.0), decode_kv_tokens)
        return last[0]

    if poll_s is not None:
        policy.engine_state, policy.max_state_age_s = reading, 1.5 * poll_s
    hook = _Recorder(policy, reading if poll_s is not None else None)
    sim.admission = hook
    requests = [Request(i, float(t), int(n), max(1, int(o)))
                for i, (t, n, o) in enumerate(zip(arrivals_s, prompt_tokens, outs, strict=True))]
    result = sim.run(requests)
    handoff = policy.handoff_now_s
    ttfts = [r.ttft_s + handoff if r.ok and r.ttft_s is not None else float("nan") for r in result.records]
    return SimulatedAdmission(hook.decisions, ttfts, hook.states, hook.events, result.records)


def replay_admission(arrivals_s: Sequence[float], prompt_tokens: Sequence[int], model: PrefillModel,
                     ttft_slo_s: float, handoff_s: float = 0.0, slowdown: float = 1.0,
                     headroom: float = 1.0) -> list[bool]:
    """The bookkeeping-only policy with the fit as its truth: :func:`simulate_admission` of a policy
    that does not learn (``learn=0``, its slowdown fixed at ``slowdown``) on an engine exactly that
    much slower than the fit, so every prefill leg ends when the policy predicted. One admit flag per
    request, in order.
    """
    if not (slowdown > 0 and math.isfinite(slowdown)):
        raise ValueError(f"slowdown must be a positive number, got {slowdown!r}")
    policy = TTFTAdmission(model, ttft_slo_s, handoff_s, learn=0.0, headroom=headroom, tail_quantile=None)
    policy.slowdown = slowdown
    return simulate_admission(arrivals_s, prompt_tokens, policy, engine_slowdown=slowdown, poll_s=None).admitted()
