"""The discrete-event core: the event loop, KV hand-off from prefill to decode instances over
the link, and the run's records. Instances are in :mod:`pdlab.sim.instance`, their batch
schedulers in :mod:`pdlab.sim.schedulers`, their KV memory in :mod:`pdlab.sim.kvmanager`; what a
deployment is made of in :mod:`pdlab.sim.spec`.

Events are per iteration, not per token: an iteration's end is one event, and a run of pure-decode
iterations with a fixed batch is planned as one event and cut short when new work reaches the
instance. For latency models with an affine decode step (:meth:`LatencyModel.decode_affine`: the
roofline, fitted and constant models) a plan is summed in closed form (each step's time is linear
in the step index, so k steps are an arithmetic series) and the per-step end times are only built
when token times are recorded, for all plans of a run in one vectorised pass at its end
(:meth:`Simulator.token_mark`); other models get numpy arrays of step times. Results equal a
step-by-step simulation up to floating-point rounding (tested to 1e-9 relative).

Hand-off physics (disaggregated clusters), each off or at the old behaviour by default:

- ``InstanceSpec.handoff_reservation`` on decode instances — ``"prompt"`` (default): a pull
  starts only when the decode instance can reserve KV for the whole prompt, which it holds from
  the start of the transfer (vLLM's NixlConnector: the scheduler allocates the prompt's blocks in
  ``get_num_new_matched_tokens``/``allocate_slots`` before the asynchronous load, and stops at the
  first waiting request that does not fit, so concurrent hand-offs are bounded by free blocks);
  ``"vllm"``: as ``"prompt"`` and, as vLLM's scheduler, no new hand-off starts while
  ``max_num_seqs`` requests are running; ``"none"``: no reservation, the KV lands in host memory
  (Mooncake FAST'25 §3: layer-wise streaming into the decode node's DRAM) and the request waits
  for GPU room in the decode queue.
- ``KVLink.sharing`` — ``"fifo"`` (default): transfers from one prefill instance use its link one
  after another; ``"fair"``: concurrent transfers share the bandwidth equally (processor
  sharing, as TCP/RDMA flows on one NIC do).
- ``KVLink.setup_s`` — fixed seconds per transfer before the first byte moves (NIXL handshake and
  descriptor preparation, measured in notebook 03 and lab 01). Default 0.
- ``InstanceSpec.cpu_group`` / ``cpu_contention`` — instances that share CPU cores (the course's
  CPU set-up runs prefill and decode servers on one machine): an iteration that starts while
  ``n`` other instances of the same group are busy takes ``1 + cpu_contention · n`` times as long.
  Default: no group, factor 0.
- ``InstanceSpec.admit_overhead_s`` on decode instances — seconds each handed-off request adds
  to the step that admits it: per-request work that runs on the decode role's cores between its
  steps (the API server's HTTP and tokenisation, the connector's bookkeeping, and on the course's
  CPU the proxy and client sharing those cores), measured live by
  :func:`pdlab.serve.pair_probes.probe_admission`. Default 0.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdlab.metrics import RequestRecord
from pdlab.sim.admission import REJECTED, AdmissionPolicy, rejection_error
from pdlab.sim.dispatch import DispatchPolicy, make_dispatch
from pdlab.sim.instance import Instance
from pdlab.sim.spec import HANDOFF_RESERVATIONS, LINK_SHARING, ROLES, InstanceSpec, KVLink
from pdlab.sim.state import (
    EV_DONE,
    EV_JOIN,
    EV_LINK,
    EV_STAGE,
    EV_XFER,
    Batch,
    SimRequest,
    expand_plan_stamps,
)
from pdlab.workloads import Request

__all__ = ["InstanceSpec", "KVLink", "Instance", "Simulator", "SimResult", "ROLES",
           "HANDOFF_RESERVATIONS", "LINK_SHARING"]


class _SharedLink:
    """Processor sharing on one prefill instance's link: n active transfers each get 1/n of it.

    Virtual time ``v`` is the service (seconds at full bandwidth) every active transfer has
    received; a transfer that joins at ``v0`` with ``work`` seconds finishes when ``v`` reaches
    ``v0 + work``.
    """

    __slots__ = ("v", "t", "heap", "version", "seq")

    def __init__(self) -> None:
        self.v = 0.0
        self.t = 0.0
        self.heap: list = []
        self.version = 0
        self.seq = 0

    def advance(self, now: float) -> None:
        if self.heap:
            self.v += (now - self.t) / len(self.heap)
        self.t = now

    def next_finish(self) -> float:
        return self.t + max(0.0, self.heap[0][0] - self.v) * len(self.heap)


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
    supported. ``admission``: the admission hook (:mod:`pdlab.sim.admission`), asked about every
    arrival after ``dispatch`` has chosen its instance; a refused request ends with an error record.
    Deterministic: same requests, same result.
    """

    record_token_times = True
    link: KVLink | None = None
    #: Plans whose step ends are still to be expanded into token times (see :meth:`token_mark`); a
    #: list only while a run records token times.
    plan_log: list[Batch] | None = None
    #: Plan markers are ``mark_base - i``: below every time stamp of the run (set when it starts).
    mark_base = -1.0
    #: Subclasses that route between a colocated pool and a P/D pool set this (the event loop sends
    #: arrivals to colocated and prefill instances alike, and prefilled requests on to decode).
    mixed_roles: bool = False

    def __init__(self, specs: Sequence[InstanceSpec], *, dispatch: str | DispatchPolicy = "round_robin",
                 decode_dispatch: str | DispatchPolicy = "least_loaded", link: KVLink | None = None,
                 record_token_times: bool = True, admission: AdmissionPolicy | None = None):
        if not specs:
            raise ValueError("a cluster needs at least one instance")
        roles = {s.role for s in specs}
        if "colocated" in roles and roles != {"colocated"} and not self.mixed_roles:
            raise ValueError("mix of colocated and prefill/decode instances is not supported")
        if ("prefill" in roles) != ("decode" in roles):
            raise ValueError("a disaggregated cluster needs at least one prefill and one decode instance")
        self.specs = list(specs)
        self.dispatch = make_dispatch(dispatch)
        self.decode_dispatch = make_dispatch(decode_dispatch)
        self.link = link
        self.record_token_times = record_token_times
        #: The admission hook (:mod:`pdlab.sim.admission`; None: every arrival is admitted).
        self.admission = admission
        #: The simulated time of the event being handled (the admission policy's clock reads it).
        self.now_s = 0.0

    # -- the interface instances use ------------------------------------------------------------------
    def push(self, t: float, kind: int, a: Any, b: Any) -> int:
        """Schedule an event of ``kind`` (:data:`pdlab.sim.state.EV_DONE` …) at ``t`` with payload
        ``(a, b)``; equal times keep push order. Returns the event's sequence number (an
        ``EV_DONE`` event runs only while it is its batch's ``seq``). The heap of events
        (``event_heap``) and the last sequence number (``event_seq``) are the engine's own: parts
        schedule events through this method and :meth:`schedule_batch`."""
        self.event_seq = seq = self.event_seq + 1
        heapq.heappush(self.event_heap, (t, seq, kind, a, b))
        return seq

    def schedule_batch(self, inst: Instance, b: Batch) -> None:
        """Schedule the completion of ``inst``'s batch ``b`` at ``b.end``: ``push(b.end, EV_DONE,
        inst, b)``, written out (once per batch), with ``b.seq`` set to the event's number; an
        earlier completion event of ``b`` (a plan cut short) is then passed over."""
        self.event_seq = b.seq = seq = self.event_seq + 1
        heapq.heappush(self.event_heap, (b.end, seq, EV_DONE, inst, b))

    def token_mark(self, b: Batch) -> float:
        """What each decode of the completed multi-step batch ``b`` appends to its token times: a
        marker ``mark_base - i`` for ``b``, the i-th logged plan. The run expands every marker into
        the plan's step ends at its end, all plans in one vectorised pass
        (:func:`pdlab.sim.state.expand_plan_stamps`: the values of :meth:`Batch.step_ends`)."""
        log = self.plan_log
        log.append(b)
        return self.mark_base - (len(log) - 1)

    def on_request_finished(self, r: SimRequest, now: float) -> None:
        """Hook: ``r`` has ended at ``now``, finished (``r.finish`` set) or failed (``r.error``).
        Subclasses that override it call ``super().on_request_finished``."""
        self._done += 1
        if self.admission is not None:
            self.now_s = now
            self.admission.done(str(r.req.request_id))

    def clock(self) -> float:
        """The simulated time now (s): the admission policy's clock during a run."""
        return self.now_s

    def admit(self, r: SimRequest, now: float) -> bool:
        """The admission hook on the arrival of ``r``: True to admit (the policy's ``start`` is
        called); False ends ``r`` as refused (see :mod:`pdlab.sim.admission`)."""
        policy = self.admission
        self.now_s = now
        verdict = policy.decide(r.prompt, r.output)
        if verdict.admit:
            policy.start(str(r.req.request_id), r.prompt)
            return True
        r.error = rejection_error(getattr(verdict, "reason", ""))
        self.on_request_finished(r, now)
        return False

    def prefill_done(self, src: Instance, r: SimRequest, now: float) -> None:
        """Prefill instance ``src`` has prefilled ``r``: choose its decode instance and queue the KV pull."""
        if self.admission is not None:     # the prefill leg is back: the policy's done
            self.now_s = now
            self.admission.done(str(r.req.request_id))
        i = self.decode_dispatch.choose(self.decode, r, now)
        dst = self.decode[i]
        r.dec_inst = dst
        dst.queued_tokens += r.kv
        dst.pending_pulls.append((src, r))
        self.start_pulls(dst, now)

    def start_pulls(self, dst: Instance, now: float) -> None:
        """Decode instances pull KV (DistServe §4.3) when they have room, first come first served
        (see ``InstanceSpec.handoff_reservation``)."""
        q = dst.pending_pulls
        mode = dst.spec.handoff_reservation
        while q:
            src, r = q[0]
            need = r.kv
            if need > dst.capacity:
                q.popleft()
                dst.queued_tokens -= need
                src.release(r)
                src.wake(now)
                r.error = f"context of {need} tokens exceeds the KV capacity of {dst.name} ({dst.capacity} tokens)"
                self.on_request_finished(r, now)
                continue
            if mode == "none":
                r.staged = True         # lands in host memory; GPU room is taken when it joins the batch
            else:
                kv = dst.kv_manager
                if kv.used + need > kv.capacity:
                    return
                if mode == "vllm" and len(dst.running) >= dst.spec.max_num_seqs:
                    return
                dst.queued_tokens -= need
                kv.reserve(need)
            q.popleft()
            self._start_transfer(src, r, need, now)

    def _start_transfer(self, src: Instance, r: SimRequest, tokens: int, now: float) -> None:
        link = self.link
        if link is None:
            r.xfer_start = r.xfer_end = now
            self.push(now, EV_XFER, src, r)
            return
        if link.sharing == "fifo":
            free = self._link_free[src.name]
            start = free if free > now else now        # max(now, free)
            end = start + link.transfer_s(tokens, r.last_prefill_s)
            self._link_free[src.name] = end
            r.xfer_start, r.xfer_end = start, end
            self.push(end, EV_XFER, src, r)
            return
        r.xfer_start = now
        work = link.wire_s(tokens, r.last_prefill_s)
        if link.setup_s > 0:
            self.push(now + link.setup_s, EV_JOIN, src, (r, work))
        else:
            self._join_link(src, r, work, now)

    def _join_link(self, src: Instance, r: SimRequest, work: float, now: float) -> None:
        sl = self._shared[src.name]
        sl.advance(now)
        sl.seq += 1
        heapq.heappush(sl.heap, (sl.v + work, sl.seq, r))
        self._reschedule_link(src, sl)

    def _reschedule_link(self, src: Instance, sl: _SharedLink) -> None:
        sl.version += 1
        if sl.heap:
            self.push(sl.next_finish(), EV_LINK, src, sl.version)

    def _link_event(self, src: Instance, version: int, now: float) -> None:
        sl = self._shared[src.name]
        if version != sl.version:
            return
        sl.advance(now)
        heap = sl.heap
        _, _, r = heapq.heappop(heap)
        done = [r]
        tol = 1e-12 * max(1.0, abs(sl.v))
        while heap and heap[0][0] <= sl.v + tol:
            done.append(heapq.heappop(heap)[2])
        self._reschedule_link(src, sl)
        lat = self.link.latency_s
        for r in done:
            r.xfer_end = now + lat
            self.push(now + lat, EV_XFER, src, r)

    def _kv_arrived(self, src: Instance, r: SimRequest, now: float) -> None:
        src.hand_over_kv(r, now)
        r.dec_inst.enqueue(r, now)

    # -- run ------------------------------------------------------------------------------------------
    def _build_instances(self) -> list[Instance]:
        """One :class:`Instance` per spec (override to build other instance classes)."""
        counts: dict[str, int] = {}
        out = []
        for s in self.specs:
            counts[s.role] = counts.get(s.role, 0) + 1
            out.append(Instance(s, s.name or f"{s.role}-{counts[s.role] - 1}", self))
        groups: dict[str, list[Instance]] = {}
        for inst in out:
            if inst.spec.cpu_group is not None:
                groups.setdefault(inst.spec.cpu_group, []).append(inst)
        for members in groups.values():
            for inst in members:
                inst.cpu_peers = [p for p in members if p is not inst]
        return out

    def run(self, requests: Sequence[Request], *, horizon_s: float | None = None) -> SimResult:
        """Simulate ``requests`` (sorted or not); every request ends finished or with an error.

        Python's cyclic garbage collector is paused while the run works and restored after: the run
        allocates some 10⁵ objects that live until it ends (requests, batches, events, records), and
        every automatic collection would walk them all again. Reference counting still frees what
        the run drops; the few cycles it makes are collected after it."""
        import time

        t0 = time.perf_counter()
        collecting = gc.isenabled()
        gc.disable()
        try:
            states, order = self._start(requests)
            now = self._event_loop(order, float("inf") if horizon_s is None else horizon_s)
            if self.plan_log is not None:
                times = expand_plan_stamps([s.times for s in states], self.plan_log, self.mark_base)
                for s, t in zip(states, times, strict=True):
                    s.times = t
            self.plan_log = None
            records = [self._record(s) for s in states]
        finally:
            if collecting:
                gc.enable()
        infos = []
        for i in self.instances:
            info = {"name": i.name, "role": i.role, "tp": int(getattr(i.latency, "tp", 1)),
                    "pp": i.pp, "num_gpus": i.num_gpus, "kv_capacity_tokens": i.capacity,
                    "iterations": i.iterations, "busy_s": i.busy_s, "preemptions": i.preemptions}
            kv = i.kv_manager
            if kv.prefix_cache is not None and type(i) is Instance:
                info["prefix_hit_tokens"] = kv.hit_tokens
                info["prefix_hit_ratio"] = kv.hit_tokens / kv.prompt_tokens_seen if kv.prompt_tokens_seen else 0.0
            infos.append(info)
        return SimResult(records, time.perf_counter() - t0, sum(i.num_gpus for i in self.instances), infos, now)

    def _start(self, requests: Sequence[Request]) -> tuple[list[SimRequest], list[SimRequest]]:
        """Fresh run state: instances, queues, links; the requests' states in request order and in
        arrival order."""
        self.event_heap: list = []     # (time, sequence number, kind, a, b): see push
        self.event_seq = 0
        self._done = 0
        self.dispatch.reset()
        self.decode_dispatch.reset()
        self.now_s = 0.0
        if self.admission is not None:
            self.admission.clock = self.clock     # the policy reads the simulated time
        self.instances: list[Instance] = self._build_instances()
        self.front = [i for i in self.instances if i.role in ("colocated", "prefill")]
        self.decode = [i for i in self.instances if i.role == "decode"]
        self._link_free = {i.name: 0.0 for i in self.front}
        self._shared = {i.name: _SharedLink() for i in self.front}
        record = self.record_token_times
        states = [SimRequest(r, record) for r in requests]
        order = sorted(states, key=lambda s: (s.arrival, s.req.request_id))
        # every time stamp is at or after the first arrival: plan markers go below it
        self.plan_log = [] if record else None
        self.mark_base = min(0.0, math.floor(order[0].arrival)) - 1.0 if order else -1.0
        return states, order

    def _event_loop(self, order: list[SimRequest], horizon: float) -> float:
        """Run the events up to ``horizon``; the time of the last one simulated."""
        # arrivals are read from the sorted list, merged with the event heap by time (an arrival
        # goes first on equal times, as it would with the smaller sequence number)
        heap = self.event_heap
        front = self.front
        dispatch = self.dispatch
        admission = self.admission
        pop = heapq.heappop
        n_arr = len(order)
        ai = 0
        t_arr = order[0].arrival if n_arr else 0.0     # the next arrival's time (order[ai].arrival)
        now = 0.0
        while True:
            if ai < n_arr and (not heap or t_arr <= heap[0][0]):
                a = order[ai]
                t = t_arr
                if t > horizon:
                    break
                ai += 1
                if ai < n_arr:
                    t_arr = order[ai].arrival
                now = t
                i = dispatch.choose(front, a, t)
                if admission is None or self.admit(a, t):
                    front[i].enqueue(a, t)
                continue
            if not heap:
                break
            t, seq, kind, a, b = pop(heap)
            if t > horizon:
                break
            now = t
            if kind == EV_DONE:
                if seq == b.seq:        # else the batch was cut short: a later event completes it
                    a.complete(b, t)
            elif kind == EV_XFER:
                self._kv_arrived(a, b, t)
            elif kind == EV_STAGE:
                a.try_schedule(t)
            elif kind == EV_LINK:
                self._link_event(a, b, t)
            elif kind == EV_JOIN:
                self._join_link(a, b[0], b[1], t)
        return now

    def _record(self, s: SimRequest) -> RequestRecord:
        ok = not s.error and s.finish is not None
        error = s.error or ("" if ok else "unfinished when the simulation ended")
        extra: dict[str, Any] = {}
        if s.error.startswith(REJECTED):
            extra = {"rejected": "arrival"}
        elif s.xfer_start is not None:
            extra = {"kv_transfer_start_s": s.xfer_start, "kv_transfer_end_s": s.xfer_end,
                     "prefill_instance": s.prefill_inst}
        return RequestRecord(
            request_id=s.req.request_id, arrival_s=s.arrival, prompt_tokens=s.prompt, output_tokens=s.output,
            first_token_s=s.first, finish_s=s.finish if ok else None,
            token_times_s=s.times if s.times is not None else None, ok=ok, error=error,
            instance=(s.dec_inst.name if s.dec_inst is not None else s.inst), preemptions=s.preemptions,
            extra=extra)
