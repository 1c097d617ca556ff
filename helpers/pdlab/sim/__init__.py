"""``pdlab.sim`` — a discrete-event simulator of LLM serving clusters.

Pieces, each replaceable:

- latency models (:mod:`pdlab.sim.latency`): roofline from the catalog, DistServe-style fitted,
  constant; anything with ``step_time_s(prefill_tokens, prefill_sq_tokens, decode_batch,
  decode_ctx_tokens)`` works;
- instances (:mod:`pdlab.sim.instance`, specs in :mod:`pdlab.sim.spec`, event loop and KV
  hand-off in :mod:`pdlab.sim.engine`), their batch schedulers (:mod:`pdlab.sim.schedulers`, a
  class per policy, registered by name: :func:`register_scheduler`) and KV memory
  (:mod:`pdlab.sim.kvmanager`): colocated vLLM-style continuous batching, Sarathi-Serve chunked
  prefill, prefill-only and decode-only instances, KV memory limit with preemption, TP and PP per
  instance, prefix caching, KV transfer over a link, and the hand-off physics of a live engine
  (decode-side KV reservation, fair link sharing, per-transfer setup cost, roles sharing CPU cores);
- dispatch policies (:mod:`pdlab.sim.dispatch`): round robin, shortest queue, least loaded;
- sources (:mod:`pdlab.sim.sources`): traces and synthetic Poisson / gamma arrivals;
- :func:`build_cluster` (:mod:`pdlab.sim.cluster`): the one builder from a deployment description
  (:class:`ClusterSpec` of :class:`PoolSpec` pools) to a simulator; :func:`simulate` /
  :func:`build_simulator` for the common set-ups.

The simulator returns :class:`pdlab.metrics.RequestRecord` objects, the same records the live
benchmark client produces, so ``pdlab.metrics`` analyses both.
"""

from pdlab.sim.cluster import MODES, ClusterSpec, PoolSpec, build_cluster, build_simulator, simulate
from pdlab.sim.dispatch import (
    DISPATCH_POLICIES,
    DispatchPolicy,
    LeastLoaded,
    RoundRobin,
    ShortestQueue,
    make_dispatch,
)
from pdlab.sim.engine import SimResult, Simulator
from pdlab.sim.latency import (
    ConstantLatency,
    FittedLatency,
    LatencyModel,
    RooflineLatency,
    fit_latency,
    kv_capacity_tokens,
    load_profile,
    roofline_latency,
    sample_points,
    save_profile,
)
from pdlab.sim.kvmanager import KVManager
from pdlab.sim.schedulers import (
    ChunkedPrefill,
    ContinuousBatching,
    DecodeOnly,
    Scheduler,
    register_scheduler,
    scheduler_names,
)
from pdlab.sim.sources import GammaSource, ListSource, PoissonSource, Source, TraceSource
from pdlab.sim.spec import HANDOFF_RESERVATIONS, LINK_SHARING, InstanceSpec, KVLink
from pdlab.sim.state import SimRequest

__all__ = [
    "MODES", "ClusterSpec", "PoolSpec", "build_cluster", "build_simulator", "simulate",
    "DispatchPolicy", "RoundRobin", "ShortestQueue", "LeastLoaded", "DISPATCH_POLICIES", "make_dispatch",
    "InstanceSpec", "KVLink", "SimResult", "Simulator", "SimRequest", "HANDOFF_RESERVATIONS", "LINK_SHARING",
    "LatencyModel", "RooflineLatency", "FittedLatency", "ConstantLatency", "roofline_latency", "fit_latency",
    "sample_points", "load_profile", "save_profile", "kv_capacity_tokens",
    "Source", "TraceSource", "PoissonSource", "GammaSource", "ListSource",
    "Scheduler", "ContinuousBatching", "ChunkedPrefill", "DecodeOnly", "register_scheduler", "scheduler_names",
    "KVManager",
]
