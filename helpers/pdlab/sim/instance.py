"""One serving instance in the simulation: its queues, batches in flight, the cost of each batch,
and what happens when a batch completes. Built by :class:`pdlab.sim.engine.Simulator` from an
:class:`~pdlab.sim.spec.InstanceSpec`. Its parts:

- the batch scheduler (:mod:`pdlab.sim.schedulers`, chosen by ``InstanceSpec.scheduler`` and the
  role): which prefill chunks and decodes run next, with admission and preemption;
- the KV memory (:class:`pdlab.sim.kvmanager.KVManager`): tokens held, capacity, prefix cache;
- the engine (:class:`pdlab.sim.engine.Simulator`): the instance schedules its batches'
  completions through :meth:`~pdlab.sim.engine.Simulator.schedule_batch` and hands finished
  requests and prefilled KV back to it.

Roles: ``colocated`` (prefill and decode), ``prefill`` (prefill-only; the KV is kept until the
transfer to a decode instance has finished), ``decode`` (decode-only batches of requests whose KV
has arrived).

Pipeline parallelism: an instance with ``pp`` stages starts a new micro-batch every
``step / pp`` seconds and a micro-batch completes ``step`` seconds after it started; a request is
in at most one micro-batch at a time.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from pdlab.sim import state as sim_state
from pdlab.sim.kvmanager import KVManager
from pdlab.sim.latency import LatencyModel
from pdlab.sim.schedulers import make_scheduler
from pdlab.sim.spec import InstanceSpec
from pdlab.sim.state import EV_STAGE, Batch, BatchPlan, SimRequest

if TYPE_CHECKING:
    from pdlab.sim.engine import Simulator

__all__ = ["Instance"]


def _owner(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in k.__dict__), None)


def _has_affine(latency: Any) -> bool:
    """True when the model's ``decode_affine`` belongs with its ``step_time_s`` (a subclass that
    overrides only ``step_time_s`` falls back to arrays)."""
    cls = type(latency)
    aff = _owner(cls, "decode_affine")
    if aff is None or aff is LatencyModel:
        return False
    return aff is _owner(cls, "step_time_s") and _owner(cls, "decode_times_s") in (aff, LatencyModel)


class Instance:
    """One serving instance (TP × PP GPUs) in the simulation; built from an :class:`InstanceSpec`.

    ``scheduler`` (a :class:`~pdlab.sim.schedulers.Scheduler`) forms its batches and ``kv_manager``
    (a :class:`~pdlab.sim.kvmanager.KVManager`) counts its KV memory. Its queues: ``waiting`` (to
    prefill, or with the KV arrived on a decode instance), ``prefilling`` (admitted, partly
    prefilled), ``running`` (decoding, in admission order) and ``swapped`` (decode role: preempted,
    waiting for memory)."""

    __slots__ = ("_affine", "_decode_lines", "_form_batch", "_schedule_batch", "admit_debt", "busy_for_peers",
                 "busy_s", "capacity", "cpu_peers", "inflight", "iterations", "kv_manager", "latency", "name",
                 "pending_pulls", "pp", "preemptions", "prefilling", "queued_tokens", "role", "running",
                 "scheduler", "sim", "spec", "stage_free_at", "swapped", "waiting")

    def __init__(self, spec: InstanceSpec, name: str, sim: Simulator):
        self.spec = spec
        self.name = name
        self.sim = sim
        self.role = spec.role
        self.latency = spec.latency
        self.pp = max(1, int(getattr(spec.latency, "pp", 1)))
        self.capacity = int(spec.kv_capacity_tokens)
        self.kv_manager = KVManager(self.capacity, prefix_caching=spec.prefix_caching and self.role != "decode",
                                    block_tokens=spec.prefix_block_tokens)
        self.waiting: deque[SimRequest] = deque()      # to prefill (colocated/prefill) or KV arrived (decode)
        self.prefilling: list[SimRequest] = []         # chunked: admitted, partly prefilled
        self.running: list[SimRequest] = []            # decoding, in admission order
        self.swapped: deque[SimRequest] = deque()      # decode role: preempted, waiting for memory
        self.inflight: list[Batch] = []
        self.stage_free_at = 0.0
        self.iterations = 0
        self.preemptions = 0
        self.busy_s = 0.0
        self.queued_tokens = 0
        self._affine = _has_affine(spec.latency)
        self._decode_lines: dict[int, tuple[float, float, float, float, float]] = {}   # decode_affine by batch size
        self.cpu_peers: list[Instance] = []      # other instances of the same cpu_group (set by the simulator)
        self.busy_for_peers = False              # busy as seen by cpu_peers (read by their slowdown)
        self.admit_debt = 0.0                    # decode role: admit_overhead_s of requests admitted since the last step
        # decode role: (prefill instance, request) whose KV waits to be pulled here, first come first
        # served (queued and started by the simulator: Simulator.prefill_done, start_pulls)
        self.pending_pulls: deque[tuple[Instance, SimRequest]] = deque()
        self.scheduler = make_scheduler(self)
        self._form_batch = self.scheduler.form_batch        # bound once: called for every batch
        self._schedule_batch = sim.schedule_batch

    # -- state seen by dispatch policies ----------------------------------------------------------
    @property
    def kv_used(self) -> int:
        """KV tokens held or reserved on this instance (:attr:`KVManager.used`)."""
        return self.kv_manager.used

    @property
    def queue_len(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def load_fraction(self) -> float:
        return (self.kv_manager.used + self.queued_tokens) / self.capacity

    @property
    def num_gpus(self) -> int:
        return self.spec.num_gpus

    # -- entry points -----------------------------------------------------------------------------
    def enqueue(self, r: SimRequest, now: float) -> None:
        """A request reaches this instance (to prefill, or with its KV arrived for decode)."""
        r.inst = self.name
        self.waiting.append(r)
        if self.role != "decode":
            self.queued_tokens += r.target
        self.wake(now)

    def wake(self, now: float) -> None:
        """New work or freed memory: schedule if idle, or cut a running decode plan short."""
        if not self.inflight:
            self.try_schedule(now)
            return
        if self.pp == 1:
            b = self.inflight[0]
            k = b.n_steps
            if k > 1 and b.end > now:
                plan = b.plan
                keep = (plan.count_below(now - b.start, k) if plan is not None else b.steps_done_before(now)) + 1
                if keep < k:
                    self._truncate(b, keep)
        elif self.stage_free_at <= now and len(self.inflight) < self.pp:
            self.try_schedule(now)

    def _truncate(self, b: Batch, keep: int) -> None:
        """Cut the running plan ``b`` to its first ``keep`` steps, in place, with a new completion
        event (the old one is passed over)."""
        drop = b.n_steps - keep
        self.kv_manager.used -= drop * len(b.decodes)      # (a decode's own r.kv grows when the batch ends)
        self.iterations -= drop
        duration = b.duration
        if b.plan is not None:
            b.duration = b.plan.elapsed(keep)
            b.end = end = b.start + b.duration
        else:
            b.ends = ends = b.ends[:keep]
            b.duration = float(ends[keep - 1] - b.start)
            b.end = end = float(ends[-1])
        b.n_steps = keep
        self.busy_s -= duration - b.duration
        self.stage_free_at = end
        self._schedule_batch(self, b)

    # -- CPU sharing --------------------------------------------------------------------------------
    def _slowdown(self) -> float:
        """Iteration-time factor from busy instances that share this one's CPU cores."""
        busy = sum(1 for p in self.cpu_peers if p.busy_for_peers)
        return 1.0 + self.spec.cpu_contention * busy

    def _busy_changed(self, now: float) -> None:
        """This instance started or stopped working: re-plan the peers' multi-step decode runs."""
        for p in self.cpu_peers:
            if p.inflight and p.pp == 1:
                p.wake(now)

    # -- scheduling -------------------------------------------------------------------------------
    def try_schedule(self, now: float) -> None:
        """Start the next batch(es) its scheduler forms, if a stage is free."""
        inflight = self.inflight
        if self.pp == 1:        # one batch in flight at a time
            if not inflight and self.stage_free_at <= now + 1e-12:
                b = self._form_batch(now)
                if b is not None:
                    inflight.append(b)
                    self.iterations += b.n_steps
                    self.busy_s += b.duration
                    self.stage_free_at = b.end
                    self._schedule_batch(self, b)
        else:
            pp = self.pp
            while len(inflight) < pp and self.stage_free_at <= now + 1e-12:
                b = self._form_batch(now)
                if b is None:
                    break
                inflight.append(b)
                self.iterations += b.n_steps
                self.busy_s += b.duration
                self.stage_free_at = now + b.duration / pp
                self._schedule_batch(self, b)
                self.sim.push(self.stage_free_at, EV_STAGE, self, None)
                break
        if self.cpu_peers and inflight and not self.busy_for_peers:
            self.busy_for_peers = True
            self._busy_changed(now)

    def fail(self, r: SimRequest, now: float, why: str) -> None:
        """``r`` ends at ``now`` with the error ``why`` (its KV already released)."""
        r.error = why
        r.finish = None
        self.sim.on_request_finished(r, now)

    # -- the cost of a batch (called by the scheduler) ---------------------------------------------
    def prefill_batch(self, now: float, prefill: list[tuple[SimRequest, int]], decodes: list[SimRequest]) -> Batch:
        """One iteration with the prefill chunks ``(request, tokens)`` and the decodes riding along,
        costed; reserves the decodes' next tokens."""
        slow = self._slowdown() if self.cpu_peers else 1.0
        n_dec = len(decodes)
        p_tokens = 0
        p_sq = 0
        for r, c in prefill:
            r.busy = True
            p_tokens += c
            p_sq += c * (2 * r.prefilled + c)
        ctx = 0
        for r in decodes:
            ctx += r.kv
        if self.pp > 1:     # the decodes sit out the next micro-batch (one stage forms none while one runs)
            for r in decodes:
                r.busy = True
        self.kv_manager.used += n_dec
        t = self.latency.step_time_s(p_tokens, float(p_sq), n_dec, ctx)
        return Batch(prefill, decodes, now, None, t * slow if slow != 1.0 else t)

    def decode_batch(self, now: float, decodes: list[SimRequest]) -> Batch:
        """Pure decode of ``decodes`` (non-empty), costed: several steps planned as one batch when
        nothing else can join until a request finishes; reserves the decodes' next tokens."""
        slow = self._slowdown() if self.cpu_peers else 1.0
        n_dec = len(decodes)
        kv = self.kv_manager
        ctx = 0
        k = 1
        if self.pp == 1:
            remaining = sim_state.MAX_PLAN_STEPS
            for r in decodes:
                ctx += r.kv
                left = r.output - r.generated
                if left < remaining:
                    remaining = left
            room = (self.capacity - kv.used) // n_dec
            k = room if room < remaining else remaining        # max(1, min(remaining, room)), no builtins
            if k < 1 or self.admit_debt:
                k = 1
        else:               # pipeline stages: one step; the decodes sit out the next micro-batch
            for r in decodes:
                ctx += r.kv
                r.busy = True
        kv.used += k * n_dec       # reserved now; each decode's r.kv grows when the batch ends
        if k == 1:
            t = self.latency.step_time_s(0, 0.0, n_dec, ctx)
            t = (t * slow if slow != 1.0 else t) + self.admit_debt
            self.admit_debt = 0.0
            return Batch([], decodes, now, None, t)
        if self._affine:
            lines = self._decode_lines.get(n_dec)
            if lines is None:
                lines = self._decode_lines[n_dec] = self.latency.decode_affine(n_dec)
            plan = BatchPlan(lines, ctx, n_dec, k, slow)
            if k <= plan.m:     # plan.elapsed(k), written out
                return Batch([], decodes, now, None, plan.pa * k + plan.pb * (k * (k - 1) * 0.5) + plan.c * k, plan, k)
            return Batch([], decodes, now, None, plan.elapsed(k), plan, k)
        steps = self.latency.decode_times_s(n_dec, ctx + n_dec * np.arange(k))
        if slow != 1.0:
            steps = steps * slow
        ends = now + np.cumsum(steps)
        return Batch([], decodes, now, ends, float(ends[-1] - now))

    # -- completion -------------------------------------------------------------------------------
    def complete(self, b: Batch, now: float) -> None:
        """The batch ``b`` ends at ``now`` (its pending event, see :attr:`Batch.seq`)."""
        inflight = self.inflight
        if inflight[0] is b:
            del inflight[0]
        else:
            inflight.remove(b)
        decodes = b.decodes
        if decodes:
            k = b.n_steps
            if self.pp > 1:
                for r in decodes:
                    r.busy = False
                # (with one batch in flight nothing ends or fails its decodes before it completes)
                decodes = [r for r in decodes if r.finish is None and not r.error]
            sim = self.sim
            if sim.record_token_times:      # the token time(s) of this batch: now, or the marker of a plan
                mark = now if k == 1 else sim.token_mark(b)
                for r in decodes:
                    r.kv += k               # the KV its k tokens took (reserved in kv_manager when the batch formed)
                    r.generated = generated = r.generated + k
                    r.times.append(mark)
                    if generated >= r.output:
                        self._finish(r, now)
            else:
                for r in decodes:
                    r.kv += k
                    r.generated = generated = r.generated + k
                    if generated >= r.output:
                        self._finish(r, now)
        if b.prefill:
            self._complete_prefill(b, now)
        if self.pending_pulls:
            self.sim.start_pulls(self, now)
        self.try_schedule(now)
        if self.cpu_peers and not self.inflight and self.busy_for_peers:
            self.busy_for_peers = False
            self._busy_changed(now)

    def _finish(self, r: SimRequest, now: float) -> None:
        """The running request ``r`` has generated its last token at ``now``."""
        self.kv_manager.used -= r.kv        # release(r), written out
        r.kv = 0
        self.running.remove(r)
        r.finish = now
        self.sim.on_request_finished(r, now)

    def _complete_prefill(self, b: Batch, now: float) -> None:
        sim = self.sim
        for r, chunk in b.prefill:
            r.busy = False
            if r.error:
                continue
            r.prefilled += chunk
            r.last_prefill_s = b.duration
            if r.prefilled < r.target:
                continue
            prefilling = self.prefilling
            if r in prefilling:
                prefilling.remove(r)
            r.generated += 1            # a finished prefill produces the next token
            if r.first is None:
                r.first = now
            if r.times is not None:
                r.times.append(now)
            if r.generated >= r.output:
                self.release(r)
                r.finish = now
                sim.on_request_finished(r, now)
            elif self.role == "prefill":
                r.prefill_inst = self.name
                sim.prefill_done(self, r, now)
            else:
                self.running.append(r)

    def release(self, r: SimRequest) -> None:
        """Free the KV that ``r`` holds on this instance."""
        self.kv_manager.release(r)

    def hand_over_kv(self, r: SimRequest, now: float) -> None:
        """The KV of ``r`` has left this (prefill) instance; ``r.kv`` now counts on the receiver."""
        self.kv_manager.used -= r.kv
        if self.waiting:        # the freed memory can only matter to prompts waiting for it
            self.wake(now)
