"""The router's policies inside the simulator: a cluster with a colocated pool *and* a P/D pair.

:class:`RoutedSimulator` composes with :mod:`pdlab.sim` without changing it:

- it accepts colocated, prefill and decode instances in one cluster (the base class refuses the
  mix; its event loop handles it: arrivals go to the "front" instances — colocated and prefill —
  and prefilled requests on to the decode pool);
- :class:`RouterDispatch` is the arrival dispatch policy: it predicts the output length, reads the
  load of every instance, asks the routing policy for a target and picks, inside that pool, the
  instance with the fewest queued prefill tokens (decode instances are chosen later by the
  simulator's decode dispatch, least loaded);
- finished requests feed the output predictor (:meth:`RoutedSimulator.on_request_finished`);
- optional **prefix caching** is the engine's own (``InstanceSpec.prefix_caching``: an LRU of
  prefix blocks per colocated or prefill instance, filled on admission). The KV is still held in
  full and transferred in full (vLLM's NIXL decode side could skip blocks it caches itself; not
  modelled).

It uses only the engine's public extension points: ``Simulator.mixed_roles``, the dispatch
policy, the ``on_request_finished`` hook and the per-spec prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pdlab.hardware import get_gpu
from pdlab.kvcache import BLOCK_TOKENS
from pdlab.router.policies import (
    LoadEstimator,
    OutputPredictor,
    RouteRequest,
    RoutingPolicy,
    TargetLoad,
    make_policy,
    make_predictor,
)
from pdlab.sim.cluster import ClusterSpec, PoolSpec, build_cluster, split_settings
from pdlab.sim.dispatch import DispatchPolicy
from pdlab.sim.engine import Instance, InstanceSpec, KVLink, SimResult, Simulator
from pdlab.sim.state import SimRequest
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

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
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


class RoutedSimulator(Simulator):
    """A :class:`pdlab.sim.Simulator` that allows colocated + prefill + decode instances together,
    routes arrivals with a :class:`RouterDispatch`, and can model prefix caching."""

    mixed_roles = True

    def __init__(self, specs: Sequence[InstanceSpec], *, dispatch: RouterDispatch | DispatchPolicy | str,
                 decode_dispatch: str | DispatchPolicy = "least_loaded", link: KVLink | None = None,
                 record_token_times: bool = True, prefix_caching: bool = False,
                 block_tokens: int = BLOCK_TOKENS):
        if prefix_caching:
            specs = [replace(s, prefix_caching=True, prefix_block_tokens=block_tokens) for s in specs]
        super().__init__(specs, dispatch=dispatch, decode_dispatch=decode_dispatch, link=link,
                         record_token_times=record_token_times)
        self.prefix_caching = prefix_caching
        self.block_tokens = block_tokens
        if isinstance(self.dispatch, RouterDispatch):
            self.dispatch.sim = self

    def on_request_finished(self, r: SimRequest, now: float) -> None:
        super().on_request_finished(r, now)
        if isinstance(self.dispatch, RouterDispatch) and r.finish is not None and not r.error:
            self.dispatch.predictor.observe(r.prompt, r.output, self.dispatch.key(r.req))

    def run(self, requests: Sequence[Request], *, horizon_s: float | None = None) -> SimResult:
        res = super().run(requests, horizon_s=horizon_s)
        if isinstance(self.dispatch, RouterDispatch):
            for rec in res.records:
                rec.extra["route"] = self.dispatch.routes.get(rec.request_id, "")
        return res


def build_routed_simulator(gpu: str, model: str, *, colocated: int = 1, prefill: int = 1, decode: int = 1,
                           tp: int = 1, policy: RoutingPolicy | str = "threshold",
                           predictor: OutputPredictor | str = "constant", latency: Any = None,
                           prefix_caching: bool = False, record_token_times: bool = False,
                           policy_options: Mapping[str, Any] | None = None, **settings: Any) -> RoutedSimulator:
    """A routed cluster of ``colocated`` colocated instances plus ``prefill`` + ``decode`` instances,
    each of ``tp`` GPUs of catalog type ``gpu`` serving catalog ``model`` (roofline latency unless a
    ``latency(tp, pp)`` factory is given). With ``prefill = decode = 0`` it is a monolithic colocated
    cluster; with ``colocated = 0`` a monolithic disaggregated one. ``policy_options`` go to the
    routing policy's class when ``policy`` is a name.

    ``settings``: any :class:`~pdlab.sim.spec.InstanceSpec` field for every instance
    (``max_num_seqs``, ``max_batched_tokens`` …) and any :class:`~pdlab.sim.cluster.ClusterSpec`
    field (``link``, a catalog name, or ``link_bandwidth_bytes_per_s``: KV is instant if neither;
    ``dtype``, ``memory_utilization`` …), each with that class's default (as
    :func:`pdlab.sim.build_simulator`)."""
    if colocated < 0 or prefill < 0 or decode < 0 or colocated + prefill + decode == 0:
        raise ValueError("need at least one instance (counts must be >= 0)")
    options, cluster_fields = split_settings(settings, "build_routed_simulator")
    if "dispatch" not in cluster_fields:
        cluster_fields["dispatch"] = RouterDispatch(policy, predictor, **dict(policy_options or {}))
    g = get_gpu(gpu)
    pools = [PoolSpec(role, n, g, tp, 1, latency, options=options)
             for role, n in (("colocated", colocated), ("prefill", prefill), ("decode", decode))]
    cluster = ClusterSpec(pools, model, **cluster_fields)
    return build_cluster(cluster, simulator=RoutedSimulator, record_token_times=record_token_times,
                         prefix_caching=prefix_caching)


def simulate_routed(requests: Sequence[Request], gpu: str, model: str, **kwargs: Any) -> SimResult:
    """:func:`build_routed_simulator` (same keywords) and run ``requests``."""
    horizon = kwargs.pop("horizon_s", None)
    return build_routed_simulator(gpu, model, **kwargs).run(requests, horizon_s=horizon)
