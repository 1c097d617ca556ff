"""Dispatch policies: which instance of a pool receives a request.

A policy is an object with ``choose(instances, request, now) -> index``; ``request`` is the
simulator's :class:`pdlab.sim.state.SimRequest` (its :class:`~pdlab.workloads.Request` is
``request.req``). The simulator uses one
for arriving requests (colocated or prefill pool) and one for prefilled requests (decode pool).
Instances expose ``queue_len`` (requests waiting to be admitted), ``num_running`` and
``load_fraction`` (KV tokens held and queued / KV capacity). Ties go to the lowest index, so the
choice is deterministic.

Subclass :class:`DispatchPolicy` for new global schedulers (cache-aware, SLO-aware ...) and add
them to :data:`DISPATCH_POLICIES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdlab.sim.state import SimRequest

__all__ = ["DispatchPolicy", "RoundRobin", "ShortestQueue", "LeastLoaded", "DISPATCH_POLICIES", "make_dispatch"]


class DispatchPolicy:
    """Base class. Policies may keep state (``reset`` is called at the start of every run)."""

    name = "base"

    def reset(self) -> None:
        """Forget state from a previous run."""

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
        raise NotImplementedError


class RoundRobin(DispatchPolicy):
    """Instances in turn, ignoring their state."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def reset(self) -> None:
        self._next = 0

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
        i = self._next % len(instances)
        self._next += 1
        return i


class ShortestQueue(DispatchPolicy):
    """Fewest requests waiting (then fewest running): DistServe's choice for prefill instances."""

    name = "shortest_queue"

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
        return min(range(len(instances)), key=lambda i: (instances[i].queue_len, instances[i].num_running, i))


class LeastLoaded(DispatchPolicy):
    """Lowest fraction of KV capacity held or queued: DistServe's choice for decode instances."""

    name = "least_loaded"

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
        return min(range(len(instances)), key=lambda i: (instances[i].load_fraction, i))


DISPATCH_POLICIES: dict[str, type[DispatchPolicy]] = {
    "round_robin": RoundRobin,
    "shortest_queue": ShortestQueue,
    "least_loaded": LeastLoaded,
}


def make_dispatch(policy: str | DispatchPolicy) -> DispatchPolicy:
    """A policy object from a name (``round_robin``, ``shortest_queue``, ``least_loaded``) or as is."""
    if isinstance(policy, DispatchPolicy):
        return policy
    try:
        return DISPATCH_POLICIES[policy]()
    except KeyError:
        raise ValueError(f"unknown dispatch policy {policy!r}; known: {', '.join(DISPATCH_POLICIES)}") from None
