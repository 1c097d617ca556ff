"""The router's policies inside the simulator: a cluster with a colocated pool *and* a P/D pair.

:class:`RoutedSimulator` composes with :mod:`pdlab.sim` without changing it:

- it accepts colocated, prefill and decode instances in one cluster (the base class refuses the
  mix; its event loop handles it: arrivals go to the "front" instances — colocated and prefill —
  and prefilled requests on to the decode pool);
- :class:`RouterDispatch` is the arrival dispatch policy: it predicts the output length, reads the
  load of every instance, asks the routing policy for a target and picks, inside that pool, the
  instance with the fewest queued prefill tokens (decode instances are chosen later by the
  simulator's decode dispatch, least loaded);
- finished requests feed the output predictor (:meth:`RoutedSimulator._finished`);
- optional **prefix caching** (vLLM's automatic prefix caching): each colocated or prefill
  instance keeps an LRU of 512-token prefix blocks (:class:`pdlab.kvcache.LRUBlockCache`, as many
  blocks as its KV capacity holds), and a prompt whose leading blocks are cached starts its
  prefill after them (at least one token is always computed). The KV is still held in full and
  transferred in full (vLLM's NIXL decode side could skip blocks it caches itself; not modelled).

Hooks this needed (described in the issue report; not in :mod:`pdlab.sim` yet): an instance
factory on :class:`pdlab.sim.Simulator` and a prefix cache in the engine. Until they exist, the
instances are given the caching behaviour right after the base class creates them (the
``instances`` attribute setter below), and :class:`_PrefixCachingInstance` re-implements the
admission step ``Instance._admit_prefills`` with hits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from pdlab.hardware import get_gpu, resolve_link_bandwidth
from pdlab.kvcache import BLOCK_TOKENS, LRUBlockCache
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.router.policies import (
    LoadEstimator,
    OutputPredictor,
    RouteRequest,
    RoutingPolicy,
    TargetLoad,
    make_policy,
    make_predictor,
)
from pdlab.sim.dispatch import DispatchPolicy, make_dispatch
from pdlab.sim.engine import Instance, InstanceSpec, KVLink, SimResult, Simulator
from pdlab.sim.latency import kv_capacity_tokens, roofline_latency
from pdlab.workloads import Request

__all__ = ["RouterDispatch", "RoutedSimulator", "build_routed_simulator", "simulate_routed", "first_block_key"]


def first_block_key(request: Any) -> Hashable | None:
    """The first prefix block's hash: requests that share it share a system prompt (same agent)."""
    ids = getattr(request, "hash_ids", ())
    return ids[0] if ids else None


def _load(inst: Instance) -> TargetLoad:
    waiting = list(inst.waiting) + [r for r in inst.prefilling]
    return TargetLoad(queued_prefill_tokens=float(inst.queued_tokens),
                      queued_prefill_sq_tokens=float(sum(r.target * r.target for r in waiting)),
                      decode_batch=inst.num_running, decode_ctx_tokens=float(inst.kv_used))


class RouterDispatch(DispatchPolicy):
    """Arrival dispatch for :class:`RoutedSimulator`: routing policy first, then shortest queue in the pool.

    ``key`` maps a request to the predictor's key (default: its first prefix block). Decisions
    are counted in :attr:`decisions` and recorded per request id in :attr:`routes`.
    """

    name = "router"

    def __init__(self, policy: RoutingPolicy | str, predictor: OutputPredictor | str = "constant", *,
                 key: Callable[[Any], Hashable | None] = first_block_key, **policy_kwargs: Any):
        self.policy = make_policy(policy, **policy_kwargs)
        self.predictor = make_predictor(predictor)
        self.key = key
        self.sim: RoutedSimulator | None = None
        self.decisions = {"colocated": 0, "disaggregated": 0}
        self.routes: dict[Any, str] = {}

    def reset(self) -> None:
        self.decisions = {"colocated": 0, "disaggregated": 0}
        self.routes = {}
        self.predictor.reset()

    @staticmethod
    def _shortest(pool: Sequence[Instance]) -> Instance:
        return min(pool, key=lambda i: (i.queued_tokens, i.queue_len, i.num_running))

    def choose(self, instances: Sequence[Any], request: Any, now: float) -> int:
        req = request.req
        key = self.key(req)
        rr = RouteRequest(req.prompt_tokens, self.predictor.predict(req.prompt_tokens, key), key)
        coloc = [i for i in instances if i.role == "colocated"]
        prefill = [i for i in instances if i.role == "prefill"]
        decode = list(self.sim.decode) if self.sim is not None else []
        pools = {"colocated": coloc, "disaggregated": prefill}
        estimates = None
        if self.policy.needs_estimates and coloc and prefill and decode:
            c, p = self._shortest(coloc), self._shortest(prefill)
            d = min(decode, key=lambda i: (i.load_fraction, i.num_running))
            link = self.sim.link if self.sim is not None else None
            est = LoadEstimator(c.latency, p.latency, d.latency,
                                transfer_s=(lambda n: link.transfer_s(n)) if link is not None else None)
            estimates = {"colocated": est.colocated(rr, _load(c)),
                         "disaggregated": est.disaggregated(rr, _load(p), _load(d))}
        target = self.policy.decide(rr, estimates)
        if not pools.get(target):  # the cluster lacks that pool: use the other
            target = "colocated" if coloc else "disaggregated"
        self.decisions[target] += 1
        self.routes[req.request_id] = target
        chosen = self._shortest(pools[target])
        return next(i for i, inst in enumerate(instances) if inst is chosen)


class _PrefixCachingInstance(Instance):
    """An :class:`~pdlab.sim.engine.Instance` with vLLM-style automatic prefix caching."""

    prefix_cache: LRUBlockCache
    block_tokens: int = BLOCK_TOKENS
    hit_tokens: int = 0
    prompt_tokens_seen: int = 0

    def _hit(self, r: Any) -> int:
        ids = r.req.hash_ids
        if not ids:
            return 0
        hits = self.prefix_cache.match(ids)
        self.prefix_cache.insert(ids)
        tokens = min(hits * self.block_tokens, r.target - 1)
        self.hit_tokens += tokens
        self.prompt_tokens_seen += r.target
        return max(0, tokens)

    def _admit_prefills(self, now: float, budget: int, max_new: int) -> list:
        """As the base class (FCFS, the whole prompt's KV must fit), but the prefill starts after
        the cached prefix."""
        items: list = []
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
            cached = self._hit(r) if self.role != "decode" else 0
            todo = r.target - cached
            chunk = todo if self.spec.scheduler == "vllm" or self.role == "prefill" else min(todo, budget)
            if items and chunk > budget:
                break
            self.waiting.popleft()
            self.queued_tokens -= r.target
            self.kv_used += r.target
            r.kv = r.target
            r.prefilled = cached
            items.append((r, chunk))
            budget -= chunk
            max_new -= 1
        return items


class RoutedSimulator(Simulator):
    """A :class:`pdlab.sim.Simulator` that allows colocated + prefill + decode instances together,
    routes arrivals with a :class:`RouterDispatch`, and can model prefix caching."""

    def __init__(self, specs: Sequence[InstanceSpec], *, dispatch: RouterDispatch | DispatchPolicy | str,
                 decode_dispatch: str | DispatchPolicy = "least_loaded", link: KVLink | None = None,
                 record_token_times: bool = True, prefix_caching: bool = False,
                 block_tokens: int = BLOCK_TOKENS):
        if not specs:
            raise ValueError("a cluster needs at least one instance")
        roles = {s.role for s in specs}
        if ("prefill" in roles) != ("decode" in roles):
            raise ValueError("prefill instances need decode instances beside them, and vice versa")
        self.specs = list(specs)
        self.dispatch = make_dispatch(dispatch)
        self.decode_dispatch = make_dispatch(decode_dispatch)
        self.link = link
        self.record_token_times = record_token_times
        self.prefix_caching = prefix_caching
        self.block_tokens = block_tokens
        if isinstance(self.dispatch, RouterDispatch):
            self.dispatch.sim = self

    # The base class's run() creates the instances, then assigns ``self.front`` (the colocated and
    # prefill instances): give those the prefix cache there (the instance-factory hook pdlab.sim lacks).
    @property
    def front(self) -> list[Instance]:
        return self._front

    @front.setter
    def front(self, value: list[Instance]) -> None:
        if self.prefix_caching:
            for inst in value:
                inst.__class__ = _PrefixCachingInstance
                inst.prefix_cache = LRUBlockCache(max(1, inst.capacity // self.block_tokens))
                inst.block_tokens = self.block_tokens
                inst.hit_tokens = 0
                inst.prompt_tokens_seen = 0
        self._front = value

    def _finished(self, r: Any, now: float) -> None:
        super()._finished(r, now)
        if isinstance(self.dispatch, RouterDispatch) and r.finish is not None and not r.error:
            self.dispatch.predictor.observe(r.prompt, r.output, self.dispatch.key(r.req))

    def run(self, requests: Sequence[Request], *, horizon_s: float | None = None) -> SimResult:
        res = super().run(requests, horizon_s=horizon_s)
        if isinstance(self.dispatch, RouterDispatch):
            for rec in res.records:
                rec.extra["route"] = self.dispatch.routes.get(rec.request_id, "")
        for info, inst in zip(res.instances, self.instances, strict=True):
            if isinstance(inst, _PrefixCachingInstance):
                info["prefix_hit_tokens"] = inst.hit_tokens
                info["prefix_hit_ratio"] = inst.hit_tokens / inst.prompt_tokens_seen if inst.prompt_tokens_seen else 0.0
        return res


def build_routed_simulator(gpu: str, model: str, *, colocated: int = 1, prefill: int = 1, decode: int = 1,
                           tp: int = 1, policy: RoutingPolicy | str = "threshold",
                           predictor: OutputPredictor | str = "constant", link: str | None = None,
                           link_bandwidth_bytes_per_s: float | None = None, prefix_caching: bool = False,
                           dtype: str = "bf16", memory_utilization: float = 0.9, max_num_seqs: int = 256,
                           max_batched_tokens: int = 16384, latency: Any = None, record_token_times: bool = False,
                           **policy_kwargs: Any) -> RoutedSimulator:
    """A routed cluster of ``colocated`` colocated instances plus ``prefill`` + ``decode`` instances,
    each of ``tp`` GPUs of catalog type ``gpu`` serving catalog ``model`` (roofline latency unless a
    ``latency(tp, pp)`` factory is given). With ``prefill = decode = 0`` it is a monolithic colocated
    cluster; with ``colocated = 0`` a monolithic disaggregated one. KV crosses ``link`` (catalog
    name) or ``link_bandwidth_bytes_per_s`` (instant if neither)."""
    g, m = get_gpu(gpu), get_model(model)
    if colocated < 0 or prefill < 0 or decode < 0 or colocated + prefill + decode == 0:
        raise ValueError("need at least one instance (counts must be >= 0)")
    factory = latency or (lambda t, p: roofline_latency(g, m, tp=t, pp=p, dtype=dtype))
    cap = kv_capacity_tokens(g, m, tp, 1, dtype=dtype, memory_utilization=memory_utilization)

    def spec(role: str) -> InstanceSpec:
        return InstanceSpec(latency=factory(tp, 1), kv_capacity_tokens=cap, role=role,
                            max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens)

    specs = [spec("colocated") for _ in range(colocated)] + [spec("prefill") for _ in range(prefill)] + \
        [spec("decode") for _ in range(decode)]
    bw = resolve_link_bandwidth(link, link_bandwidth_bytes_per_s)
    kv_link = KVLink(kv_bytes_per_token(m, dtype), bw, m.num_layers) if prefill else None
    dispatch = RouterDispatch(policy, predictor, **policy_kwargs)
    return RoutedSimulator(specs, dispatch=dispatch, link=kv_link, prefix_caching=prefix_caching,
                           record_token_times=record_token_times)


def simulate_routed(requests: Sequence[Request], gpu: str, model: str, **kwargs: Any) -> SimResult:
    """:func:`build_routed_simulator` (same keywords) and run ``requests``."""
    horizon = kwargs.pop("horizon_s", None)
    return build_routed_simulator(gpu, model, **kwargs).run(requests, horizon_s=horizon)
