"""One serving instance in the simulation: its queues, KV memory, batch formation and
completion. Built by :class:`pdlab.sim.engine.Simulator` from an :class:`~pdlab.sim.spec.InstanceSpec`.

Instance roles and schedulers:

- ``colocated`` with ``scheduler="vllm"`` — continuous batching as in vLLM without chunked
  prefill: an iteration either prefills admitted requests (decodes stall) or decodes all running
  requests. Prefill has priority.
- ``colocated`` with ``scheduler="chunked"`` — Sarathi-Serve stall-free batching (OSDI'24 Alg. 3):
  each iteration holds all running decodes, then ongoing prefill chunks, then new prompts, up to
  ``token_budget`` tokens.
- ``prefill`` — prefill-only batches (up to ``max_batched_tokens``); the KV is kept until the
  transfer to a decode instance has finished.
- ``decode`` — decode-only batches of requests whose KV has arrived.

KV memory: an instance holds ``kv_capacity_tokens``. A prompt is admitted only when its KV fits;
each decode step needs one more token per request. When a step does not fit, the most recently
admitted request is preempted (vLLM's policy): on a colocated instance it is recomputed (its KV is
dropped and it re-prefills prompt + generated tokens); on a decode instance it is swapped out and
resumes when memory frees (swap time is not modelled). A request that cannot fit even alone fails
with an error record.

Prefix caching (``InstanceSpec.prefix_caching``, vLLM's automatic prefix caching): a colocated or
prefill instance keeps an LRU of ``prefix_block_tokens``-token prefix blocks (as many as its KV
capacity holds, with the LRU order of :class:`pdlab.kvcache.LRUBlockCache`); a prompt whose leading blocks (its
``hash_ids``) are cached starts its prefill after them (at least one token is computed). The
blocks are looked up without side effects and inserted when the prompt is admitted. The KV is
still held and transferred in full.

Pipeline parallelism: an instance with ``pp`` stages starts a new micro-batch every
``step / pp`` seconds and a micro-batch completes ``step`` seconds after it started; a request is
in at most one micro-batch at a time.
"""

from __future__ import annotations

from collections import deque
from heapq import heappush
from typing import TYPE_CHECKING, Any

import numpy as np

from pdlab.sim import state as sim_state
from pdlab.sim.latency import LatencyModel
from pdlab.sim.spec import InstanceSpec
from pdlab.sim.state import EV_DONE, EV_STAGE, Batch, BatchPlan, PrefixLRU, SimRequest

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
    """One serving instance (TP × PP GPUs) in the simulation; built from an :class:`InstanceSpec`."""

    __slots__ = ("_affine", "_decode_lines", "_plain_vllm", "admit_debt", "block_tokens", "busy_for_peers", "busy_s", "capacity",
                 "cpu_peers", "hit_tokens", "inflight", "iterations", "kv_used", "latency", "name", "pending_pulls",
                 "pp", "preemptions", "prefilling", "prefix_cache", "prompt_tokens_seen", "queued_tokens", "role",
                 "running", "sim", "spec", "stage_free_at", "swapped", "waiting")

    def __init__(self, spec: InstanceSpec, name: str, sim: Simulator):
        self.spec = spec
        self.name = name
        self.sim = sim
        self.role = spec.role
        self.latency = spec.latency
        self.pp = max(1, int(getattr(spec.latency, "pp", 1)))
        self.capacity = int(spec.kv_capacity_tokens)
        self.kv_used = 0
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
        self._plain_vllm = spec.scheduler == "vllm" or self.role == "prefill"
        self.prefix_cache: PrefixLRU | None = None
        self.block_tokens = spec.prefix_block_tokens
        self.hit_tokens = 0
        self.prompt_tokens_seen = 0
        if spec.prefix_caching and self.role != "decode":
            self.prefix_cache = PrefixLRU(max(1, self.capacity // self.block_tokens))
        self.cpu_peers: list[Instance] = []      # other instances of the same cpu_group (set by the simulator)
        self.busy_for_peers = False              # busy as seen by cpu_peers (read by their slowdown)
        self.admit_debt = 0.0                    # decode role: admit_overhead_s of requests admitted since the last step
        # decode role: (prefill instance, request) whose KV waits to be pulled here, first come first
        # served (queued and started by the simulator: Simulator.prefill_done, start_pulls)
        self.pending_pulls: deque[tuple[Instance, SimRequest]] = deque()

    # -- state seen by dispatch policies ----------------------------------------------------------
    @property
    def queue_len(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def load_fraction(self) -> float:
        return (self.kv_used + self.queued_tokens) / self.capacity

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
        self.kv_used -= drop * len(b.decodes)          # (a decode's own r.kv grows when the batch ends)
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
        sim = self.sim      # sim.push(end, EV_DONE, self, b), written out
        sim.event_seq = b.seq = seq = sim.event_seq + 1
        heappush(sim.event_heap, (end, seq, EV_DONE, self, b))

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
        inflight = self.inflight
        if self.pp == 1:        # one batch in flight at a time
            if not inflight and self.stage_free_at <= now + 1e-12:
                b = self._form_batch(now)
                if b is not None:
                    inflight.append(b)
                    self.iterations += b.n_steps
                    self.busy_s += b.duration
                    self.stage_free_at = end = b.end
                    sim = self.sim      # sim.push(end, EV_DONE, self, b), written out: once per batch
                    sim.event_seq = b.seq = seq = sim.event_seq + 1
                    heappush(sim.event_heap, (end, seq, EV_DONE, self, b))
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
                b.seq = self.sim.push(b.end, EV_DONE, self, b)
                self.sim.push(self.stage_free_at, EV_STAGE, self, None)
                break
        if self.cpu_peers and inflight and not self.busy_for_peers:
            self.busy_for_peers = True
            self._busy_changed(now)

    def _fail(self, r: SimRequest, now: float, why: str) -> None:
        r.error = why
        r.finish = None
        self.sim.on_request_finished(r, now)

    def cached_prefix_tokens(self, r: SimRequest) -> int:
        """Tokens of ``r``'s prompt found in this instance's prefix cache (no side effects)."""
        cache = self.prefix_cache
        hash_ids = r.req.hash_ids
        if cache is None or not hash_ids:
            return 0
        tokens = cache.match(hash_ids) * self.block_tokens
        most = r.target - 1                     # max(0, min(tokens, most)), no builtins
        if most < tokens:
            tokens = most
        return tokens if tokens > 0 else 0

    def _admit_prefills(self, now: float, budget: int, max_new: int) -> list[tuple[SimRequest, int]]:
        """FCFS admission from ``waiting``: KV for the whole prefill target must fit. With prefix
        caching the prefill starts after the cached prefix."""
        items: list[tuple[SimRequest, int]] = []
        waiting = self.waiting
        cache = self.prefix_cache
        plain = self._plain_vllm
        while waiting and budget > 0 and max_new > 0:
            r = waiting[0]
            target = r.target
            if target > self.capacity:
                waiting.popleft()
                self.queued_tokens -= target
                self._fail(r, now, f"prompt of {target} tokens exceeds the KV capacity of {self.name} "
                                   f"({self.capacity} tokens)")
                continue
            if self.kv_used + target > self.capacity:
                break
            hash_ids = r.req.hash_ids
            cached = 0
            if cache is not None and hash_ids:      # cached_prefix_tokens(r), written out
                blocks = cache.table
                for h in hash_ids:
                    if h not in blocks:
                        break
                    cached += 1
                cached *= self.block_tokens
                if target - 1 < cached:
                    cached = target - 1
                if cached < 0:
                    cached = 0
            todo = target - cached
            chunk = budget if budget < todo and not plain else todo
            if items and chunk > budget:
                break
            waiting.popleft()
            if cache is not None and hash_ids:
                cache.insert(hash_ids)
                self.hit_tokens += cached
                self.prompt_tokens_seen += target
            self.queued_tokens -= target
            self.kv_used += target
            r.kv = target
            r.prefilled = cached
            items.append((r, chunk))
            budget -= chunk
            max_new -= 1
        return items

    def _ensure_decode_room(self, now: float, decodes: list[SimRequest]) -> list[SimRequest]:
        """Make room for one more token per decode: fail requests that can never fit, give back
        partial prefills, then preempt the most recently admitted running requests."""
        while decodes and self.kv_used + len(decodes) > self.capacity:
            victim = decodes[-1]
            if victim.kv + 1 > self.capacity:
                decodes.pop()
                self.running.remove(victim)
                self.release(victim)
                self._fail(victim, now, f"context of {victim.prompt + victim.generated} tokens exceeds the KV "
                                        f"capacity of {self.name} ({self.capacity} tokens)")
                continue
            idle_partial = [p for p in self.prefilling if not p.busy]
            if idle_partial:
                p = idle_partial[-1]
                self.prefilling.remove(p)
                self._requeue(p)
                continue
            decodes.pop()
            self.running.remove(victim)
            self._preempt(victim)
        return decodes

    def _requeue(self, r: SimRequest) -> None:
        self.kv_used -= r.kv
        r.kv = 0
        r.prefilled = 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)
        self.queued_tokens += r.target

    def _preempt(self, r: SimRequest) -> None:
        if self.role == "decode":       # swap out: KV leaves the GPU, comes back when memory frees
            self.kv_used -= r.kv
            r.preemptions += 1
            self.preemptions += 1
            self.swapped.appendleft(r)
        else:                           # recompute: drop the KV, prefill prompt + generated again
            r.target = r.prompt + r.generated
            self._requeue(r)

    def _admit_decodes(self, free_decodes: list[SimRequest]) -> None:
        """Decode role: swapped-out requests first, then requests whose KV arrived."""
        spec = self.spec
        running = self.running
        while self.swapped and self.kv_used + self.swapped[0].kv + len(running) + 1 <= self.capacity \
                and len(running) < spec.max_num_seqs:
            r = self.swapped.popleft()
            self.kv_used += r.kv
            running.append(r)
            free_decodes.append(r)
        waiting = self.waiting
        while waiting and len(running) < spec.max_num_seqs:
            r = waiting[0]
            if r.staged:                # KV in host memory: needs GPU room now
                if self.kv_used + r.kv + len(running) + 1 > self.capacity:
                    break
                self.kv_used += r.kv
                self.queued_tokens -= r.kv
                r.staged = False
            waiting.popleft()
            running.append(r)
            self.admit_debt += spec.admit_overhead_s
            free_decodes.append(r)

    def _form_batch(self, now: float) -> Batch | None:
        """The next iteration (or planned run of decode iterations), costed; None when idle. Batch
        formation by role and scheduler chooses its prefill chunks and decodes (admits, fails and
        preempts requests as needed)."""
        spec = self.spec
        role = self.role
        decodes = [r for r in self.running if not r.busy] if self.pp > 1 else list(self.running)
        slow = self._slowdown() if self.cpu_peers else 1.0
        if role == "decode":
            if self.swapped or self.waiting:
                self._admit_decodes(decodes)
        elif role == "prefill" or spec.scheduler == "vllm":     # prefill has priority; decodes stall
            if self.waiting:
                max_new = spec.max_num_seqs - len(self.running) if role == "colocated" else spec.max_num_seqs
                prefill = self._admit_prefills(now, spec.max_batched_tokens, max_new)
                if prefill:
                    return self._prefill_batch(now, prefill, [], slow)
            if role == "prefill":
                return None
        else:  # chunked, stall-free: decodes, ongoing prefills, new prefills
            if self.kv_used + len(decodes) > self.capacity:     # (the room check's own condition)
                decodes = self._ensure_decode_room(now, decodes)
            if self.prefilling or self.waiting:
                prefill = self._chunked_prefills(now, spec.token_budget - len(decodes))
                if prefill:
                    return self._prefill_batch(now, prefill, decodes, slow)
            return self._decode_batch(now, decodes, slow) if decodes else None
        if decodes and self.kv_used + len(decodes) > self.capacity:     # (the room check's own condition)
            decodes = self._ensure_decode_room(now, decodes)
        return self._decode_batch(now, decodes, slow) if decodes else None

    def _chunked_prefills(self, now: float, budget: int) -> list[tuple[SimRequest, int]]:
        """Sarathi-Serve: chunks of the ongoing prefills, then new prompts, within ``budget`` tokens."""
        prefill: list[tuple[SimRequest, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                break
            if r.busy:
                continue
            chunk = r.target - r.prefilled
            if budget < chunk:
                chunk = budget
            prefill.append((r, chunk))
            budget -= chunk
        if budget > 0 and self.waiting:
            new = self._admit_prefills(now, budget, self.spec.max_num_seqs - len(self.running) - len(self.prefilling))
            if new:
                self.prefilling.extend([r for r, _ in new])
                prefill.extend(new)
        return prefill

    def _prefill_batch(self, now: float, prefill: list[tuple[SimRequest, int]], decodes: list[SimRequest],
                       slow: float) -> Batch:
        """One iteration with prefill chunks (and the decodes riding along), costed."""
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
        self.kv_used += n_dec
        t = self.latency.step_time_s(p_tokens, float(p_sq), n_dec, ctx)
        return Batch(prefill, decodes, now, None, t * slow if slow != 1.0 else t)

    def _decode_batch(self, now: float, decodes: list[SimRequest], slow: float) -> Batch:
        """Pure decode: plan several steps when nothing else can join until a request finishes."""
        n_dec = len(decodes)
        ctx = 0
        k = 1
        if self.pp == 1:
            remaining = sim_state.MAX_PLAN_STEPS
            for r in decodes:
                ctx += r.kv
                left = r.output - r.generated
                if left < remaining:
                    remaining = left
            room = (self.capacity - self.kv_used) // n_dec
            k = room if room < remaining else remaining        # max(1, min(remaining, room)), no builtins
            if k < 1 or self.admit_debt:
                k = 1
        else:               # pipeline stages: one step; the decodes sit out the next micro-batch
            for r in decodes:
                ctx += r.kv
                r.busy = True
        self.kv_used += k * n_dec       # reserved now; each decode's r.kv grows when the batch ends
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
                    r.kv += k               # the KV its k tokens took (reserved in kv_used when the batch formed)
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
        self.kv_used -= r.kv        # release(r), written out
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
        self.kv_used -= r.kv
        r.kv = 0

    def hand_over_kv(self, r: SimRequest, now: float) -> None:
        """The KV of ``r`` has left this (prefill) instance; ``r.kv`` now counts on the receiver."""
        self.kv_used -= r.kv
        if self.waiting:        # the freed memory can only matter to prompts waiting for it
            self.wake(now)
