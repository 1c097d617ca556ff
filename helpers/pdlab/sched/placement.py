"""DistServe's placement search (OSDI'24, arXiv 2401.09670v3 §4): pick TP/PP for the prefill and
decode pools and how many replicas of each, to maximise per-GPU goodput under SLOs.

- **Goodput of a configuration** = the highest request rate whose SLO attainment reaches the goal
  (e.g. 90%), found by binary search on the rate with the simulator (``pdlab.sim``).
- **Algorithm 1, high node affinity** (fast cross-node network): search prefill and decode
  configurations separately (each ≤ ``max_instance_gpus`` GPUs and holding the weights), keep the
  best goodput per GPU for each phase, then take n = ⌈R/goodput_p⌉ prefill and m = ⌈R/goodput_d⌉
  decode replicas (or, without a target rate R, the n, m that fill the cluster best).
- **Algorithm 2, low node affinity** (slow cross-node network, e.g. DistServe's 25 Gbps): for each
  pipeline depth, prefill and decode segments of the same stage share a node (KV moves over NVLink),
  so pairs (prefill instances, decode instances) with n_p·tp_p + n_d·tp_d ≤ M GPUs per node are
  simulated *together*; keep the best goodput per GPU and replicate the unit.

Beyond DistServe's released simulator, the decode-side simulations here include the **KV transfer**:
every request's KV crosses the cross-node link (Alg. 1) or NVLink (Alg. 2) before it decodes, on a
FIFO link per prefill instance; and the placement reports the cross-node bandwidth the chosen rate
needs and caps the rate to what the link carries.

Sweeps run in parallel on all local cores (``multiprocessing``); each task is deterministic.

**On a calibrated engine** (:func:`place_calibrated`): the engine is the one a calibration measured
(:class:`pdlab.simreal.calibration.Calibration`, one TP×PP, on one core or one GPU), so the search is
over deployments of at most N such engines: 1..N colocated replicas behind a dispatch policy and
every xPyD with x + y ≤ N, each simulated with the calibration's terms that carry to it
(:func:`pdlab.simreal.replay.carry`); it keeps the deployment with the highest goodput.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from pdlab.hardware import get_gpu
from pdlab.metrics import SLO, slo_attainment
from pdlab.models import ModelConfig, get_model, kv_bytes_per_token, weight_bytes
from pdlab.sim.cluster import ClusterSpec, PoolSpec, build_cluster
from pdlab.sim.latency import ConstantLatency, LatencyModel
from pdlab.workloads import Request, named_workload, read_mooncake_jsonl, with_rate

__all__ = [
    "ParallelConfig",
    "SearchSettings",
    "PhaseGoodput",
    "Placement",
    "SEARCH_PROFILES",
    "max_rate",
    "enumerate_configs",
    "prefill_goodput",
    "decode_goodput",
    "pair_goodput",
    "colocated_goodput",
    "SearchContext",
    "make_env",
    "resolve_model",
    "fits",
    "place_high_affinity",
    "place_low_affinity",
    "place",
    "workload_requests",
    "DeploymentGoodput",
    "CalibratedPlacement",
    "calibrated_deployments",
    "deployment_goodput",
    "place_calibrated",
]


@dataclass(frozen=True, order=True)
class ParallelConfig:
    """Tensor (intra-op) and pipeline (inter-op) parallelism of one instance."""

    tp: int
    pp: int

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    def __str__(self) -> str:
        return f"TP{self.tp}×PP{self.pp}"


@dataclass(frozen=True)
class SearchSettings:
    """How hard to search: requests per simulation, bisection steps, first rate guess (req/s)."""

    requests: int = 300
    bisect_steps: int = 7
    start_rate_rps: float = 1.0
    max_doublings: int = 12
    seed: int = 0
    min_duration_s: float = 60.0
    max_requests: int = 4000

    def requests_at(self, rate_rps: float) -> int:
        """Requests per simulation at a rate: at least ``requests``, and enough to span
        ``min_duration_s`` of arrivals (a short burst hides an overloaded queue), at most ``max_requests``."""
        return int(min(self.max_requests, max(self.requests, math.ceil(rate_rps * self.min_duration_s))))


#: Search sizes by course profile (``smoke`` seconds, ``ci`` about a minute, ``full`` the real thing).
SEARCH_PROFILES: dict[str, SearchSettings] = {
    "smoke": SearchSettings(requests=60, bisect_steps=3, min_duration_s=10.0, max_requests=300),
    "ci": SearchSettings(requests=120, bisect_steps=4, min_duration_s=30.0, max_requests=800),
    "full": SearchSettings(requests=300, bisect_steps=5, min_duration_s=60.0, max_requests=2000),
}


@dataclass
class PhaseGoodput:
    """The goodput one configuration reaches (requests/s at the attainment goal)."""

    phase: str
    prefill: ParallelConfig | None
    decode: ParallelConfig | None
    num_gpus: int
    goodput_rps: float
    per_gpu_goodput_rps: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Placement:
    """The chosen placement and the numbers behind it."""

    affinity: str
    prefill: ParallelConfig
    decode: ParallelConfig
    num_prefill: int
    num_decode: int
    prefill_goodput_rps: float
    decode_goodput_rps: float
    total_gpus: int
    cluster_goodput_rps: float
    per_gpu_goodput_rps: float
    kv_bandwidth_needed_bytes_per_s: float
    cross_node_bytes_per_s: float | None
    bandwidth_limited: bool
    candidates: list[PhaseGoodput] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    search_wall_s: float = 0.0

    def as_dict(self, with_candidates: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["prefill"] = {"tp": self.prefill.tp, "pp": self.prefill.pp}
        d["decode"] = {"tp": self.decode.tp, "pp": self.decode.pp}
        if not with_candidates:
            d.pop("candidates")
        return d


# ---------------------------------------------------------------------------------------------
# workload and binary search


def workload_requests(workload: str | Sequence[Request], n: int, rate_rps: float, seed: int = 0) -> list[Request]:
    """``n`` requests at ``rate_rps`` (Poisson): a named workload, a trace path (``*.jsonl``, lengths
    sampled from it), or a list of requests whose lengths are reused."""
    if isinstance(workload, str) and workload.endswith(".jsonl"):
        import numpy as np

        reqs = read_mooncake_jsonl(workload)
        idx = np.random.default_rng(seed + 1).integers(0, len(reqs), size=n)
        return with_rate([reqs[i] for i in idx], rate_rps, seed=seed)
    if isinstance(workload, str):
        return named_workload(workload, n, rate_rps, seed)
    base = list(workload)
    return with_rate([base[i % len(base)] for i in range(n)], rate_rps, seed=seed)


def max_rate(attainment_at: Callable[[float], float], goal: float, settings: SearchSettings) -> float:
    """Highest rate (req/s) with ``attainment_at(rate) >= goal``: double from the start rate until the
    goal fails, then bisect. 0.0 when even a low rate misses the goal."""
    lo, hi = 0.0, settings.start_rate_rps
    for _ in range(settings.max_doublings):
        if attainment_at(hi) >= goal:
            lo, hi = hi, hi * 2
        else:
            break
    else:
        return lo
    if lo == 0.0:   # the first guess failed: search downwards
        for _ in range(settings.max_doublings):
            hi_try = hi / 2
            if attainment_at(hi_try) >= goal:
                lo = hi_try
                break
            hi = hi_try
        else:
            return 0.0
    for _ in range(settings.bisect_steps):
        mid = (lo + hi) / 2
        if attainment_at(mid) >= goal:
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------------------------------------
# one configuration


def resolve_model(model: str | ModelConfig) -> ModelConfig:
    """A catalog name resolved to its :class:`~pdlab.models.ModelConfig` (a config is returned as is).

    >>> resolve_model("opt-13b").num_layers
    40
    """
    return get_model(model) if isinstance(model, str) else model


def fits(model: ModelConfig, gpu: str, cfg: ParallelConfig, *, dtype: str = "bf16",
         memory_utilization: float = 0.9, min_kv_tokens: int = 2048) -> bool:
    """The one fit rule: ``cfg``'s GPUs, at ``memory_utilization`` of their memory, hold the weights in
    ``dtype`` plus at least ``min_kv_tokens`` tokens of KV (DistServe: G.size/(inter·intra) < C).

    >>> fits(resolve_model("opt-66b"), "a100-80gb", ParallelConfig(1, 1))   # 131 GB of weights
    False
    >>> fits(resolve_model("opt-66b"), "a100-80gb", ParallelConfig(2, 1))
    True
    """
    room = cfg.num_gpus * get_gpu(gpu).memory_bytes * memory_utilization - weight_bytes(model, dtype)
    return room >= min_kv_tokens * kv_bytes_per_token(model, dtype)


@dataclass(frozen=True)
class SearchContext:
    """Everything one goodput search needs, picklable for worker processes: the resolved model, the
    GPU (catalog name), the workload, the SLOs (s), the attainment goal, the search size, the
    cross-node KV bandwidth (bytes/s; None: free), the dtype of weights and KV, the fraction of GPU
    memory the engine may use, the prefill token budget and an optional latency factory
    ``(tp, pp) → LatencyModel`` (default: the roofline). Build it with :func:`make_env`."""

    model: ModelConfig
    gpu: str
    workload: Any
    slo_ttft_s: float
    slo_tpot_s: float
    goal: float
    settings: SearchSettings
    cross_node_bytes_per_s: float | None = None
    dtype: str = "bf16"
    memory_utilization: float = 0.9
    max_batched_tokens: int = 2048
    latency: Callable[[int, int], LatencyModel] | None = None

    def requests(self, rate: float) -> list[Request]:
        """The search's requests at ``rate`` (req/s)."""
        return workload_requests(self.workload, self.settings.requests_at(rate), rate, self.settings.seed)

    def fits(self, cfg: ParallelConfig) -> bool:
        """:func:`fits` with this context's model, GPU, dtype and memory utilisation."""
        return fits(self.model, self.gpu, cfg, dtype=self.dtype, memory_utilization=self.memory_utilization)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of the model in the context's dtype."""
        return kv_bytes_per_token(self.model, self.dtype)


def _pool(env: SearchContext, role: str, cfg: ParallelConfig, count: int = 1, **options: Any) -> PoolSpec:
    """``count`` instances of ``cfg`` on the search's GPU (its latency factory, else the roofline)."""
    return PoolSpec(role, count, env.gpu, cfg.tp, cfg.pp, env.latency, options=options)


def _run(env: SearchContext, pools: list[PoolSpec], rate: float, slo: SLO, *, link_bytes_per_s: float | None = None,
         dispatch: str | None = None, requests: list[Request] | None = None) -> float:
    """SLO attainment of ``pools`` (:func:`pdlab.sim.build_cluster`) on the workload at ``rate``."""
    cluster = ClusterSpec(pools, env.model, env.dtype, memory_utilization=env.memory_utilization,
                          link_bandwidth_bytes_per_s=link_bytes_per_s, dispatch=dispatch)
    res = build_cluster(cluster, record_token_times=False).run(requests or env.requests(rate))
    return slo_attainment(res.records, slo)


def _attainment_prefill(env: SearchContext, cfg: ParallelConfig, rate: float) -> float:
    from dataclasses import replace

    reqs = [replace(r, output_tokens=1) for r in env.requests(rate)]
    return _run(env, [_pool(env, "colocated", cfg, max_batched_tokens=env.max_batched_tokens)], rate,
                SLO(ttft_s=env.slo_ttft_s), requests=reqs)


def _attainment_decode(env: SearchContext, cfg: ParallelConfig, rate: float) -> float:
    """One decode instance; an instant prefill instance in front; KV over the cross-node link."""
    front = PoolSpec("prefill", latency=ConstantLatency(0.0), kv_capacity_tokens=10**12,
                     options={"max_batched_tokens": 10**9, "max_num_seqs": 10**6})
    return _run(env, [front, _pool(env, "decode", cfg)], rate, SLO(tpot_s=env.slo_tpot_s),
                link_bytes_per_s=env.cross_node_bytes_per_s)


def _attainment_pair(env: SearchContext, pcfg: ParallelConfig, dcfg: ParallelConfig, n_p: int, n_d: int, rate: float) -> float:
    pools = [_pool(env, "prefill", pcfg, n_p, max_batched_tokens=env.max_batched_tokens),
             _pool(env, "decode", dcfg, n_d)]
    return _run(env, pools, rate, SLO(ttft_s=env.slo_ttft_s, tpot_s=env.slo_tpot_s),
                link_bytes_per_s=get_gpu(env.gpu).nvlink_bytes_per_s, dispatch="shortest_queue")


def _attainment_colocated(env: SearchContext, cfg: ParallelConfig, rate: float, scheduler: str) -> float:
    pool = _pool(env, "colocated", cfg, scheduler=scheduler, max_batched_tokens=max(env.max_batched_tokens, 16384))
    return _run(env, [pool], rate, SLO(ttft_s=env.slo_ttft_s, tpot_s=env.slo_tpot_s))


def colocated_goodput(env: SearchContext, cfg: ParallelConfig, scheduler: str = "vllm") -> PhaseGoodput:
    """The baseline: one colocated instance (vLLM-style or chunked) meeting both SLOs."""
    rate = max_rate(lambda r: _attainment_colocated(env, cfg, r, scheduler), env.goal, env.settings)
    return PhaseGoodput("colocated", cfg, cfg, cfg.num_gpus, rate, rate / cfg.num_gpus, {"scheduler": scheduler})


def make_env(model: str | ModelConfig, gpu: str, workload: Any, slo: SLO, *, attainment: float = 0.9,
             settings: SearchSettings | None = None, cross_node_bytes_per_s: float | None = None,
             latency: Callable[[int, int], LatencyModel] | None = None, dtype: str = "bf16",
             memory_utilization: float = 0.9) -> SearchContext:
    """The :class:`SearchContext` used by :func:`prefill_goodput`, :func:`decode_goodput`,
    :func:`pair_goodput`, :func:`colocated_goodput` (one-off measurements such as DistServe's Fig. 1)
    and the two placement algorithms. Both SLOs are needed; ``attainment`` is in (0, 1].

    >>> ctx = make_env("opt-13b", "a100-80gb", "fixed-512-64", SLO(ttft_s=0.4, tpot_s=0.06), dtype="fp8")
    >>> ctx.model.name, ctx.kv_bytes_per_token
    ('opt-13b', 409600)
    """
    if slo.ttft_s is None or slo.tpot_s is None:
        raise ValueError("placement needs both a TTFT and a TPOT SLO")
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment goal must be in (0, 1], got {attainment}")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    return SearchContext(resolve_model(model), gpu, workload, slo.ttft_s, slo.tpot_s, attainment,
                         settings or SEARCH_PROFILES["ci"], cross_node_bytes_per_s, dtype=dtype,
                         memory_utilization=memory_utilization, latency=latency)


def prefill_goodput(env: SearchContext, cfg: ParallelConfig) -> PhaseGoodput:
    """``simu_prefill``: the TTFT-only goodput of one prefill instance."""
    rate = max_rate(lambda r: _attainment_prefill(env, cfg, r), env.goal, env.settings)
    return PhaseGoodput("prefill", cfg, None, cfg.num_gpus, rate, rate / cfg.num_gpus)


def decode_goodput(env: SearchContext, cfg: ParallelConfig) -> PhaseGoodput:
    """``simu_decode``: the TPOT-only goodput of one decode instance, KV transfer included."""
    rate = max_rate(lambda r: _attainment_decode(env, cfg, r), env.goal, env.settings)
    return PhaseGoodput("decode", None, cfg, cfg.num_gpus, rate, rate / cfg.num_gpus)


def pair_goodput(env: SearchContext, pcfg: ParallelConfig, dcfg: ParallelConfig, n_p: int, n_d: int) -> PhaseGoodput:
    """Alg. 2: ``n_p`` prefill + ``n_d`` decode instances on the same nodes, simulated together."""
    gpus = n_p * pcfg.num_gpus + n_d * dcfg.num_gpus
    rate = max_rate(lambda r: _attainment_pair(env, pcfg, dcfg, n_p, n_d, r), env.goal, env.settings)
    return PhaseGoodput("pair", pcfg, dcfg, gpus, rate, rate / gpus, {"num_prefill": n_p, "num_decode": n_d})


def _run_task(task: tuple) -> PhaseGoodput:
    kind, env, *rest = task
    if kind == "prefill":
        return prefill_goodput(env, rest[0])
    if kind == "decode":
        return decode_goodput(env, rest[0])
    return pair_goodput(env, *rest)


def _map(tasks: list[tuple], workers: int | None) -> list[PhaseGoodput]:
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(tasks) <= 1:
        return [_run_task(t) for t in tasks]
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        return list(pool.map(_run_task, tasks))


# ---------------------------------------------------------------------------------------------
# the two algorithms


def enumerate_configs(model: str | ModelConfig, gpu: str, max_gpus: int, *, max_tp: int, dtype: str = "bf16",
                      memory_utilization: float = 0.9) -> list[ParallelConfig]:
    """(TP, PP) with TP ≤ ``max_tp`` dividing the heads, PP dividing the layers, TP·PP ≤ ``max_gpus``,
    that :func:`fits` (weights plus at least 2,048 tokens of KV)."""
    m = resolve_model(model)
    return [ParallelConfig(tp, pp) for tp in range(1, max_tp + 1) if m.num_heads % tp == 0
            for pp in range(1, max_gpus // tp + 1)
            if m.num_layers % pp == 0 and fits(m, gpu, ParallelConfig(tp, pp), dtype=dtype,
                                               memory_utilization=memory_utilization)]


def _fill(g_p: float, gpus_p: int, g_d: float, gpus_d: int, total: int, rate: float | None) -> tuple[int, int, float]:
    """Replica counts: for a target rate ⌈R/g⌉ each; otherwise the n, m filling ``total`` GPUs best."""
    if g_p <= 0 or g_d <= 0:
        return 0, 0, 0.0
    if rate is not None:
        n, m = math.ceil(rate / g_p), math.ceil(rate / g_d)
        if n * gpus_p + m * gpus_d > total:
            return 0, 0, 0.0
        return n, m, min(rate, n * g_p, m * g_d)
    best = (0, 0, 0.0)
    for n in range(1, total // gpus_p + 1):
        m = (total - n * gpus_p) // gpus_d
        if m < 1:
            break
        r = min(n * g_p, m * g_d)
        if r > best[2] + 1e-12:
            best = (n, m, r)
    return best


def _avg_prompt(env: SearchContext) -> float:
    reqs = workload_requests(env.workload, 500, 1.0, env.settings.seed)
    return sum(r.prompt_tokens for r in reqs) / len(reqs)


def _settings_record(env: SearchContext, **extra: Any) -> dict[str, Any]:
    return {"attainment": env.goal, "dtype": env.dtype, "memory_utilization": env.memory_utilization, **extra,
            **asdict(env.settings)}


def place_high_affinity(env: SearchContext, nodes: int, gpus_per_node: int, *, rate_rps: float | None = None,
                        max_instance_gpus: int | None = None, workers: int | None = None) -> Placement:
    """DistServe Algorithm 1. ``env.cross_node_bytes_per_s`` None = KV transfer is free (as DistServe's simulator)."""
    import time

    t0 = time.perf_counter()
    total = nodes * gpus_per_node
    max_gpus = max_instance_gpus or gpus_per_node
    configs = enumerate_configs(env.model, env.gpu, max_gpus, max_tp=gpus_per_node, dtype=env.dtype,
                                memory_utilization=env.memory_utilization)
    if not configs:
        raise ValueError(f"{env.model.name} does not fit on up to {max_gpus} {env.gpu} GPUs")
    tasks = [("prefill", env, c) for c in configs] + [("decode", env, c) for c in configs]
    results = _map(tasks, workers)
    pre = [r for r in results if r.phase == "prefill"]
    dec = [r for r in results if r.phase == "decode"]
    best = None
    for p in pre:
        for d in dec:
            n, m, r = _fill(p.goodput_rps, p.num_gpus, d.goodput_rps, d.num_gpus, total, rate_rps)
            gpus = n * p.num_gpus + m * d.num_gpus
            if n < 1 or m < 1 or gpus > total:
                continue
            key = (r / gpus, r, -gpus)
            if best is None or key > best[0]:
                best = (key, p, d, n, m, r)
    if best is None:
        raise ValueError(f"no prefill + decode configuration of {env.model.name} fits in {total} GPUs at the goal")
    _, bp, bd, n, m, r = best
    need = r * _avg_prompt(env) * env.kv_bytes_per_token
    link = env.cross_node_bytes_per_s
    limited = link is not None and need > link * nodes
    if limited:
        r = r * link * nodes / need
        need = link * nodes
    gpus = n * bp.num_gpus + m * bd.num_gpus
    return Placement(affinity="high", prefill=bp.prefill, decode=bd.decode, num_prefill=n, num_decode=m,
                     prefill_goodput_rps=bp.goodput_rps, decode_goodput_rps=bd.goodput_rps, total_gpus=gpus,
                     cluster_goodput_rps=r, per_gpu_goodput_rps=r / gpus if gpus else 0.0,
                     kv_bandwidth_needed_bytes_per_s=need, cross_node_bytes_per_s=link, bandwidth_limited=limited,
                     candidates=results, settings=_settings_record(env), search_wall_s=time.perf_counter() - t0)


def _pair_tasks(env: SearchContext, nodes: int, gpus_per_node: int, max_instances_per_phase: int) -> list[tuple]:
    """Alg. 2's candidates: per pipeline depth, every (TP_p, TP_d, n_p, n_d) whose stage fits one node."""
    m = env.model
    tasks = []
    for pp in range(1, nodes + 1):
        if m.num_layers % pp:
            continue
        tps = [t for t in range(1, gpus_per_node + 1) if m.num_heads % t == 0 and env.fits(ParallelConfig(t, pp))]
        for tp_p in tps:
            for tp_d in tps:
                for n_p in range(1, max_instances_per_phase + 1):
                    for n_d in range(1, max_instances_per_phase + 1):
                        if n_p * tp_p + n_d * tp_d <= gpus_per_node:
                            tasks.append(("pair", env, ParallelConfig(tp_p, pp), ParallelConfig(tp_d, pp), n_p, n_d))
    return tasks


def place_low_affinity(env: SearchContext, nodes: int, gpus_per_node: int, *, rate_rps: float | None = None,
                       max_instances_per_phase: int = 2, workers: int | None = None) -> Placement:
    """DistServe Algorithm 2: same pipeline depth for both phases, each stage's prefill and decode
    segments inside one node (KV over NVLink); the unit is replicated ⌈R/goodput⌉ times."""
    import time

    t0 = time.perf_counter()
    tasks = _pair_tasks(env, nodes, gpus_per_node, max_instances_per_phase)
    if not tasks:
        raise ValueError(f"{env.model.name} does not fit a prefill + decode pair within {gpus_per_node} GPUs per stage")
    results = _map(tasks, workers)
    best = max(results, key=lambda r: (r.per_gpu_goodput_rps, -r.num_gpus))
    units_max = max(1, (nodes * gpus_per_node) // best.num_gpus)
    units = min(units_max, math.ceil(rate_rps / best.goodput_rps)) if rate_rps and best.goodput_rps > 0 else units_max
    r = units * best.goodput_rps if rate_rps is None else min(rate_rps, units * best.goodput_rps)
    gpus = units * best.num_gpus
    share_p = best.detail["num_prefill"] * best.prefill.num_gpus / best.num_gpus
    return Placement(affinity="low", prefill=best.prefill, decode=best.decode,
                     num_prefill=best.detail["num_prefill"] * units, num_decode=best.detail["num_decode"] * units,
                     prefill_goodput_rps=best.goodput_rps, decode_goodput_rps=best.goodput_rps, total_gpus=gpus,
                     cluster_goodput_rps=r, per_gpu_goodput_rps=r / gpus if gpus else 0.0,
                     kv_bandwidth_needed_bytes_per_s=0.0, cross_node_bytes_per_s=env.cross_node_bytes_per_s,
                     bandwidth_limited=False, candidates=results,
                     settings=_settings_record(env, unit_prefill_gpu_share=share_p),
                     search_wall_s=time.perf_counter() - t0)


_CONTEXT_KEYS = ("attainment", "settings", "cross_node_bytes_per_s", "latency", "dtype", "memory_utilization")


def place(model: str | ModelConfig, gpu: str, nodes: int, gpus_per_node: int, workload: Any, slo: SLO, *,
          affinity: str = "high", **kwargs: Any) -> Placement:
    """Algorithm 1 (``affinity="high"``) or Algorithm 2 (``"low"``).

    The model is resolved once, here. Keywords of :func:`make_env` (``attainment``, ``settings``,
    ``cross_node_bytes_per_s``, ``latency``, ``dtype``, ``memory_utilization``) build the search
    context; the rest (``rate_rps``, ``workers``, ``max_instance_gpus`` for Alg. 1,
    ``max_instances_per_phase`` for Alg. 2) go to the algorithm.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes}, {gpus_per_node}")
    if affinity not in ("high", "low"):
        raise ValueError(f"affinity must be high or low, got {affinity!r}")
    env = make_env(model, gpu, workload, slo, **{k: kwargs.pop(k) for k in _CONTEXT_KEYS if k in kwargs})
    if affinity == "high":
        kwargs.pop("max_instances_per_phase", None)
        return place_high_affinity(env, nodes, gpus_per_node, **kwargs)
    kwargs.pop("max_instance_gpus", None)
    return place_low_affinity(env, nodes, gpus_per_node, **kwargs)


# ---------------------------------------------------------------------------------------------
# placement of a calibrated engine


@dataclass
class DeploymentGoodput:
    """The goodput (req/s at the attainment goal) of one deployment of a calibrated engine, or why
    it was not simulated (``skipped``: a calibrated term that cannot carry to it)."""

    deployment: Any
    goodput_rps: float
    per_engine_goodput_rps: float
    skipped: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = self.deployment
        return {"deployment": str(d), "mode": d.mode, "engines": d.engines,
                "instances": None if d.disaggregated else d.instances,
                "prefill": d.prefill if d.disaggregated else None, "decode": d.decode if d.disaggregated else None,
                "goodput_rps": self.goodput_rps, "per_engine_goodput_rps": self.per_engine_goodput_rps,
                "skipped": self.skipped or None}


@dataclass
class CalibratedPlacement:
    """The deployment of at most ``engines`` calibrated engines with the highest goodput (ties: the
    fewer engines), every candidate searched, and the search's settings. ``device``: what one engine
    runs on (``"cpu"``: a core, ``"cuda"``: a GPU, None: unknown)."""

    best: DeploymentGoodput
    candidates: list[DeploymentGoodput]
    engines: int
    device: str | None
    settings: dict[str, Any] = field(default_factory=dict)
    search_wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"best": self.best.as_dict(), "candidates": [c.as_dict() for c in self.candidates],
                "engines": self.engines, "device": self.device, "settings": self.settings,
                "search_wall_s": self.search_wall_s}


def calibrated_deployments(engines: int, *, dispatch: str | None = None, front_end_shares_core: bool = False,
                           modes: Sequence[str] = ("colocated", "disaggregated")) -> list[Any]:
    """Every deployment of at most ``engines`` engines (:class:`pdlab.simreal.replay.Deployment`):
    1..N colocated replicas and every xPyD with x + y ≤ N, each with ``dispatch`` (None: the
    deployment's default) and ``front_end_shares_core``."""
    from pdlab.simreal.replay import Deployment

    if engines < 1:
        raise ValueError(f"engines must be >= 1, got {engines}")
    out = []
    if "colocated" in modes:
        out += [Deployment("colocated", instances=n, dispatch=dispatch, front_end_shares_core=front_end_shares_core)
                for n in range(1, engines + 1)]
    if "disaggregated" in modes:
        out += [Deployment("disaggregated", prefill=p, decode=d, dispatch=dispatch,
                           front_end_shares_core=front_end_shares_core)
                for p in range(1, engines) for d in range(1, engines - p + 1)]
    return out


def deployment_goodput(calibration: Any, deployment: Any, workload: str | Sequence[Request], slo: SLO, *,
                       attainment: float = 0.9, settings: SearchSettings | None = None,
                       **sim_options: Any) -> DeploymentGoodput:
    """The goodput of ``deployment`` of the calibrated engine: the highest rate (:func:`max_rate`)
    whose SLO attainment on ``workload`` (:func:`workload_requests`) reaches ``attainment``, each
    rate simulated by :func:`pdlab.simreal.replay.replay` (``sim_options``: its keywords). A rate
    at which a core's co-runners would need the whole core attains nothing. Raises ValueError
    naming a term that cannot carry to the deployment."""
    from pdlab.simreal.replay import carry, replay

    settings = settings or SEARCH_PROFILES["ci"]
    carry(calibration, deployment)

    def attainment_at(rate: float) -> float:
        reqs = workload_requests(workload, settings.requests_at(rate), rate, settings.seed)
        try:
            return slo_attainment(replay(reqs, deployment, calibration, **sim_options), slo)
        except ValueError as exc:
            if "the model needs u < 1" in str(exc):
                return 0.0
            raise

    rate = max_rate(attainment_at, attainment, settings)
    return DeploymentGoodput(deployment, rate, rate / deployment.engines)


def place_calibrated(calibration: Any, engines: int, workload: str | Sequence[Request], slo: SLO, *,
                     attainment: float = 0.9, settings: SearchSettings | None = None, dispatch: str | None = None,
                     front_end_shares_core: bool = False, **sim_options: Any) -> CalibratedPlacement:
    """Search the deployments of at most ``engines`` engines of ``calibration``'s engine
    (:func:`calibrated_deployments`) for the highest goodput (:func:`deployment_goodput`; ties: the
    fewer engines). A deployment a calibrated term cannot carry to is kept as a skipped candidate
    with the reason; ValueError when every one is skipped, or without both SLOs."""
    import time

    if slo.ttft_s is None or slo.tpot_s is None:
        raise ValueError("placement needs both a TTFT and a TPOT SLO")
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment goal must be in (0, 1], got {attainment}")
    t0 = time.perf_counter()
    settings = settings or SEARCH_PROFILES["ci"]
    candidates = []
    for dep in calibrated_deployments(engines, dispatch=dispatch, front_end_shares_core=front_end_shares_core):
        try:
            candidates.append(deployment_goodput(calibration, dep, workload, slo, attainment=attainment,
                                                 settings=settings, **sim_options))
        except ValueError as exc:
            candidates.append(DeploymentGoodput(dep, 0.0, 0.0, skipped=str(exc)))
    ran = [c for c in candidates if not c.skipped]
    if not ran:
        raise ValueError("no deployment of the calibrated engine could be simulated: "
                         + "; ".join(f"{c.deployment}: {c.skipped}" for c in candidates))
    best = max(ran, key=lambda c: (c.goodput_rps, -c.deployment.engines))
    return CalibratedPlacement(best, candidates, engines, calibration.device,
                               settings={"attainment": attainment, **asdict(settings), **sim_options},
                               search_wall_s=time.perf_counter() - t0)
