"""Reference for tests/test_sim.py: the simulator engine as it was before the closed-form decode plans
(pdlab.sim.engine at commit e18b821, unchanged apart from this paragraph). Step end times come from
numpy cumulative sums and every arrival is a heap event. The fast engine must reproduce its
per-request results (TTFT, TPOT, token times) to 1e-9 relative. Do not optimise this file.

The original docstring follows.

The discrete-event core: instances that run iterations, the KV link, and the event loop.

Events are per iteration, not per token: an iteration's end is one event, and a run of pure-decode
iterations with a fixed batch is planned as one event (the step times are computed with numpy)
and cut short when new work reaches the instance. Results equal a step-by-step simulation.

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

Pipeline parallelism: an instance with ``pp`` stages starts a new micro-batch every
``step / pp`` seconds and a micro-batch completes ``step`` seconds after it started; a request is
in at most one micro-batch at a time.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pdlab.metrics import RequestRecord
from pdlab.sim.dispatch import DispatchPolicy, make_dispatch
from pdlab.sim.latency import LatencyModel
from pdlab.workloads import Request

__all__ = ["InstanceSpec", "KVLink", "Instance", "Simulator", "SimResult", "ROLES", "SCHEDULERS"]

ROLES = ("colocated", "prefill", "decode")
SCHEDULERS = ("vllm", "chunked")
_MAX_PLAN_STEPS = 512


@dataclass
class InstanceSpec:
    """How to build one instance. ``latency.tp``/``latency.pp`` give its GPU count."""

    latency: LatencyModel
    kv_capacity_tokens: int
    role: str = "colocated"
    scheduler: str = "vllm"
    token_budget: int = 2048
    max_num_seqs: int = 256
    max_batched_tokens: int = 16384
    name: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        for name in ("token_budget", "max_num_seqs", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def num_gpus(self) -> int:
        return int(getattr(self.latency, "tp", 1)) * int(getattr(self.latency, "pp", 1))


@dataclass
class KVLink:
    """The path KV takes from a prefill to a decode instance.

    ``bandwidth_bytes_per_s`` per direction (None = instantaneous); transfers from one prefill
    instance share its link one after another (FIFO). With ``layerwise_overlap`` the KV of each
    layer is sent while the next layer computes, so after the prefill ends only
    max(transfer / layers, transfer − prefill time · (layers − 1) / layers) remains.
    """

    kv_bytes_per_token: float
    bandwidth_bytes_per_s: float | None = None
    num_layers: int = 1
    layerwise_overlap: bool = False
    latency_s: float = 0.0

    def transfer_s(self, tokens: int, prefill_s: float = 0.0) -> float:
        """Seconds on the wire after the prefill ends for ``tokens`` tokens of KV."""
        if self.bandwidth_bytes_per_s is None:
            return self.latency_s
        full = tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        if self.layerwise_overlap and self.num_layers > 1:
            hidden = prefill_s * (self.num_layers - 1) / self.num_layers
            full = max(full / self.num_layers, full - hidden)
        return full + self.latency_s


class _Req:
    """Simulator-internal state of one request."""

    __slots__ = ("req", "arrival", "prompt", "output", "target", "prefilled", "generated", "kv", "first",
                 "finish", "times", "preemptions", "error", "busy", "inst", "dec_inst", "last_prefill_s",
                 "xfer_start", "xfer_end", "prefill_inst")

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


class _Batch:
    __slots__ = ("prefill", "decodes", "ends", "start", "valid", "n_steps", "duration")

    def __init__(self, prefill: list[tuple[_Req, int]], decodes: list[_Req], start: float,
                 ends: np.ndarray | None, duration: float):
        self.prefill = prefill
        self.decodes = decodes
        self.start = start
        self.ends = ends            # pure-decode plan: end time of each step (absolute)
        self.n_steps = 1 if ends is None else len(ends)
        self.duration = duration
        self.valid = True


class Instance:
    """One serving instance (TP × PP GPUs) in the simulation; built from an :class:`InstanceSpec`."""

    def __init__(self, spec: InstanceSpec, name: str, sim: Simulator):
        self.spec = spec
        self.name = name
        self.sim = sim
        self.role = spec.role
        self.latency = spec.latency
        self.pp = max(1, int(getattr(spec.latency, "pp", 1)))
        self.capacity = int(spec.kv_capacity_tokens)
        self.kv_used = 0
        self.waiting: deque[_Req] = deque()      # to prefill (colocated/prefill) or KV arrived (decode)
        self.prefilling: list[_Req] = []         # chunked: admitted, partly prefilled
        self.running: list[_Req] = []            # decoding, in admission order
        self.swapped: deque[_Req] = deque()      # decode role: preempted, waiting for memory
        self.inflight: list[_Batch] = []
        self.stage_free_at = 0.0
        self.iterations = 0
        self.preemptions = 0
        self.busy_s = 0.0
        self.queued_tokens = 0

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
    def enqueue(self, r: _Req, now: float) -> None:
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
            if b.ends is not None and b.n_steps > 1:
                j = int(np.searchsorted(b.ends, now, side="left"))
                keep = min(j + 1, b.n_steps)
                if keep < b.n_steps:
                    self._truncate(b, keep)
        elif self.stage_free_at <= now and len(self.inflight) < self.pp:
            self.try_schedule(now)

    def _truncate(self, b: _Batch, keep: int) -> None:
        drop = b.n_steps - keep
        self.kv_used -= drop * len(b.decodes)
        for r in b.decodes:
            r.kv -= drop
        b.valid = False
        self.iterations -= drop
        self.busy_s -= float(b.ends[-1] - b.ends[keep - 1])
        nb = _Batch(b.prefill, b.decodes, b.start, b.ends[:keep], float(b.ends[keep - 1] - b.start))
        self.inflight[0] = nb
        self.stage_free_at = float(nb.ends[-1])
        self.sim._push(float(nb.ends[-1]), _DONE, self, nb)

    # -- scheduling -------------------------------------------------------------------------------
    def try_schedule(self, now: float) -> None:
        while len(self.inflight) < self.pp and self.stage_free_at <= now + 1e-12:
            b = self._form_batch(now)
            if b is None:
                return
            self.inflight.append(b)
            self.iterations += b.n_steps
            self.busy_s += b.duration
            end = float(b.ends[-1]) if b.ends is not None else now + b.duration
            if self.pp == 1:
                self.stage_free_at = end
                self.sim._push(end, _DONE, self, b)
            else:
                self.stage_free_at = now + b.duration / self.pp
                self.sim._push(end, _DONE, self, b)
                self.sim._push(self.stage_free_at, _STAGE, self, None)
                return

    def _fail(self, r: _Req, now: float, why: str) -> None:
        r.error = why
        r.finish = None
        self.sim._finished(r, now)

    def _admit_prefills(self, now: float, budget: int, max_new: int) -> list[tuple[_Req, int]]:
        """FCFS admission from ``waiting``: KV for the whole prefill target must fit."""
        items: list[tuple[_Req, int]] = []
        while self.waiting and budget > 0 and max_new > 0:
            r = self.waiting[0]
            if r.target > self.capacity:
                self.waiting.popleft()
                self.queued_tokens -= r.target
                self._fail(r, now, f"prompt of {r.target} tokens exceeds the KV capacity of {self.name} "
                                   f"({self.capacity} tokens)")
                continue
            if self.kv_used + r.target > self.capacity:
                break
            chunk = r.target if self.spec.scheduler == "vllm" or self.role == "prefill" else min(r.target, budget)
            if items and chunk > budget:
                break
            self.waiting.popleft()
            self.queued_tokens -= r.target
            self.kv_used += r.target
            r.kv = r.target
            r.prefilled = 0
            items.append((r, chunk))
            budget -= chunk
            max_new -= 1
        return items

    def _ensure_decode_room(self, now: float, decodes: list[_Req]) -> list[_Req]:
        """Make room for one more token per decode: fail requests that can never fit, give back
        partial prefills, then preempt the most recently admitted running requests."""
        while decodes and self.kv_used + len(decodes) > self.capacity:
            victim = decodes[-1]
            if victim.kv + 1 > self.capacity:
                decodes.pop()
                self.running.remove(victim)
                self._release(victim)
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

    def _requeue(self, r: _Req) -> None:
        self.kv_used -= r.kv
        r.kv = 0
        r.prefilled = 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)
        self.queued_tokens += r.target

    def _preempt(self, r: _Req) -> None:
        if self.role == "decode":       # swap out: KV leaves the GPU, comes back when memory frees
            self.kv_used -= r.kv
            r.preemptions += 1
            self.preemptions += 1
            self.swapped.appendleft(r)
        else:                           # recompute: drop the KV, prefill prompt + generated again
            r.target = r.prompt + r.generated
            self._requeue(r)

    def _form_batch(self, now: float) -> _Batch | None:
        spec = self.spec
        free_decodes = [r for r in self.running if not r.busy] if self.pp > 1 else list(self.running)
        prefill: list[tuple[_Req, int]] = []
        decodes: list[_Req] = []
        if self.role == "decode":
            while self.swapped and self.kv_used + self.swapped[0].kv + len(self.running) + 1 <= self.capacity \
                    and len(self.running) < spec.max_num_seqs:
                r = self.swapped.popleft()
                self.kv_used += r.kv
                self.running.append(r)
                free_decodes.append(r)
            while self.waiting and len(self.running) < spec.max_num_seqs:
                r = self.waiting.popleft()
                self.running.append(r)
                free_decodes.append(r)
            decodes = self._ensure_decode_room(now, free_decodes)
        elif self.role == "prefill" or spec.scheduler == "vllm":
            max_new = spec.max_num_seqs - len(self.running) if self.role == "colocated" else spec.max_num_seqs
            prefill = self._admit_prefills(now, spec.max_batched_tokens, max_new)
            if not prefill and self.role == "colocated":
                decodes = self._ensure_decode_room(now, free_decodes)
        else:  # chunked, stall-free: decodes, ongoing prefills, new prefills
            decodes = self._ensure_decode_room(now, free_decodes)
            budget = spec.token_budget - len(decodes)
            for r in self.prefilling:
                if budget <= 0:
                    break
                if r.busy:
                    continue
                chunk = min(r.target - r.prefilled, budget)
                prefill.append((r, chunk))
                budget -= chunk
            if budget > 0:
                new = self._admit_prefills(now, budget, spec.max_num_seqs - len(self.running) - len(self.prefilling))
                self.prefilling.extend(r for r, _ in new)
                prefill.extend(new)
        if not prefill and not decodes:
            return None
        for r, _ in prefill:
            r.busy = True
        n_dec = len(decodes)
        if prefill:
            p_tokens = sum(c for _, c in prefill)
            p_sq = float(sum(c * (2 * r.prefilled + c) for r, c in prefill))
            ctx = sum(r.kv for r in decodes)
            for r in decodes:
                r.kv += 1
                r.busy = True
            self.kv_used += n_dec
            t = self.latency.step_time_s(p_tokens, p_sq, n_dec, ctx)
            return _Batch(prefill, decodes, now, None, t)
        # pure decode: plan several steps when nothing else can join until a request finishes
        ctx = sum(r.kv for r in decodes)
        k = 1
        if self.pp == 1:
            remaining = min(r.output - r.generated for r in decodes)
            room = (self.capacity - self.kv_used) // n_dec
            k = max(1, min(remaining, room, _MAX_PLAN_STEPS))
        for r in decodes:
            r.kv += k
            r.busy = True
        self.kv_used += k * n_dec
        if k == 1:
            t = self.latency.step_time_s(0, 0.0, n_dec, ctx)
            return _Batch([], decodes, now, None, t)
        steps = self.latency.decode_times_s(n_dec, ctx + n_dec * np.arange(k))
        ends = now + np.cumsum(steps)
        return _Batch([], decodes, now, ends, float(ends[-1] - now))

    # -- completion -------------------------------------------------------------------------------
    def complete(self, b: _Batch, now: float) -> None:
        if not b.valid:
            return
        self.inflight.remove(b)
        sim = self.sim
        if b.ends is not None:
            times = b.ends
            last = float(times[-1])
        else:
            times = None
            last = now
        k = b.n_steps
        for r in b.decodes:
            r.busy = False
            if r.finish is not None or r.error:
                continue
            r.generated += k
            if r.times is not None:
                if times is not None:
                    r.times.frombytes(times.tobytes())
                else:
                    r.times.append(now)
            if r.generated >= r.output:
                self._release(r)
                self.running.remove(r)
                r.finish = last
                sim._finished(r, last)
        for r, chunk in b.prefill:
            r.busy = False
            if r.error:
                continue
            r.prefilled += chunk
            r.last_prefill_s = b.duration
            if r.prefilled < r.target:
                continue
            if r in self.prefilling:
                self.prefilling.remove(r)
            r.generated += 1            # a finished prefill produces the next token
            if r.first is None:
                r.first = now
            if r.times is not None:
                r.times.append(now)
            if r.generated >= r.output:
                self._release(r)
                r.finish = now
                sim._finished(r, now)
            elif self.role == "prefill":
                r.prefill_inst = self.name
                sim._prefill_done(self, r, now)
            else:
                self.running.append(r)
        if self.role == "decode":
            sim._start_pulls(self, now)
        self.try_schedule(now)

    def _release(self, r: _Req) -> None:
        self.kv_used -= r.kv
        r.kv = 0

    def hand_over_kv(self, r: _Req, now: float) -> None:
        """The KV of ``r`` has left this (prefill) instance; ``r.kv`` now counts on the receiver."""
        self.kv_used -= r.kv
        self.wake(now)


_ARRIVAL, _DONE, _STAGE, _XFER = 0, 1, 2, 3


@dataclass
class SimResult:
    """Records of every request (finished or failed), in request order, plus run statistics."""

    records: list[RequestRecord]
    sim_wall_s: float
    num_gpus: int
    instances: list[dict[str, Any]] = field(default_factory=list)
    end_time_s: float = 0.0

    def summary(self, slo: Any = None) -> dict[str, Any]:
        """:func:`pdlab.metrics.summarize` of the records, with per-GPU goodput and ``sim_wall_s``."""
        from pdlab.metrics import summarize

        out = summarize(self.records, slo, num_gpus=self.num_gpus)
        out["num_gpus"] = self.num_gpus
        out["sim_wall_s"] = self.sim_wall_s
        out["preemptions"] = sum(r.preemptions for r in self.records)
        return out


class Simulator:
    """A cluster of instances fed by one request stream.

    ``specs``: the instances. Colocated instances (or prefill ones, with decode ones beside them)
    receive arrivals through ``dispatch``; prefilled requests go to decode instances through
    ``decode_dispatch`` and cross ``link``. Mixing colocated with prefill/decode instances is not
    supported. Deterministic: same requests, same result.
    """

    def __init__(self, specs: Sequence[InstanceSpec], *, dispatch: str | DispatchPolicy = "round_robin",
                 decode_dispatch: str | DispatchPolicy = "least_loaded", link: KVLink | None = None,
                 record_token_times: bool = True):
        if not specs:
            raise ValueError("a cluster needs at least one instance")
        roles = {s.role for s in specs}
        if "colocated" in roles and roles != {"colocated"}:
            raise ValueError("mix of colocated and prefill/decode instances is not supported")
        if roles & {"prefill", "decode"} and roles != {"prefill", "decode"}:
            raise ValueError("a disaggregated cluster needs at least one prefill and one decode instance")
        self.specs = list(specs)
        self.dispatch = make_dispatch(dispatch)
        self.decode_dispatch = make_dispatch(decode_dispatch)
        self.link = link
        self.record_token_times = record_token_times

    # -- event queue --------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: Any, b: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _finished(self, r: _Req, now: float) -> None:
        self._done += 1

    def _prefill_done(self, src: Instance, r: _Req, now: float) -> None:
        i = self.decode_dispatch.choose(self.decode, r, now)
        dst = self.decode[i]
        r.dec_inst = dst
        dst.queued_tokens += r.kv
        self._pending_pulls[dst.name].append((src, r))
        self._start_pulls(dst, now)

    def _start_pulls(self, dst: Instance, now: float) -> None:
        """Decode instances pull KV (DistServe §4.3) when they have room, first come first served."""
        q = self._pending_pulls[dst.name]
        while q:
            src, r = q[0]
            need = r.kv
            if need > dst.capacity:
                q.popleft()
                dst.queued_tokens -= need
                src._release(r)
                src.wake(now)
                r.error = f"context of {need} tokens exceeds the KV capacity of {dst.name} ({dst.capacity} tokens)"
                self._finished(r, now)
                continue
            if dst.kv_used + need > dst.capacity:
                return
            q.popleft()
            dst.queued_tokens -= need
            dst.kv_used += need
            start = max(now, self._link_free[src.name])
            dur = self.link.transfer_s(need, r.last_prefill_s) if self.link is not None else 0.0
            self._link_free[src.name] = start + dur
            r.xfer_start, r.xfer_end = start, start + dur
            self._push(start + dur, _XFER, src, r)

    # -- run ------------------------------------------------------------------------------------------
    def run(self, requests: Sequence[Request], *, horizon_s: float | None = None) -> SimResult:
        """Simulate ``requests`` (sorted or not); every request ends finished or with an error."""
        import time

        t0 = time.perf_counter()
        self._heap: list = []
        self._seq = 0
        self._done = 0
        self.dispatch.reset()
        self.decode_dispatch.reset()
        counts: dict[str, int] = {}
        self.instances: list[Instance] = []
        for s in self.specs:
            counts[s.role] = counts.get(s.role, 0) + 1
            self.instances.append(Instance(s, s.name or f"{s.role}-{counts[s.role] - 1}", self))
        self.front = [i for i in self.instances if i.role in ("colocated", "prefill")]
        self.decode = [i for i in self.instances if i.role == "decode"]
        self._pending_pulls = {i.name: deque() for i in self.decode}
        self._link_free = {i.name: 0.0 for i in self.front}
        states = [_Req(r, self.record_token_times) for r in requests]
        for st in sorted(states, key=lambda s: (s.arrival, s.req.request_id)):
            self._push(st.arrival, _ARRIVAL, st, None)
        now = 0.0
        heap = self._heap
        while heap:
            t, _, kind, a, b = heapq.heappop(heap)
            if horizon_s is not None and t > horizon_s:
                break
            now = t
            if kind == _DONE:
                a.complete(b, t)
            elif kind == _ARRIVAL:
                i = self.dispatch.choose(self.front, a, t)
                self.front[i].enqueue(a, t)
            elif kind == _XFER:
                a.hand_over_kv(b, t)
                b.dec_inst.enqueue(b, t)
            elif kind == _STAGE:
                a.try_schedule(t)
        records = [self._record(s) for s in states]
        infos = [{"name": i.name, "role": i.role, "tp": int(getattr(i.latency, "tp", 1)),
                  "pp": i.pp, "num_gpus": i.num_gpus, "kv_capacity_tokens": i.capacity,
                  "iterations": i.iterations, "busy_s": i.busy_s, "preemptions": i.preemptions}
                 for i in self.instances]
        return SimResult(records, time.perf_counter() - t0, sum(i.num_gpus for i in self.instances), infos, now)

    def _record(self, s: _Req) -> RequestRecord:
        ok = not s.error and s.finish is not None
        error = s.error or ("" if ok else "unfinished when the simulation ended")
        extra: dict[str, Any] = {}
        if s.xfer_start is not None:
            extra = {"kv_transfer_start_s": s.xfer_start, "kv_transfer_end_s": s.xfer_end,
                     "prefill_instance": s.prefill_inst}
        return RequestRecord(
            request_id=s.req.request_id, arrival_s=s.arrival, prompt_tokens=s.prompt, output_tokens=s.output,
            first_token_s=s.first, finish_s=s.finish if ok else None,
            token_times_s=s.times if s.times is not None else None, ok=ok, error=error,
            instance=(s.dec_inst.name if s.dec_inst is not None else s.inst), preemptions=s.preemptions,
            extra=extra)

