"""Build common clusters from catalog names: colocated, chunked-prefill, or disaggregated pools.

:func:`build_simulator` turns ``mode`` + GPU + model + instance counts into a
:class:`~pdlab.sim.engine.Simulator` with roofline latency models (or any factory you pass), and
:func:`simulate` runs requests through it in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pdlab.hardware import get_gpu, get_link
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.sim.dispatch import DispatchPolicy
from pdlab.sim.engine import InstanceSpec, KVLink, SimResult, Simulator
from pdlab.sim.latency import LatencyModel, kv_capacity_tokens, roofline_latency
from pdlab.workloads import Request

__all__ = ["MODES", "build_simulator", "simulate", "LatencyFactory"]

MODES = ("colocated", "chunked", "disaggregated")

#: ``factory(tp, pp) -> LatencyModel`` for one instance.
LatencyFactory = Callable[[int, int], LatencyModel]


def build_simulator(mode: str, gpu: str, model: str, *, instances: int = 1, prefill: int = 1, decode: int = 1,
                    tp: int = 1, pp: int = 1, decode_tp: int | None = None, decode_pp: int | None = None,
                    latency: LatencyFactory | None = None, dtype: str = "bf16", memory_utilization: float = 0.9,
                    token_budget: int = 2048, max_num_seqs: int = 256, max_batched_tokens: int = 16384,
                    link: str | None = None, link_bandwidth_bytes_per_s: float | None = None,
                    layerwise_overlap: bool = False, dispatch: str | DispatchPolicy | None = None,
                    decode_dispatch: str | DispatchPolicy = "least_loaded",
                    record_token_times: bool = True, prefix_caching: bool = False,
                    handoff_reservation: str = "prompt", link_sharing: str = "fifo",
                    transfer_setup_s: float = 0.0, cpu_contention: float = 0.0) -> Simulator:
    """A simulator for ``mode`` = ``colocated`` (vLLM-style), ``chunked`` (Sarathi-Serve) or
    ``disaggregated`` (``prefill`` + ``decode`` instances, KV over ``link``).

    ``tp``/``pp`` are per instance (prefill instances in disaggregated mode; ``decode_tp`` and
    ``decode_pp`` default to them). ``latency`` builds each instance's model from (tp, pp); the
    default is :func:`~pdlab.sim.latency.roofline_latency` for the catalog GPU and model.
    ``dispatch`` defaults to round robin (colocated) or shortest queue (prefill pool, as DistServe).

    ``prefix_caching``: vLLM-style automatic prefix caching on colocated and prefill instances.
    Hand-off physics (see :mod:`pdlab.sim.engine`): ``handoff_reservation`` of decode instances
    (``prompt``, ``vllm``, ``none``), ``link_sharing`` (``fifo`` or ``fair``), ``transfer_setup_s``
    per KV transfer, and ``cpu_contention`` (> 0 puts every instance in one CPU group: an iteration
    is ``1 + cpu_contention · n`` times slower while ``n`` other instances are busy).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    g, m = get_gpu(gpu), get_model(model)
    factory = latency or (lambda t, p: roofline_latency(g, m, tp=t, pp=p, dtype=dtype))

    def spec(role: str, t: int, p: int, scheduler: str = "vllm") -> InstanceSpec:
        return InstanceSpec(latency=factory(t, p), role=role, scheduler=scheduler,
                            kv_capacity_tokens=kv_capacity_tokens(g, m, t, p, dtype=dtype,
                                                                  memory_utilization=memory_utilization),
                            token_budget=token_budget, max_num_seqs=max_num_seqs,
                            max_batched_tokens=max_batched_tokens, prefix_caching=prefix_caching,
                            handoff_reservation=handoff_reservation,
                            cpu_group="host" if cpu_contention > 0 else None, cpu_contention=cpu_contention)

    for name, value in (("instances", instances), ("prefill", prefill), ("decode", decode), ("tp", tp), ("pp", pp)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    kv_link = None
    if mode == "disaggregated":
        dtp, dpp = decode_tp or tp, decode_pp or pp
        specs = [spec("prefill", tp, pp) for _ in range(prefill)] + [spec("decode", dtp, dpp) for _ in range(decode)]
        bw = link_bandwidth_bytes_per_s
        if link is not None:
            if bw is not None:
                raise ValueError("give a link name or a bandwidth, not both")
            bw = get_link(link).bytes_per_s
        kv_link = KVLink(kv_bytes_per_token(m, dtype), bw, m.num_layers, layerwise_overlap,
                         sharing=link_sharing, setup_s=transfer_setup_s)
        dispatch = dispatch or "shortest_queue"
    else:
        specs = [spec("colocated", tp, pp, "chunked" if mode == "chunked" else "vllm") for _ in range(instances)]
        dispatch = dispatch or "round_robin"
    return Simulator(specs, dispatch=dispatch, decode_dispatch=decode_dispatch, link=kv_link,
                     record_token_times=record_token_times)


def simulate(requests: Sequence[Request], mode: str, gpu: str, model: str, **kwargs: Any) -> SimResult:
    """Build a simulator with :func:`build_simulator` (same keywords) and run ``requests``."""
    horizon = kwargs.pop("horizon_s", None)
    return build_simulator(mode, gpu, model, **kwargs).run(requests, horizon_s=horizon)
