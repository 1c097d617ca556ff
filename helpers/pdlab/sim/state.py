"""The simulator's shared state: one request (:class:`SimRequest`), one iteration or planned run of
decode iterations (:class:`Batch`, with the closed-form :class:`BatchPlan`), the prefix-block LRU
(:class:`PrefixLRU`) and the event kinds of the event loop (plain ``int`` constants: the event loop
compares them on every event). Shared by :mod:`pdlab.sim.engine`, :mod:`pdlab.sim.instance`,
:mod:`pdlab.sim.schedulers` and :mod:`pdlab.sim.kvmanager`, and the request type that dispatch
policies (:class:`pdlab.sim.dispatch.DispatchPolicy`) receive.

A run of pure-decode steps with a fixed batch is one event: for latency models with an affine
decode step (:meth:`pdlab.sim.latency.LatencyModel.decode_affine`) each step's time is linear in
the step index, so k steps are an arithmetic series (:class:`BatchPlan`), and the per-step end times
are built only when token times are recorded: for all plans of a run at once, grouped by step count
(:func:`plan_step_ends`), and spread into the requests' token times in one gather
(:func:`expand_plan_stamps`), with the same arithmetic as :meth:`Batch.step_ends`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

import numpy as np

from pdlab.workloads import Request

if TYPE_CHECKING:
    from pdlab.sim.instance import Instance

__all__ = ["MAX_PLAN_STEPS", "EV_ARRIVAL", "EV_DONE", "EV_STAGE", "EV_XFER", "EV_LINK", "EV_JOIN",
           "SimRequest", "BatchPlan", "Batch", "PrefixLRU", "plan_step_ends", "expand_plan_stamps"]

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
        self.kv = 0                          # KV tokens held (a decode's grow when its batch ends; kv_used reserves them)
        self.first: float | None = None
        self.finish: float | None = None
        # token times while the run lasts: time stamps and plan markers (Simulator.token_mark), made
        # an array('d') of times when it ends
        self.times: list[float] | array | None = [] if record_times else None
        self.preemptions = 0
        self.error = ""
        self.busy = False                    # in a batch in flight (read for prompts in chunks, and decodes with pp > 1)
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


def _first_estimate(a: float, b: float, c: float, t: float, k: int) -> int:
    """Steps of a line a + b·i + c (i = 0, 1, …) done by ``t`` seconds, from the quadratic, in 0..k
    (within a step or two of the exact count)."""
    lin = a + c - 0.5 * b
    if b > 0:
        est = (-lin + math.sqrt(lin * lin + 2.0 * b * (0.0 if 0.0 > t else t))) / b
    else:
        est = t / lin if lin > 0 else 0.0
    j = int(est)
    return k if k < j else (0 if j < 0 else j)      # min(k, max(0, j)), no builtins


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
        if j <= m:      # _series(pa, pb, j) + c·j, written out (called for every plan)
            return self.pa * j + self.pb * (j * (j - 1) * 0.5) + self.c * j
        return _series(self.pa, self.pb, m) + (_series(self.qa, self.qb, j) - _series(self.qa, self.qb, m)) \
            + self.c * j

    def count_below(self, t: float, k: int) -> int:
        """How many of the first ``k`` steps end before ``t`` seconds (``elapsed(j) < t``)."""
        pa, pb, c, m = self.pa, self.pb, self.c, self.m
        if m >= k:      # one line: elapsed(j) written out (this runs whenever work reaches a planning instance)
            if pa * k + pb * (k * (k - 1) * 0.5) + c * k < t:
                return k
            lin = pa + c - 0.5 * pb          # j = _first_estimate(pa, pb, c, t, k), written out
            if pb > 0:
                est = (-lin + math.sqrt(lin * lin + 2.0 * pb * (0.0 if 0.0 > t else t))) / pb
            else:
                est = t / lin if lin > 0 else 0.0
            j = int(est)
            j = k if k < j else (0 if j < 0 else j)
            while j < k and pa * (j + 1) + pb * ((j + 1) * j * 0.5) + c * (j + 1) < t:
                j += 1
            while j > 0 and not pa * j + pb * (j * (j - 1) * 0.5) + c * j < t:
                j -= 1
            return j
        elapsed = self.elapsed
        if elapsed(k) < t:
            return k
        # solve the quadratic of the line in force, then step to the exact count (1-2 steps)
        if elapsed(m) < t:
            j = _first_estimate(self.qa, self.qb, c, t - _series(pa, pb, m) + _series(self.qa, self.qb, m), k)
        else:
            j = _first_estimate(pa, pb, c, t, k)
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
    ``SchedulerOutput``, plus its cost). ``seq`` is the sequence number of its pending completion
    event (:meth:`pdlab.sim.engine.Simulator.push`): a plan cut short is shortened in place and
    gets a new event, and the event loop passes over the old one."""

    __slots__ = ("prefill", "decodes", "ends", "start", "seq", "n_steps", "duration", "plan", "end")

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
        self.seq = 0

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


def plan_step_ends(plans: Sequence[Batch]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every step end of closed-form plans (``Batch.plan`` set), vectorised over the plans with the
    same step count: the absolute end times of all steps (one array, each plan's steps together),
    where each plan's steps start in it, and each plan's step count. Element by element the
    operations of :meth:`Batch.step_ends` (``start`` + :meth:`BatchPlan.elapsed_all`) in the same
    order, so the values are the same to the bit."""
    rows = np.fromiter(chain.from_iterable((b.start, p.pa, p.pb, p.qa, p.qb, p.c, p.m, b.n_steps)
                                           for b in plans for p in (b.plan,)), float, 8 * len(plans)).reshape(-1, 8)
    k = rows[:, 7].astype(np.intp)
    order = np.argsort(k, kind="stable")                        # plans grouped by step count
    k_sorted = k[order]
    offsets = np.empty(len(k), dtype=np.intp)
    offsets[order] = np.cumsum(k_sorted) - k_sorted
    start, pa, pb, qa, qb, c, m = np.split(rows[order, :7], 7, axis=1)
    two_lines = bool((m[:, 0] < k_sorted).any())
    ends = np.empty(int(k_sorted.sum()))
    bounds = [*np.flatnonzero(np.diff(k_sorted, prepend=-1)).tolist(), len(k)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        steps = int(k_sorted[lo])
        j, jj = _steps(steps)
        g = slice(lo, hi)
        e = pa[g] * j + pb[g] * jj + c[g] * j
        if two_lines:
            e = np.where(j <= m[g], e, _series(pa[g], pb[g], m[g]) + (qa[g] * j + qb[g] * jj - _series(qa[g], qb[g], m[g]))
                         + c[g] * j)
        base = int(offsets[order[lo]])
        np.add(start[g], e, out=ends[base:base + (hi - lo) * steps].reshape(hi - lo, steps))
    return ends, offsets, k


def expand_plan_stamps(times: Sequence[Sequence[float]], plans: Sequence[Batch], base: float = -1.0) -> list[array]:
    """Each request's token times as an ``array('d')``, from its entries in ``times``: time stamps,
    and markers ``base - i`` (``base`` is below every time stamp of the run) that stand for every
    step end of ``plans[i]`` (:meth:`Batch.step_ends`: a plan's own ``ends``, or the closed form of
    :func:`plan_step_ends`). One vectorised gather for all requests: each entry is a run of
    consecutive values of ``pool`` (the entries themselves, then the plans' step ends), so the
    gather index is each run's start in ``pool`` less its start in the output, repeated over the
    run, plus the output position."""
    lens = [len(t) for t in times]
    flat = np.fromiter(chain.from_iterable(times), float, sum(lens))
    marks = np.flatnonzero(flat <= base)
    closed = [b for b in plans if b.ends is None]
    ends, offsets, k = plan_step_ends(closed)
    if len(closed) < len(plans):                # plans with numpy step times keep their own ends
        is_closed = np.fromiter((b.ends is None for b in plans), bool, len(plans))
        own = [b.ends for b in plans if b.ends is not None]
        own_k = np.fromiter(map(len, own), np.intp, len(own))
        all_offsets, all_k = np.empty(len(plans), np.intp), np.empty(len(plans), np.intp)
        all_offsets[is_closed], all_k[is_closed] = offsets, k
        all_offsets[~is_closed], all_k[~is_closed] = ends.size + np.cumsum(own_k) - own_k, own_k
        ends, offsets, k = np.concatenate([ends, *own]), all_offsets, all_k
    pid = (base - flat[marks]).astype(np.intp)
    counts = np.ones(flat.size, dtype=np.intp)
    counts[marks] = k[pid]
    src = np.arange(flat.size)                                  # where each entry's run starts in pool
    src[marks] = flat.size + offsets[pid]
    out_end = np.cumsum(counts)
    pool = np.concatenate([flat, ends])
    total = int(out_end[-1]) if out_end.size else 0
    dtype = np.int32 if pool.size < 2**31 and total < 2**31 else np.intp
    index = np.repeat((src - (out_end - counts)).astype(dtype), counts)
    index += np.arange(total, dtype=dtype)
    out = pool[index]
    bounds = (np.concatenate([[0], out_end])[np.cumsum([0, *lens])] * out.itemsize).tolist()
    raw = memoryview(out).cast("B")
    result = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        arr = array("d")
        arr.frombytes(raw[lo:hi])
        result.append(arr)
    return result


class PrefixLRU:
    """The LRU of :class:`pdlab.kvcache.LRUBlockCache` (same order, same evictions), on a plain dict:
    a touched block is popped and re-inserted at the end, and eviction removes the oldest from the
    front (CPython dicts keep insertion order and compact deleted slots when they resize). ``table``
    is that dict (block id -> None, least recently used first), read directly by the instance's
    admission loop."""

    __slots__ = ("capacity_blocks", "table")

    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self.table: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self.table)

    def match(self, hash_ids: Sequence[int]) -> int:
        """Leading blocks of ``hash_ids`` present now (no side effects)."""
        blocks = self.table
        n = 0
        for h in hash_ids:
            if h not in blocks:
                break
            n += 1
        return n

    def insert(self, hash_ids: Sequence[int]) -> None:
        """Touch/insert the blocks last to first, then evict the least recently used."""
        blocks = self.table
        for h in reversed(hash_ids):
            if h in blocks:     # blocks.pop(h, None) without the call
                del blocks[h]
            blocks[h] = None
        excess = len(blocks) - self.capacity_blocks
        if excess > 0:
            for h in list(islice(blocks, excess)):
                del blocks[h]

    def blocks(self) -> list[int]:
        """Cached block ids, least recently used first."""
        return list(self.table)
