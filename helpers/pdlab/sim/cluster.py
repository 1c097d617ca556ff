"""From a deployment description to a simulator: the one builder every set-up goes through.

A :class:`ClusterSpec` (a deployment description) is pools of identical instances (:class:`PoolSpec`: role, count, GPU and
TP × PP, or an explicit latency model and KV capacity, and any other
:class:`~pdlab.sim.spec.InstanceSpec` setting), the model, and the KV link between prefill and
decode pools. :func:`build_cluster` turns it into a :class:`~pdlab.sim.engine.Simulator` (or a
subclass, e.g. the router's). Everything that simulates a cluster builds it here: the common modes
below (:func:`build_simulator`, :func:`simulate`, ``pdlab sim run``), DistServe's placement search
and Splitwise's pools (:mod:`pdlab.sched`), the router's simulation (:mod:`pdlab.router.sim`) and
the calibrated simulator of lab 05 (:func:`pdlab.simreal.replay.build_sim`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from pdlab.hardware import GPU, get_gpu, resolve_link_bandwidth
from pdlab.models import ModelConfig, get_model, kv_bytes_per_token
from pdlab.sim.dispatch import DispatchPolicy
from pdlab.sim.engine import InstanceSpec, KVLink, SimResult, Simulator
from pdlab.sim.latency import LatencyModel, kv_capacity_tokens, roofline_latency
from pdlab.workloads import Request

__all__ = ["MODES", "PoolSpec", "ClusterSpec", "build_cluster", "build_simulator", "simulate", "LatencyFactory",
           "split_settings"]

MODES = ("colocated", "chunked", "disaggregated")

#: ``factory(tp, pp) -> LatencyModel`` for one instance.
LatencyFactory = Callable[[int, int], LatencyModel]


@dataclass(frozen=True)
class PoolSpec:
    """``count`` identical instances of one ``role`` (``colocated``, ``prefill`` or ``decode``).

    Latency: ``latency`` (a model, or a ``factory(tp, pp)``), else the roofline of catalog ``gpu``
    serving the deployment's model. KV capacity: ``kv_capacity_tokens``, else what ``gpu``'s memory
    holds (:func:`pdlab.sim.latency.kv_capacity_tokens`). ``options``: any other
    :class:`InstanceSpec` field (``scheduler``, ``token_budget``, ``max_num_seqs``, …).
    """

    role: str
    count: int = 1
    gpu: str | GPU | None = None
    tp: int = 1
    pp: int = 1
    latency: LatencyModel | LatencyFactory | None = None
    kv_capacity_tokens: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSpec:
    """Pools of instances serving one model, and the KV link from prefill to decode pools.

    The link: ``link`` (a catalog link name, or a ready :class:`KVLink`) or
    ``link_bandwidth_bytes_per_s`` (neither: instantaneous), carrying ``model``'s KV per token in
    ``dtype``, with ``layerwise_overlap``, ``link_sharing`` and ``transfer_setup_s`` as in
    :class:`KVLink`. ``dispatch`` defaults to shortest queue with prefill pools (as DistServe), else
    round robin.
    """

    pools: Sequence[PoolSpec]
    model: str | ModelConfig | None = None
    dtype: str = "bf16"
    memory_utilization: float = 0.9
    link: str | KVLink | None = None
    link_bandwidth_bytes_per_s: float | None = None
    layerwise_overlap: bool = False
    link_sharing: str = "fifo"
    transfer_setup_s: float = 0.0
    dispatch: str | DispatchPolicy | None = None
    decode_dispatch: str | DispatchPolicy = "least_loaded"


def _instance_spec(d: ClusterSpec, pool: PoolSpec, model: ModelConfig | None) -> InstanceSpec:
    lat = pool.latency
    if lat is None:
        if pool.gpu is None or model is None:
            raise ValueError(f"a {pool.role} pool needs a latency model, or a gpu and the deployment's model")
        lat = roofline_latency(pool.gpu, model, tp=pool.tp, pp=pool.pp, dtype=d.dtype)
    elif not isinstance(lat, LatencyModel) and callable(lat):
        lat = lat(pool.tp, pool.pp)
    cap = pool.kv_capacity_tokens
    if cap is None:
        if pool.gpu is None or model is None:
            raise ValueError(f"a {pool.role} pool needs kv_capacity_tokens, or a gpu and the deployment's model")
        cap = kv_capacity_tokens(pool.gpu, model, pool.tp, pool.pp, dtype=d.dtype,
                                 memory_utilization=d.memory_utilization)
    return InstanceSpec(latency=lat, kv_capacity_tokens=cap, role=pool.role, **dict(pool.options))


def _kv_link(d: ClusterSpec, model: ModelConfig | None) -> KVLink | None:
    if isinstance(d.link, KVLink):
        if d.link_bandwidth_bytes_per_s is not None:
            raise ValueError("give a link or a bandwidth, not both")
        return d.link
    bw = resolve_link_bandwidth(d.link, d.link_bandwidth_bytes_per_s)
    if model is None:
        if bw is not None:
            raise ValueError("a link bandwidth needs the deployment's model (KV bytes per token)")
        return KVLink(1.0, None, sharing=d.link_sharing, setup_s=d.transfer_setup_s)
    return KVLink(kv_bytes_per_token(model, d.dtype), bw, model.num_layers, d.layerwise_overlap,
                  sharing=d.link_sharing, setup_s=d.transfer_setup_s)


def build_cluster(deployment: ClusterSpec, *, simulator: type[Simulator] = Simulator,
                  record_token_times: bool = True, **simulator_kwargs: Any) -> Simulator:
    """The simulator of ``deployment``: one instance per pool member, in pool order; the KV link
    when a pool prefills for others. ``simulator`` (a :class:`Simulator` subclass) gets
    ``simulator_kwargs`` besides the instances, dispatch, link and ``record_token_times``."""
    d = deployment
    for pool in d.pools:
        if pool.count < 0 or pool.tp < 1 or pool.pp < 1:
            raise ValueError(f"a {pool.role} pool needs count >= 0, tp >= 1 and pp >= 1")
    model = get_model(d.model) if isinstance(d.model, str) else d.model
    specs = [_instance_spec(d, pool, model) for pool in d.pools for _ in range(pool.count)]
    disaggregated = any(s.role == "prefill" for s in specs)
    link = _kv_link(d, model) if disaggregated else None
    dispatch = d.dispatch or ("shortest_queue" if disaggregated else "round_robin")
    return simulator(specs, dispatch=dispatch, decode_dispatch=d.decode_dispatch, link=link,
                     record_token_times=record_token_times, **simulator_kwargs)


#: InstanceSpec fields :func:`build_simulator` sets itself (from the mode, GPU, model and pool shape).
_DERIVED_INSTANCE_FIELDS = ("latency", "kv_capacity_tokens", "role", "name", "scheduler")
#: ClusterSpec fields :func:`build_simulator` sets itself.
_DERIVED_CLUSTER_FIELDS = ("pools", "model")


def split_settings(settings: Mapping[str, Any], caller: str = "build_simulator"
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keywords of a cluster builder, split into :class:`InstanceSpec` options (for
    :attr:`PoolSpec.options`) and :class:`ClusterSpec` fields; each class keeps its own defaults.
    ``cpu_contention`` > 0 puts every instance in one CPU group (``cpu_group="host"``). Unknown
    keywords raise ``TypeError`` naming ``caller``."""
    inst_names = {f.name for f in fields(InstanceSpec)} - set(_DERIVED_INSTANCE_FIELDS)
    cluster_names = {f.name for f in fields(ClusterSpec)} - set(_DERIVED_CLUSTER_FIELDS)
    unknown = sorted(set(settings) - inst_names - cluster_names)
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword(s) {', '.join(unknown)}; known: "
                        f"{', '.join(sorted(inst_names | cluster_names))}")
    options = {k: v for k, v in settings.items() if k in inst_names}
    if options.get("cpu_contention", 0.0) > 0:
        options.setdefault("cpu_group", "host")
    return options, {k: v for k, v in settings.items() if k in cluster_names}


def build_simulator(mode: str, gpu: str, model: str, *, instances: int = 1, prefill: int = 1, decode: int = 1,
                    tp: int = 1, pp: int = 1, decode_tp: int | None = None, decode_pp: int | None = None,
                    latency: LatencyFactory | None = None, record_token_times: bool = True,
                    **settings: Any) -> Simulator:
    """A simulator for ``mode`` = ``colocated`` (vLLM-style), ``chunked`` (Sarathi-Serve) or
    ``disaggregated`` (``prefill`` + ``decode`` instances, KV over ``link``).

    ``tp``/``pp`` are per instance (prefill instances in disaggregated mode; ``decode_tp`` and
    ``decode_pp`` default to them). ``latency`` builds each instance's model from (tp, pp); the
    default is :func:`~pdlab.sim.latency.roofline_latency` for the catalog GPU and model.

    ``settings``: any :class:`~pdlab.sim.spec.InstanceSpec` field for every instance
    (``token_budget``, ``max_num_seqs``, ``max_batched_tokens``, ``prefix_caching``,
    ``handoff_reservation``, ``cpu_contention`` …; ``cpu_contention`` > 0 puts every instance in one
    CPU group: an iteration is ``1 + cpu_contention · n`` times slower while ``n`` other instances
    are busy) and any :class:`ClusterSpec` field (``dtype``, ``memory_utilization``, ``link``,
    ``link_bandwidth_bytes_per_s``, ``layerwise_overlap``, ``link_sharing``, ``transfer_setup_s``,
    ``dispatch``, ``decode_dispatch``), each with that class's default. ``dispatch`` defaults to
    round robin (colocated) or shortest queue (prefill pool, as DistServe). Hand-off physics: see
    :mod:`pdlab.sim.engine`. For instances unlike each other, build :class:`PoolSpec` pools and call
    :func:`build_cluster`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    for name, value in (("instances", instances), ("prefill", prefill), ("decode", decode), ("tp", tp), ("pp", pp)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    options, cluster = split_settings(settings)
    g = get_gpu(gpu)
    if mode == "disaggregated":
        pools = [PoolSpec("prefill", prefill, g, tp, pp, latency, options=options),
                 PoolSpec("decode", decode, g, decode_tp or tp, decode_pp or pp, latency, options=options)]
    else:
        pools = [PoolSpec("colocated", instances, g, tp, pp, latency,
                          options={**options, "scheduler": "chunked" if mode == "chunked" else "vllm"})]
    return build_cluster(ClusterSpec(pools, model, **cluster), record_token_times=record_token_times)


def simulate(requests: Sequence[Request], mode: str, gpu: str, model: str, **kwargs: Any) -> SimResult:
    """Build a simulator with :func:`build_simulator` (same keywords) and run ``requests``."""
    horizon = kwargs.pop("horizon_s", None)
    return build_simulator(mode, gpu, model, **kwargs).run(requests, horizon_s=horizon)
