"""Batch schedulers of a simulated instance: which prefill chunks and decodes run in its next
iteration (vLLM's ``Scheduler``; Vidur's replica schedulers). A scheduler decides only that: the
instance (:class:`pdlab.sim.instance.Instance`) keeps the queues, costs the batch and runs it, and
KV memory is counted by its :class:`pdlab.sim.kvmanager.KVManager`.

Built in, by :attr:`pdlab.sim.spec.InstanceSpec.scheduler` name:

- ``"vllm"`` (:class:`ContinuousBatching`) — continuous batching as in vLLM without chunked
  prefill: an iteration either prefills admitted requests (decodes stall) or decodes all running
  requests. Prefill has priority. On a prefill instance: prefill-only batches (up to
  ``max_batched_tokens``).
- ``"chunked"`` (:class:`ChunkedPrefill`) — Sarathi-Serve stall-free batching (OSDI'24 Alg. 3):
  each iteration holds all running decodes, then ongoing prefill chunks, then new prompts, up to
  ``token_budget`` tokens.

A scheduler class lists the roles it schedules (:attr:`Scheduler.roles`); an instance whose role
is not among them gets the role's default: :class:`ContinuousBatching` on prefill instances,
:class:`DecodeOnly` on decode instances (decode-only batches of requests whose KV has arrived).

KV memory: a prompt is admitted only when KV for all of it fits; each decode step needs one more
token per request. When a step does not fit, the most recently admitted request is preempted
(vLLM's policy): on a colocated instance it is recomputed (its KV is dropped and it re-prefills
prompt + generated tokens); on a decode instance it is swapped out and resumes when memory frees
(swap time is not modelled). A request that cannot fit even alone fails with an error record.

A new scheduler is a subclass of :class:`Scheduler` with :meth:`Scheduler.form_batch`, registered
by name (:func:`register_scheduler`); ``InstanceSpec(scheduler=name)`` then selects it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pdlab.sim.state import Batch, SimRequest

if TYPE_CHECKING:
    from pdlab.sim.instance import Instance

__all__ = ["Scheduler", "ContinuousBatching", "ChunkedPrefill", "DecodeOnly", "register_scheduler",
           "scheduler_class", "scheduler_names", "make_scheduler"]


class Scheduler:
    """The batch scheduler of one instance. Subclasses implement :meth:`form_batch`; the methods
    below are the steps the built-in schedulers share (the running requests that can decode,
    admission of prompts, making room for decodes by preemption).

    Attributes read by the methods: ``inst`` (the :class:`~pdlab.sim.instance.Instance`), ``kv``
    (its :class:`~pdlab.sim.kvmanager.KVManager`), ``spec`` (its
    :class:`~pdlab.sim.spec.InstanceSpec`), and its queues ``waiting``, ``prefilling``,
    ``running`` and ``swapped`` (the instance's own containers)."""

    #: Roles this class schedules (others get the role's default, see :func:`make_scheduler`).
    roles: ClassVar[tuple[str, ...]] = ("colocated",)

    __slots__ = ("inst", "kv", "one_stage", "prefilling", "running", "spec", "swapped", "waiting")

    def __init__(self, inst: Instance):
        self.inst = inst
        self.one_stage = inst.pp == 1       # no pipeline stages: every running request can decode
        self.kv = inst.kv_manager
        self.spec = inst.spec
        self.waiting = inst.waiting
        self.prefilling = inst.prefilling
        self.running = inst.running
        self.swapped = inst.swapped

    def form_batch(self, now: float) -> Batch | None:
        """The instance's next iteration at ``now`` (costed by :meth:`Instance.prefill_batch` or
        :meth:`Instance.decode_batch`), or None when there is nothing to run. It may admit, fail and
        preempt requests."""
        raise NotImplementedError

    # -- steps shared by schedulers ------------------------------------------------------------------
    def decode_candidates(self) -> list[SimRequest]:
        """The running requests that can decode in the next batch (with pipeline stages, those not
        in a micro-batch in flight), in admission order, as a new list."""
        if self.one_stage:
            return list(self.running)
        return [r for r in self.running if not r.busy]

    def admit_prefills(self, now: float, budget: int, max_new: int, whole: bool) -> list[tuple[SimRequest, int]]:
        """First come first served from ``waiting``, at most ``max_new`` prompts and ``budget``
        tokens: ``(request, chunk)`` pairs. KV for the whole prefill target must fit. With prefix
        caching the prefill starts after the cached prefix. ``whole``: each prompt is prefilled in one
        chunk (the first one may exceed ``budget``); else the last one admitted is cut to the budget."""
        items: list[tuple[SimRequest, int]] = []
        waiting = self.waiting
        kv = self.kv
        inst = self.inst
        capacity = kv.capacity
        cache = kv.prefix_cache
        while waiting and budget > 0 and max_new > 0:
            r = waiting[0]
            target = r.target
            if target > capacity:
                waiting.popleft()
                inst.queued_tokens -= target
                inst.fail(r, now, f"prompt of {target} tokens exceeds the KV capacity of {inst.name} "
                                  f"({capacity} tokens)")
                continue
            if kv.used + target > capacity:
                break
            hash_ids = r.req.hash_ids
            cached = 0
            if cache is not None and hash_ids:      # kv.cached_prefix_tokens(r), written out
                blocks = cache.table
                for h in hash_ids:
                    if h not in blocks:
                        break
                    cached += 1
                cached *= kv.block_tokens
                if target - 1 < cached:
                    cached = target - 1
                if cached < 0:
                    cached = 0
            todo = target - cached
            chunk = budget if budget < todo and not whole else todo
            if items and chunk > budget:
                break
            waiting.popleft()
            inst.queued_tokens -= target
            kv.admit_prompt(r, cached)
            items.append((r, chunk))
            budget -= chunk
            max_new -= 1
        return items

    def ensure_decode_room(self, now: float, decodes: list[SimRequest]) -> list[SimRequest]:
        """Make room for one more token per decode in ``decodes`` (changed in place and returned):
        fail requests that can never fit, give back partial prefills, then preempt the most recently
        admitted running requests (:meth:`preempt`)."""
        kv = self.kv
        capacity = kv.capacity
        inst = self.inst
        while decodes and kv.used + len(decodes) > capacity:
            victim = decodes[-1]
            if victim.kv + 1 > capacity:
                decodes.pop()
                self.running.remove(victim)
                kv.release(victim)
                inst.fail(victim, now, f"context of {victim.prompt + victim.generated} tokens exceeds the KV "
                                       f"capacity of {inst.name} ({capacity} tokens)")
                continue
            idle_partial = [p for p in self.prefilling if not p.busy]
            if idle_partial:
                p = idle_partial[-1]
                self.prefilling.remove(p)
                self.requeue(p)
                continue
            decodes.pop()
            self.running.remove(victim)
            self.preempt(victim)
        return decodes

    def requeue(self, r: SimRequest) -> None:
        """Drop ``r``'s KV and put it first in ``waiting`` to prefill again (a preemption)."""
        self.kv.release(r)
        r.prefilled = 0
        r.preemptions += 1
        inst = self.inst
        inst.preemptions += 1
        self.waiting.appendleft(r)
        inst.queued_tokens += r.target

    def preempt(self, r: SimRequest) -> None:
        """Preempt the running request ``r`` (already out of ``running``) by recomputation: its KV is
        dropped and it prefills prompt + generated tokens again."""
        r.target = r.prompt + r.generated
        self.requeue(r)


class ContinuousBatching(Scheduler):
    """``"vllm"``: an iteration either prefills admitted prompts whole (decodes stall) or decodes
    every running request; prefill has priority. On a prefill instance, prefill-only batches."""

    roles = ("colocated", "prefill")
    __slots__ = ("_colocated",)

    def __init__(self, inst: Instance):
        super().__init__(inst)
        self._colocated = inst.role == "colocated"

    def form_batch(self, now: float) -> Batch | None:
        inst = self.inst
        spec = self.spec
        if self.waiting:
            max_new = spec.max_num_seqs - len(self.running) if self._colocated else spec.max_num_seqs
            prefill = self.admit_prefills(now, spec.max_batched_tokens, max_new, True)
            if prefill:
                return inst.prefill_batch(now, prefill, [])
        if not self._colocated:
            return None
        decodes = list(self.running) if self.one_stage else self.decode_candidates()
        if decodes and self.kv.used + len(decodes) > self.kv.capacity:     # (the room check's own condition)
            decodes = self.ensure_decode_room(now, decodes)
        return inst.decode_batch(now, decodes) if decodes else None


class ChunkedPrefill(Scheduler):
    """``"chunked"``: Sarathi-Serve stall-free batching — all running decodes, then chunks of the
    ongoing prefills, then new prompts, up to ``token_budget`` tokens per iteration."""

    roles = ("colocated",)
    __slots__ = ()

    def form_batch(self, now: float) -> Batch | None:
        decodes = list(self.running) if self.one_stage else self.decode_candidates()
        kv = self.kv
        if kv.used + len(decodes) > kv.capacity:      # (the room check's own condition)
            decodes = self.ensure_decode_room(now, decodes)
        if self.prefilling or self.waiting:
            prefill = self.chunked_prefills(now, self.spec.token_budget - len(decodes))
            if prefill:
                return self.inst.prefill_batch(now, prefill, decodes)
        return self.inst.decode_batch(now, decodes) if decodes else None

    def chunked_prefills(self, now: float, budget: int) -> list[tuple[SimRequest, int]]:
        """Chunks of the ongoing prefills, then new prompts, within ``budget`` tokens."""
        prefill: list[tuple[SimRequest, int]] = []
        prefilling = self.prefilling
        for r in prefilling:
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
            new = self.admit_prefills(now, budget, self.spec.max_num_seqs - len(self.running) - len(prefilling),
                                      False)
            if new:
                prefilling.extend([r for r, _ in new])
                prefill.extend(new)
        return prefill


class DecodeOnly(Scheduler):
    """A decode instance's batches: swapped-out requests first, then requests whose KV has arrived,
    all decoding together; a preempted request is swapped out (its KV leaves the GPU and comes
    back when memory frees)."""

    roles = ("decode",)
    __slots__ = ()

    def form_batch(self, now: float) -> Batch | None:
        decodes = list(self.running) if self.one_stage else self.decode_candidates()
        if self.swapped or self.waiting:
            self.admit_decodes(decodes)
        if decodes and self.kv.used + len(decodes) > self.kv.capacity:     # (the room check's own condition)
            decodes = self.ensure_decode_room(now, decodes)
        return self.inst.decode_batch(now, decodes) if decodes else None

    def admit_decodes(self, decodes: list[SimRequest]) -> None:
        """Swapped-out requests first, then requests whose KV arrived, up to ``max_num_seqs``
        running; each one admitted joins ``running`` and ``decodes``."""
        inst = self.inst
        spec = self.spec
        kv = self.kv
        capacity = kv.capacity
        running = self.running
        swapped = self.swapped
        while swapped and kv.used + swapped[0].kv + len(running) + 1 <= capacity \
                and len(running) < spec.max_num_seqs:
            r = swapped.popleft()
            kv.used += r.kv
            running.append(r)
            decodes.append(r)
        waiting = self.waiting
        while waiting and len(running) < spec.max_num_seqs:
            r = waiting[0]
            if r.staged:                # KV in host memory: needs GPU room now
                if kv.used + r.kv + len(running) + 1 > capacity:
                    break
                kv.used += r.kv
                inst.queued_tokens -= r.kv
                r.staged = False
            waiting.popleft()
            running.append(r)
            inst.admit_debt += spec.admit_overhead_s
            decodes.append(r)

    def preempt(self, r: SimRequest) -> None:
        """Swap ``r`` out: its KV leaves the GPU (its ``r.kv`` is kept for when it comes back)."""
        self.kv.used -= r.kv
        r.preemptions += 1
        self.inst.preemptions += 1
        self.swapped.appendleft(r)


_REGISTRY: dict[str, type[Scheduler]] = {"vllm": ContinuousBatching, "chunked": ChunkedPrefill}
_ROLE_DEFAULTS: dict[str, type[Scheduler]] = {"colocated": ContinuousBatching, "prefill": ContinuousBatching,
                                              "decode": DecodeOnly}


def register_scheduler(name: str, cls: type[Scheduler]) -> None:
    """Make ``cls`` (a :class:`Scheduler` subclass) the scheduler of ``InstanceSpec(scheduler=name)``;
    a name registered again gets the new class."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a scheduler name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise TypeError(f"scheduler {name!r} must be a subclass of pdlab.sim.schedulers.Scheduler, got {cls!r}")
    bad = [role for role in cls.roles if role not in _ROLE_DEFAULTS]
    if bad:
        raise ValueError(f"scheduler {name!r} lists unknown roles {bad}; roles are {tuple(_ROLE_DEFAULTS)}")
    _REGISTRY[name] = cls


def scheduler_names() -> tuple[str, ...]:
    """The registered scheduler names, built-in first."""
    return tuple(_REGISTRY)


def scheduler_class(name: str) -> type[Scheduler]:
    """The class registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; registered: {scheduler_names()} "
                         f"(add one with pdlab.sim.register_scheduler)") from None


def make_scheduler(inst: Instance) -> Scheduler:
    """The scheduler of ``inst``: its spec's class when that class schedules the instance's role,
    else the role's default (:class:`ContinuousBatching` for prefill, :class:`DecodeOnly` for decode)."""
    cls = scheduler_class(inst.spec.scheduler)
    if inst.role not in cls.roles:
        cls = _ROLE_DEFAULTS[inst.role]
    return cls(inst)
