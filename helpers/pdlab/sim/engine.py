"""The discrete-event core: instances that run iterations, the KV link, and the event loop.

Events are per iteration, not per token: an iteration's end is one event, and a run of pure-decode
iterations with a fixed batch is planned as one event and cut short when new work reaches the
instance. For latency models with an affine decode step (:meth:`LatencyModel.decode_affine`: the
roofline, fitted and constant models) a plan is summed in closed form (each step's time is linear
in the step index, so k steps are an arithmetic series) and the per-step end times are only built
when token times are recorded; other models get numpy arrays of step times. Results equal a
step-by-step simulation up to floating-point rounding (tested to 1e-9 relative).

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

Pipeline parallelism: an instance with ``pp`` stages starts a new micro-batch every
``step / pp`` seconds and a micro-batch completes ``step`` seconds after it started; a request is
in at most one micro-batch at a time.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from pdlab.kvcache import BLOCK_TOKENS
from pdlab.metrics import RequestRecord
from pdlab.sim.dispatch import DispatchPolicy, make_dispatch
from pdlab.sim.latency import LatencyModel
from pdlab.workloads import Request

__all__ = ["InstanceSpec", "KVLink", "Instance", "Simulator", "SimResult", "ROLES", "SCHEDULERS",
           "HANDOFF_RESERVATIONS", "LINK_SHARING"]

ROLES = ("colocated", "prefill", "decode")
SCHEDULERS = ("vllm", "chunked")
HANDOFF_RESERVATIONS = ("prompt", "vllm", "none")
LINK_SHARING = ("fifo", "fair")
_MAX_PLAN_STEPS = 512


@dataclass
class InstanceSpec:
    """How to build one instance. ``latency.tp``/``latency.pp`` give its GPU count.

    ``prefix_caching`` / ``prefix_block_tokens``: vLLM-style automatic prefix caching on colocated
    and prefill instances (see the module docstring). ``handoff_reservation`` (decode instances),
    ``cpu_group`` and ``cpu_contention``: hand-off physics, see the module docstring.
    """

    latency: LatencyModel
    kv_capacity_tokens: int
    role: str = "colocated"
    scheduler: str = "vllm"
    token_budget: int = 2048
    max_num_seqs: int = 256
    max_batched_tokens: int = 16384
    name: str = ""
    prefix_caching: bool = False
    prefix_block_tokens: int = BLOCK_TOKENS
    handoff_reservation: str = "prompt"
    cpu_group: str | None = None
    cpu_contention: float = 0.0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.handoff_reservation not in HANDOFF_RESERVATIONS:
            raise ValueError(f"handoff_reservation must be one of {HANDOFF_RESERVATIONS}, "
                             f"got {self.handoff_reservation!r}")
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        for name in ("token_budget", "max_num_seqs", "max_batched_tokens", "prefix_block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cpu_contention < 0:
            raise ValueError(f"cpu_contention must be >= 0, got {self.cpu_contention}")

    @property
    def num_gpus(self) -> int:
        return int(getattr(self.latency, "tp", 1)) * int(getattr(self.latency, "pp", 1))


@dataclass
class KVLink:
    """The path KV takes from a prefill to a decode instance.

    ``bandwidth_bytes_per_s`` per direction (None = instantaneous). Transfers from one prefill
    instance share its link: one after another with ``sharing="fifo"`` (default), or all at once
    with equal shares of the bandwidth with ``sharing="fair"`` (processor sharing). With
    ``layerwise_overlap`` the KV of each layer is sent while the next layer computes, so after the
    prefill ends only max(transfer / layers, transfer − prefill time · (layers − 1) / layers)
    remains. ``setup_s`` is paid once per transfer before data moves (handshake, descriptors);
    ``latency_s`` after the last byte.
    """

    kv_bytes_per_token: float
    bandwidth_bytes_per_s: float | None = None
    num_layers: int = 1
    layerwise_overlap: bool = False
    latency_s: float = 0.0
    sharing: str = "fifo"
    setup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.sharing not in LINK_SHARING:
            raise ValueError(f"sharing must be one of {LINK_SHARING}, got {self.sharing!r}")
        if self.setup_s < 0 or self.latency_s < 0:
            raise ValueError("setup_s and latency_s must be >= 0")

    def wire_s(self, tokens: int, prefill_s: float = 0.0) -> float:
        """Seconds of data on the wire, at the full bandwidth, after the prefill ends."""
        if self.bandwidth_bytes_per_s is None:
            return 0.0
        full = tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        if self.layerwise_overlap and self.num_layers > 1:
            hidden = prefill_s * (self.num_layers - 1) / self.num_layers
            full = max(full / self.num_layers, full - hidden)
        return full

    def transfer_s(self, tokens: int, prefill_s: float = 0.0) -> float:
        """Seconds after the prefill ends for ``tokens`` tokens of KV on an idle link."""
        return self.setup_s + self.wire_s(tokens, prefill_s) + self.latency_s


class _Req:
    """Simulator-internal state of one request."""

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


class _Plan:
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


_J = np.arange(1, _MAX_PLAN_STEPS + 1, dtype=float)
_JJ = _J * (_J - 1) * 0.5


def _steps(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Views of j = 1..k and j(j−1)/2 as floats (cached; :func:`_series` computes the same values)."""
    global _J, _JJ
    if k > len(_J):
        _J = np.arange(1, k + 1, dtype=float)
        _JJ = _J * (_J - 1) * 0.5
    return _J[:k], _JJ[:k]


class _Batch:
    __slots__ = ("prefill", "decodes", "ends", "start", "valid", "n_steps", "duration", "plan", "end")

    def __init__(self, prefill: list[tuple[_Req, int]], decodes: list[_Req], start: float,
                 ends: np.ndarray | None, duration: float, plan: _Plan | None = None, n_steps: int = 1):
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


class _PrefixLRU:
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
        self._affine = _has_affine(spec.latency)
        self._plain_vllm = spec.scheduler == "vllm" or self.role == "prefill"
        self.prefix_cache: _PrefixLRU | None = None
        self.block_tokens = spec.prefix_block_tokens
        self.hit_tokens = 0
        self.prompt_tokens_seen = 0
        if spec.prefix_caching and self.role != "decode":
            self.prefix_cache = _PrefixLRU(max(1, self.capacity // self.block_tokens))
        self.cpu_peers: list[Instance] = []      # other instances of the same cpu_group (set by the simulator)
        self._counted_busy = False               # busy as seen by cpu_peers

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
            if b.n_steps > 1 and b.end > now:
                keep = b.steps_done_before(now) + 1
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
        if b.plan is not None:
            nb = _Batch(b.prefill, b.decodes, b.start, None, b.plan.elapsed(keep), b.plan, keep)
        else:
            nb = _Batch(b.prefill, b.decodes, b.start, b.ends[:keep], float(b.ends[keep - 1] - b.start))
        self.busy_s -= b.duration - nb.duration
        self.inflight[0] = nb
        self.stage_free_at = nb.end
        self.sim._push(nb.end, _DONE, self, nb)

    # -- CPU sharing --------------------------------------------------------------------------------
    def _slowdown(self) -> float:
        """Iteration-time factor from busy instances that share this one's CPU cores."""
        busy = sum(1 for p in self.cpu_peers if p._counted_busy)
        return 1.0 + self.spec.cpu_contention * busy

    def _busy_changed(self, now: float) -> None:
        """This instance started or stopped working: re-plan the peers' multi-step decode runs."""
        for p in self.cpu_peers:
            if p.inflight and p.pp == 1:
                p.wake(now)

    # -- scheduling -------------------------------------------------------------------------------
    def try_schedule(self, now: float) -> None:
        while len(self.inflight) < self.pp and self.stage_free_at <= now + 1e-12:
            b = self._form_batch(now)
            if b is None:
                break
            self.inflight.append(b)
            self.iterations += b.n_steps
            self.busy_s += b.duration
            if self.pp == 1:
                self.stage_free_at = b.end
                self.sim._push(b.end, _DONE, self, b)
            else:
                self.stage_free_at = now + b.duration / self.pp
                self.sim._push(b.end, _DONE, self, b)
                self.sim._push(self.stage_free_at, _STAGE, self, None)
                break
        if self.cpu_peers and self.inflight and not self._counted_busy:
            self._counted_busy = True
            self._busy_changed(now)

    def _fail(self, r: _Req, now: float, why: str) -> None:
        r.error = why
        r.finish = None
        self.sim._finished(r, now)

    def cached_prefix_tokens(self, r: _Req) -> int:
        """Tokens of ``r``'s prompt found in this instance's prefix cache (no side effects)."""
        cache = self.prefix_cache
        if cache is None or not r.req.hash_ids:
            return 0
        return max(0, min(cache.match(r.req.hash_ids) * self.block_tokens, r.target - 1))

    def _admit_prefills(self, now: float, budget: int, max_new: int) -> list[tuple[_Req, int]]:
        """FCFS admission from ``waiting``: KV for the whole prefill target must fit. With prefix
        caching the prefill starts after the cached prefix."""
        items: list[tuple[_Req, int]] = []
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
            cached = self.cached_prefix_tokens(r) if cache is not None else 0
            todo = target - cached
            chunk = todo if plain else min(todo, budget)
            if items and chunk > budget:
                break
            waiting.popleft()
            if cache is not None and r.req.hash_ids:
                cache.insert(r.req.hash_ids)
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

    def _admit_decodes(self, free_decodes: list[_Req]) -> None:
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
            free_decodes.append(r)

    def _form_batch(self, now: float) -> _Batch | None:
        spec = self.spec
        role = self.role
        free_decodes = [r for r in self.running if not r.busy] if self.pp > 1 else list(self.running)
        prefill: list[tuple[_Req, int]] = []
        decodes: list[_Req] = []
        if role == "decode":
            if self.swapped or self.waiting:
                self._admit_decodes(free_decodes)
            decodes = self._ensure_decode_room(now, free_decodes) if free_decodes else free_decodes
        elif role == "prefill" or spec.scheduler == "vllm":
            max_new = spec.max_num_seqs - len(self.running) if role == "colocated" else spec.max_num_seqs
            if self.waiting:
                prefill = self._admit_prefills(now, spec.max_batched_tokens, max_new)
            if not prefill and role == "colocated" and free_decodes:
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
        slow = self._slowdown() if self.cpu_peers else 1.0
        n_dec = len(decodes)
        if prefill:
            p_tokens = 0
            p_sq = 0
            for r, c in prefill:
                r.busy = True
                p_tokens += c
                p_sq += c * (2 * r.prefilled + c)
            ctx = 0
            for r in decodes:
                ctx += r.kv
                r.kv += 1
                r.busy = True
            self.kv_used += n_dec
            t = self.latency.step_time_s(p_tokens, float(p_sq), n_dec, ctx)
            return _Batch(prefill, decodes, now, None, t * slow if slow != 1.0 else t)
        # pure decode: plan several steps when nothing else can join until a request finishes
        ctx = 0
        k = 1
        if self.pp == 1:
            remaining = _MAX_PLAN_STEPS
            for r in decodes:
                ctx += r.kv
                left = r.output - r.generated
                if left < remaining:
                    remaining = left
            room = (self.capacity - self.kv_used) // n_dec
            k = max(1, min(remaining, room))
        else:
            for r in decodes:
                ctx += r.kv
        for r in decodes:
            r.kv += k
            r.busy = True
        self.kv_used += k * n_dec
        if k == 1:
            t = self.latency.step_time_s(0, 0.0, n_dec, ctx)
            return _Batch([], decodes, now, None, t * slow if slow != 1.0 else t)
        if self._affine:
            plan = _Plan(self.latency.decode_affine(n_dec), ctx, n_dec, k, slow)
            return _Batch([], decodes, now, None, plan.elapsed(k), plan, k)
        steps = self.latency.decode_times_s(n_dec, ctx + n_dec * np.arange(k))
        if slow != 1.0:
            steps = steps * slow
        ends = now + np.cumsum(steps)
        return _Batch([], decodes, now, ends, float(ends[-1] - now))

    # -- completion -------------------------------------------------------------------------------
    def complete(self, b: _Batch, now: float) -> None:
        if not b.valid:
            return
        inflight = self.inflight
        if inflight[0] is b:
            del inflight[0]
        else:
            inflight.remove(b)
        sim = self.sim
        k = b.n_steps
        record = sim.record_token_times
        times = b.step_ends() if record and k > 1 else None
        for r in b.decodes:
            r.busy = False
            if r.finish is not None or r.error:
                continue
            r.generated += k
            if record:
                if times is not None:
                    r.times.frombytes(times.tobytes())
                else:
                    r.times.append(now)
            if r.generated >= r.output:
                self._release(r)
                self.running.remove(r)
                r.finish = now
                sim._finished(r, now)
        if b.prefill:
            self._complete_prefill(b, now)
        if self.role == "decode":
            sim._start_pulls(self, now)
        self.try_schedule(now)
        if self.cpu_peers and not self.inflight and self._counted_busy:
            self._counted_busy = False
            self._busy_changed(now)

    def _complete_prefill(self, b: _Batch, now: float) -> None:
        sim = self.sim
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

    def _release(self, r: _Req) -> None:
        self.kv_used -= r.kv
        r.kv = 0

    def hand_over_kv(self, r: _Req, now: float) -> None:
        """The KV of ``r`` has left this (prefill) instance; ``r.kv`` now counts on the receiver."""
        self.kv_used -= r.kv
        self.wake(now)


_ARRIVAL, _DONE, _STAGE, _XFER, _LINK, _JOIN = 0, 1, 2, 3, 4, 5


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
    supported. Deterministic: same requests, same result.
    """

    record_token_times = True
    link: KVLink | None = None
    #: Subclasses that route between a colocated pool and a P/D pool set this (the event loop sends
    #: arrivals to colocated and prefill instances alike, and prefilled requests on to decode).
    mixed_roles: bool = False

    def __init__(self, specs: Sequence[InstanceSpec], *, dispatch: str | DispatchPolicy = "round_robin",
                 decode_dispatch: str | DispatchPolicy = "least_loaded", link: KVLink | None = None,
                 record_token_times: bool = True):
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
        """Decode instances pull KV (DistServe §4.3) when they have room, first come first served
        (see ``InstanceSpec.handoff_reservation``)."""
        q = self._pending_pulls[dst.name]
        mode = dst.spec.handoff_reservation
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
            if mode == "none":
                r.staged = True         # lands in host memory; GPU room is taken when it joins the batch
            else:
                if dst.kv_used + need > dst.capacity:
                    return
                if mode == "vllm" and len(dst.running) >= dst.spec.max_num_seqs:
                    return
                dst.queued_tokens -= need
                dst.kv_used += need
            q.popleft()
            self._start_transfer(src, r, need, now)

    def _start_transfer(self, src: Instance, r: _Req, tokens: int, now: float) -> None:
        link = self.link
        if link is None:
            r.xfer_start = r.xfer_end = now
            self._push(now, _XFER, src, r)
            return
        if link.sharing == "fifo":
            start = max(now, self._link_free[src.name])
            end = start + link.transfer_s(tokens, r.last_prefill_s)
            self._link_free[src.name] = end
            r.xfer_start, r.xfer_end = start, end
            self._push(end, _XFER, src, r)
            return
        r.xfer_start = now
        work = link.wire_s(tokens, r.last_prefill_s)
        if link.setup_s > 0:
            self._push(now + link.setup_s, _JOIN, src, (r, work))
        else:
            self._join_link(src, r, work, now)

    def _join_link(self, src: Instance, r: _Req, work: float, now: float) -> None:
        sl = self._shared[src.name]
        sl.advance(now)
        sl.seq += 1
        heapq.heappush(sl.heap, (sl.v + work, sl.seq, r))
        self._reschedule_link(src, sl)

    def _reschedule_link(self, src: Instance, sl: _SharedLink) -> None:
        sl.version += 1
        if sl.heap:
            self._push(sl.next_finish(), _LINK, src, sl.version)

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
            self._push(now + lat, _XFER, src, r)

    def _kv_arrived(self, src: Instance, r: _Req, now: float) -> None:
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
        """Simulate ``requests`` (sorted or not); every request ends finished or with an error."""
        import time

        t0 = time.perf_counter()
        self._heap: list = []
        self._seq = 0
        self._done = 0
        self.dispatch.reset()
        self.decode_dispatch.reset()
        self.instances: list[Instance] = self._build_instances()
        self.front = [i for i in self.instances if i.role in ("colocated", "prefill")]
        self.decode = [i for i in self.instances if i.role == "decode"]
        self._pending_pulls = {i.name: deque() for i in self.decode}
        self._link_free = {i.name: 0.0 for i in self.front}
        self._shared = {i.name: _SharedLink() for i in self.front}
        record = self.record_token_times
        states = [_Req(r, record) for r in requests]
        order = sorted(states, key=lambda s: (s.arrival, s.req.request_id))
        # arrivals are read from the sorted list, merged with the event heap by time (an arrival
        # goes first on equal times, as it would with the smaller sequence number)
        heap = self._heap
        front = self.front
        dispatch = self.dispatch
        pop = heapq.heappop
        n_arr = len(order)
        ai = 0
        now = 0.0
        horizon = float("inf") if horizon_s is None else horizon_s
        while True:
            if ai < n_arr and (not heap or order[ai].arrival <= heap[0][0]):
                a = order[ai]
                t = a.arrival
                if t > horizon:
                    break
                ai += 1
                now = t
                front[dispatch.choose(front, a, t)].enqueue(a, t)
                continue
            if not heap:
                break
            t, _, kind, a, b = pop(heap)
            if t > horizon:
                break
            now = t
            if kind == _DONE:
                a.complete(b, t)
            elif kind == _XFER:
                self._kv_arrived(a, b, t)
            elif kind == _STAGE:
                a.try_schedule(t)
            elif kind == _LINK:
                self._link_event(a, b, t)
            elif kind == _JOIN:
                self._join_link(a, b[0], b[1], t)
        records = [self._record(s) for s in states]
        infos = []
        for i in self.instances:
            info = {"name": i.name, "role": i.role, "tp": int(getattr(i.latency, "tp", 1)),
                    "pp": i.pp, "num_gpus": i.num_gpus, "kv_capacity_tokens": i.capacity,
                    "iterations": i.iterations, "busy_s": i.busy_s, "preemptions": i.preemptions}
            if i.prefix_cache is not None and type(i) is Instance:
                info["prefix_hit_tokens"] = i.hit_tokens
                info["prefix_hit_ratio"] = i.hit_tokens / i.prompt_tokens_seen if i.prompt_tokens_seen else 0.0
            infos.append(info)
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
