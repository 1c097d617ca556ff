"""Admission as a hook of the engine: what a policy that refuses requests on arrival must offer.

:class:`pdlab.sim.engine.Simulator` takes an ``admission`` object and asks it about every arrival,
after the dispatch policy has chosen the instance (so a rule can judge the instance chosen, as
Mooncake's Conductor does) and before the request reaches that instance. The object is duck-typed
(:class:`AdmissionPolicy`), so the simulator needs nothing from the layers above it: the live
proxy's :class:`pdlab.sched.admission.TTFTAdmission` satisfies it as it is, and so do the
Conductor's rules (:mod:`pdlab.sched.conductor`).

The calls, in the live proxy's order (:meth:`pdlab.serve.proxy.server.PDProxy.handle`):

- ``clock``: the policy's clock; the engine sets it to the simulated time for the run;
- ``decide(prompt_tokens, output_tokens)`` → a verdict with ``admit`` (bool) and ``reason`` (str);
- ``start(key, prompt_tokens)`` for an admitted request (``key`` is ``str(request_id)``);
- ``done(key)`` when the request's prefill has ended (a disaggregated cluster: the prefill leg came
  back) or, on a colocated cluster or for a request that failed, when it ended. A second call for
  one key is a no-op for the policy.

A refused request ends at once with an error record, as the live client records the proxy's
refusal: ``ok=False``, an ``error`` that starts with :data:`REJECTED` (HTTP 503) and
``extra["rejected"] = "arrival"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["REJECTED", "AdmissionVerdict", "AdmissionPolicy", "rejection_error"]

#: How a refused request's error starts: the status the live proxy answers a refusal with.
REJECTED = "HTTP 503"


class AdmissionVerdict(Protocol):
    """What ``decide`` returns: ``admit`` and, for a refusal, a ``reason``."""

    admit: bool
    reason: str


@runtime_checkable
class AdmissionPolicy(Protocol):
    """The admission hook's interface (see the module docstring)."""

    clock: Callable[[], float]

    def decide(self, prompt_tokens: int, output_tokens: int = 0) -> AdmissionVerdict: ...

    def start(self, key: str, prompt_tokens: int) -> None: ...

    def done(self, key: str) -> None: ...


def rejection_error(reason: str) -> str:
    """The error text of a request refused on arrival for ``reason``."""
    return f"{REJECTED}: rejected on arrival ({reason or 'refused'})"
