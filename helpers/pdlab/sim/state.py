"""The simulator's shared state: one request (:class:`SimRequest`), one iteration or planned run of
decode iterations (:class:`Batch`, with the closed-form :class:`BatchPlan`), the prefix-block LRU
(:class:`PrefixLRU`) and the event kinds of the event loop (plain ``int`` constants: the event loop
compares them on every event). Shared by :mod:`pdlab.sim.engine` and :mod:`pdlab.sim.instance`, and
the request type that dispatch policies (:class:`pdlab.sim.dispatch.DispatchPolicy`) receive.

A run of pure-decode steps with a fixed batch is one event: for latency models with an affine
decode step (:meth:`pdlab.sim.latency.LatencyModel.decode_affine`) each step's time is linear in
the step index, so k steps are an arithmetic series (:class:`BatchPlan`), and the per-step end times
are built only when token times are recorded.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from pdlab.workloads import Request

if TYPE_CHECKING:
    from pdlab.sim.instance import Instance

__all__ = ["MAX_PLAN_STEPS", "EV_ARRIVAL", "EV_DONE", "EV_STAGE", "EV_XFER", "EV_LINK", "EV_JOIN",
           "SimRequest", "BatchPlan", "Batch", "PrefixLRU"]

#: Most decode steps planned as one event (a plan is cut short when new work arrives). Read from
#: this module at every plan, so tests may lower it.
MAX_PLAN_STEPS = 512

#: Event kinds of the event loop (:class:`pdlab.sim.engine.Simulator`): an arrival, a batch done
#: (payload: instance, batch), a pipeline stage free (instance, None), a KV transfer done (source
#: instance, request), a shared link's next finish (source instance, link version), a transfer
#: joining a shared link after its setup time (source instance, (request, work seconds)).
EV_ARRIVAL, EV_DONE, EV_STAGE, EV_XFER, EV_LINK, EV_JOIN = 0, 1, 2, 3, 4, 5


class SimRequest:
    """The simulator's state of one request (the :class:`pdlab.workloads.Request` is ``req``)."""

    __slots__ = ("req", "arrival", "prompt", "output", "target", "prefilled", "generated", "kv", "first",
                 "finish", "times", "preemptions", "error", "busy", "inst", "dec_inst", "last_prefill_s",
                 "xfer_start", "xfer_end", "prefill_inst", "staged")

    def __init__(self, req: Request, record_times: bool):
        self.req = req
        self.arrival = req.arrival_s
        self.prompt = req.prompt_tokens
        self.output = req.output_tokens
        self.target = req.prompt_tokens      # tokens to prefill (prompt, or prompt + generated after recompute)
        self.prefilled = 0
        self.generated = 0
        self.kv = 0
        self.first: float | None = None
        self.finish: float | None = None
        self.times = array("d") if record_times else None
        self.preemptions = 0
        self.error = ""
        self.busy = False
        self.inst = ""
        self.prefill_inst = ""
        self.dec_inst: Instance | None = None
        self.last_prefill_s = 0.0
        self.xfer_start: float | None = None
        self.xfer_end: float | None = None
        self.staged = False                  # KV arrived in host memory, no GPU reservation yet


def _series(a: float, b: float, j: Any) -> Any:
    """Σ_{i<j} (a + b·i) for a scalar or an integer array ``j``."""
    return a * j + b * (j * (j - 1) * 0.5)


class BatchPlan:
    """A run of pure-decode steps whose step i takes max(A1 + B1·i, A2 + B2·i) + c seconds.

    ``first`` is the line that dominates for i < ``m``, ``second`` the one from ``m`` on.
    """

    __slots__ = ("pa", "pb", "qa", "qb", "c", "m")

    def __init__(self, coef: tuple[float, float, float, float, float], ctx0: int, n: int, k: int, slow: float):
        a1, b1, a2, b2, c = coef
        l1a, l1b = (a1 + b1 * ctx0) * slow, b1 * n * slow
        l2a, l2b = (a2 + b2 * ctx0) * slow, b2 * n * slow
        if l2a > l1a:
            l1a, l1b, l2a, l2b = l2a, l2b, l1a, l1b
        self.pa, self.pb, self.qa, self.qb, self.c = l1a, l1b, l2a, l2b, c * slow
        if l1b >= l2b:
            self.m = k
        else:
            cross = (l1a - l2a) / (l2b - l1b)
            self.m = min(k, int(cross) + 1)

    def elapsed(self, j: int) -> float:
        """Seconds for the first ``j`` steps."""
        m = self.m
        if j <= m:
            return _series(self.pa, self.pb, j) + self.c * j
        return _series(self.pa, self.pb, m) + (_series(self.qa, self.qb, j) - _series(self.qa, self.qb, m)) \
            + self.c * j

    def count_below(self, t: float, k: int) -> int:
        """How many of the first ``k`` steps end before ``t`` seconds (``elapsed(j) < t``)."""
        elapsed = self.elapsed
        if elapsed(k) < t:
            return k
        # solve the quadratic of the line in force, then step to the exact count (1-2 steps)
        a, b, t_eff = self.pa, self.pb, t
        m = self.m
        if m < k and elapsed(m) < t:
            a, b = self.qa, self.qb
            t_eff = t - _series(self.pa, self.pb, m) + _series(self.qa, self.qb, m)
        lin = a + self.c - 0.5 * b
        if b > 0:
            est = (-lin + math.sqrt(lin * lin + 2.0 * b * max(t_eff, 0.0))) / b
        else:
            est = t_eff / lin if lin > 0 else 0.0
        j = min(k, max(0, int(est)))
        while j < k and elapsed(j + 1) < t:
            j += 1
        while j > 0 and not elapsed(j) < t:
            j -= 1
        return j

    def elapsed_all(self, k: int) -> np.ndarray:
        """Seconds for the first 1, 2, …, k steps (same arithmetic as :meth:`elapsed`)."""
        j, jj = _steps(k)
        m = self.m
        head = self.pa * j + self.pb * jj + self.c * j
        if m >= k:
            return head
        tail = _series(self.pa, self.pb, m) + (self.qa * j + self.qb * jj - _series(self.qa, self.qb, m)) \
            + self.c * j
        return np.where(j <= m, head, tail)


_J = np.arange(1, MAX_PLAN_STEPS + 1, dtype=float)
_JJ = _J * (_J - 1) * 0.5


def _steps(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Views of j = 1..k and j(j−1)/2 as floats (cached; :func:`_series` computes the same values)."""
    global _J, _JJ
    if k > len(_J):
        _J = np.arange(1, k + 1, dtype=float)
        _JJ = _J * (_J - 1) * 0.5
    return _J[:k], _JJ[:k]


class Batch:
    """One iteration (prefill chunks and/or one decode step) or a planned run of ``n_steps``
    pure-decode iterations with a fixed batch, from ``start`` to ``end`` (vLLM's
    ``SchedulerOutput``, plus its cost). ``valid`` turns False when a plan is cut short (the
    instance then holds a shorter copy)."""

    __slots__ = ("prefill", "decodes", "ends", "start", "valid", "n_steps", "duration", "plan", "end")

    def __init__(self, prefill: list[tuple[SimRequest, int]], decodes: list[SimRequest], start: float,
                 ends: np.ndarray | None, duration: float, plan: BatchPlan | None = None, n_steps: int = 1):
        self.prefill = prefill
        self.decodes = decodes
        self.start = start
        self.ends = ends            # numpy plan: end time of each step (absolute)
        self.plan = plan            # closed-form plan (ends built on demand)
        self.n_steps = len(ends) if ends is not None else n_steps
        self.duration = duration
        self.end = float(ends[-1]) if ends is not None else start + duration
        self.valid = True

    def step_ends(self) -> np.ndarray:
        """Absolute end time of every step of a multi-step plan."""
        if self.ends is None:
            self.ends = self.start + self.plan.elapsed_all(self.n_steps)
        return self.ends

    def steps_done_before(self, t: float) -> int:
        """Steps of this plan that end strictly before ``t``."""
        if self.ends is not None:
            return int(np.searchsorted(self.ends, t, side="left"))
        return self.plan.count_below(t - self.start, self.n_steps)


class PrefixLRU:
    """The LRU of :class:`pdlab.kvcache.LRUBlockCache` (same order, same evictions), on a plain dict:
    a touched block is popped and re-inserted at the end, and eviction removes the oldest from the
    front (CPython dicts keep insertion order and compact deleted slots when they resize)."""

    __slots__ = ("capacity_blocks", "_blocks")

    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hash_ids: Sequence[int]) -> int:
        """Leading blocks of ``hash_ids`` present now (no side effects)."""
        blocks = self._blocks
        n = 0
        for h in hash_ids:
            if h not in blocks:
                break
            n += 1
        return n

    def insert(self, hash_ids: Sequence[int]) -> None:
        """Touch/insert the blocks last to first, then evict the least recently used."""
        blocks = self._blocks
        pop = blocks.pop
        for h in reversed(hash_ids):
            pop(h, None)
            blocks[h] = None
        excess = len(blocks) - self.capacity_blocks
        if excess > 0:
            for h in list(islice(blocks, excess)):
                del blocks[h]

    def blocks(self) -> list[int]:
        """Cached block ids, least recently used first."""
        return list(self._blocks)
