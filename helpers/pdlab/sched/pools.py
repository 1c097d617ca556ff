"""Splitwise: prompt and token pools on different GPU types, their cost and power, the cheapest mix.

Splitwise (ISCA'24, arXiv 2311.18677v2) runs the prompt (prefill) phase on one pool of machines and
the token (decode) phase on another, possibly of a different GPU generation: prefill is
compute-bound and uses an H100's 3.4× FLOP/s, decode is memory-bound and gains only the 1.6× HBM
bandwidth, while the H100 costs 2.16× as much (Table I). Designs are named by their pools:
``HH``, ``AA``, ``HA`` (H100 prompt, A100 token); ``Baseline-H``/``Baseline-A`` are colocated
clusters where every machine runs both phases (vLLM-style continuous batching) — the "mixed" pool.

Machines are DGX-style nodes of ``gpus_per_machine`` GPUs serving one model replica with TP.
Simulation by :mod:`pdlab.sim` (roofline latency from the catalog, KV over a link); cost and power
from the catalog's ``price_per_hour`` (USD per GPU-hour, Splitwise Table I ÷ 8) and ``tdp_w``.

SLOs as in Splitwise §V: slowdowns against the same request served alone on a DGX-A100, all nine
must hold — TTFT P50/P90/P99 ≤ 2/3/6×, TBT and E2E P50/P90/P99 ≤ 1.25/1.5/5×.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdlab.hardware import get_gpu
from pdlab.metrics import RequestRecord
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.sim import ClusterSpec, PoolSpec, Simulator, build_cluster
from pdlab.workloads import Request, make_requests

__all__ = [
    "GPU_LETTERS",
    "PoolDesign",
    "SplitwiseSLO",
    "build_pool_simulator",
    "reference_latencies",
    "evaluate_design",
    "cheapest_design",
    "Scenario",
    "DECISION_SCENARIOS",
    "mode_goodputs",
    "NexusGPU",
    "nexus_gpu",
]

GPU_LETTERS = {"A": "a100-80gb", "H": "h100-sxm"}
"""Splitwise's letters for GPU types (DGX-A100 and DGX-H100)."""

_TTFT_SLOWDOWN = (2.0, 3.0, 6.0)
_TBT_E2E_SLOWDOWN = (1.25, 1.5, 5.0)
_PCTS = (50, 90, 99)


@dataclass(frozen=True)
class PoolDesign:
    """A cluster: ``n_prompt`` machines of ``prompt_gpu`` and ``n_token`` of ``token_gpu``.

    ``token_gpu=None`` means a colocated (mixed) cluster of ``n_prompt`` machines doing both phases.
    """

    prompt_gpu: str
    n_prompt: int
    token_gpu: str | None = None
    n_token: int = 0
    gpus_per_machine: int = 8

    def __post_init__(self) -> None:
        if self.n_prompt < 1:
            raise ValueError(f"n_prompt must be >= 1, got {self.n_prompt}")
        if self.token_gpu is not None and self.n_token < 1:
            raise ValueError("a split design needs n_token >= 1")
        for g in (self.prompt_gpu, self.token_gpu):
            if g is not None and get_gpu(g).price_per_hour is None:
                raise ValueError(f"the catalog has no price_per_hour for {g!r}; pick a GPU with a price")

    @property
    def colocated(self) -> bool:
        return self.token_gpu is None

    @property
    def name(self) -> str:
        letter = {v: k for k, v in GPU_LETTERS.items()}
        p = letter.get(get_gpu(self.prompt_gpu).key, self.prompt_gpu)
        if self.colocated:
            return f"Baseline-{p} ({self.n_prompt})"
        t = letter.get(get_gpu(self.token_gpu).key, self.token_gpu)
        return f"{p}{t} ({self.n_prompt}P+{self.n_token}T)"

    @property
    def machines(self) -> int:
        return self.n_prompt + self.n_token

    @property
    def num_gpus(self) -> int:
        return self.machines * self.gpus_per_machine

    def _per_gpu(self, attr: str) -> float:
        g = self.gpus_per_machine
        total = self.n_prompt * g * getattr(get_gpu(self.prompt_gpu), attr)
        if not self.colocated:
            total += self.n_token * g * getattr(get_gpu(self.token_gpu), attr)
        return float(total)

    @property
    def cost_per_hour(self) -> float:
        """USD per hour of all GPUs (catalog ``price_per_hour`` × GPUs)."""
        return self._per_gpu("price_per_hour")

    @property
    def power_w(self) -> float:
        """Provisioned GPU power, watts (catalog ``tdp_w`` × GPUs)."""
        return self._per_gpu("tdp_w")


@dataclass(frozen=True)
class SplitwiseSLO:
    """Splitwise §V SLOs: P50/P90/P99 slowdowns against unloaded DGX-A100 latencies (seconds)."""

    ttft_ref_s: float
    tbt_ref_s: float
    e2e_ref_s: float
    ttft_slowdown: tuple[float, float, float] = _TTFT_SLOWDOWN
    tbt_slowdown: tuple[float, float, float] = _TBT_E2E_SLOWDOWN
    e2e_slowdown: tuple[float, float, float] = _TBT_E2E_SLOWDOWN

    def limits(self) -> dict[str, float]:
        """``{"ttft_p50_s": limit, ...}`` for the nine objectives."""
        out = {}
        for metric, ref, mult in (("ttft", self.ttft_ref_s, self.ttft_slowdown),
                                  ("tbt", self.tbt_ref_s, self.tbt_slowdown),
                                  ("e2e", self.e2e_ref_s, self.e2e_slowdown)):
            for p, m in zip(_PCTS, mult, strict=True):
                out[f"{metric}_p{p}_s"] = ref * m
        return out

    def measure(self, records: Sequence[RequestRecord]) -> dict[str, float]:
        """The nine percentiles (TBT = the request's TPOT) over completed requests."""
        done = [r for r in records if r.ok and r.finish_s is not None]
        series = {"ttft": [r.ttft_s for r in done], "tbt": [r.tpot_s or 0.0 for r in done],
                  "e2e": [r.e2e_s for r in done]}
        return {f"{k}_p{p}_s": float(np.percentile(v, p)) if v else float("inf")
                for k, v in series.items() for p in _PCTS}

    def met(self, records: Sequence[RequestRecord]) -> bool:
        """True when every request completed and all nine percentiles are within their limits."""
        if any(not r.ok or r.finish_s is None for r in records):
            return False
        got = self.measure(records)
        return all(got[k] <= lim for k, lim in self.limits().items())


def build_pool_simulator(design: PoolDesign, model: str, *, link: str = "ib-ndr", dtype: str = "bf16",
                         layerwise_overlap: bool = True, record_token_times: bool = False,
                         prompt_batch_tokens: int = 2048) -> Simulator:
    """A :class:`pdlab.sim.Simulator` for a design: roofline latency per GPU type, TP = GPUs per machine.

    Split designs send KV over ``link`` with layer-wise overlap (Splitwise §IV-C streams KV per layer);
    prompts go to the shortest prompt queue and decodes to the least-loaded token machine
    (Splitwise's join-shortest-queue).
    """
    tp = design.gpus_per_machine
    # Splitwise's machine scheduler: prompt batches of at most 2048 tokens (§IV-B)
    if design.colocated:
        pools = [PoolSpec("colocated", design.n_prompt, design.prompt_gpu, tp)]
        return build_cluster(ClusterSpec(pools, model, dtype, dispatch="least_loaded"),
                             record_token_times=record_token_times)
    pools = [PoolSpec("prefill", design.n_prompt, design.prompt_gpu, tp,
                      options={"max_batched_tokens": prompt_batch_tokens}),
             PoolSpec("decode", design.n_token, design.token_gpu, tp)]
    return build_cluster(ClusterSpec(pools, model, dtype, link=link, layerwise_overlap=layerwise_overlap,
                                     dispatch="shortest_queue", decode_dispatch="least_loaded"),
                         record_token_times=record_token_times)


def reference_latencies(model: str, prompt_tokens: int, output_tokens: int, *, gpu: str = "a100-80gb",
                        gpus_per_machine: int = 8) -> SplitwiseSLO:
    """Splitwise's reference: one request alone on one (DGX-A100) machine → the SLO object."""
    one = make_requests([0.0], prompt_tokens, output_tokens)
    rec = build_pool_simulator(PoolDesign(gpu, 1, gpus_per_machine=gpus_per_machine), model).run(one).records[0]
    return SplitwiseSLO(rec.ttft_s, rec.tpot_s or 0.0, rec.e2e_s)


def evaluate_design(design: PoolDesign, requests: Sequence[Request], model: str, slo: SplitwiseSLO,
                    **kwargs: Any) -> dict[str, Any]:
    """Simulate one design: the nine percentiles, whether the SLOs hold, cost, power, throughput."""
    res = build_pool_simulator(design, model, **kwargs).run(requests)
    got = slo.measure(res.records)
    done = sum(1 for r in res.records if r.ok and r.finish_s is not None)
    span = max((r.finish_s for r in res.records if r.finish_s is not None), default=0.0) - \
        min(r.arrival_s for r in res.records)
    return {"design": design.name, "prompt_gpu": design.prompt_gpu, "token_gpu": design.token_gpu or "",
            "n_prompt": design.n_prompt, "n_token": design.n_token, "machines": design.machines,
            "gpus": design.num_gpus, "cost_per_hour": design.cost_per_hour, "power_kw": design.power_w / 1e3,
            "completed": done, "throughput_rps": done / span if span > 0 else float("nan"),
            "slo_met": slo.met(res.records), **got}


@dataclass
class _Search:
    rows: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None


def cheapest_design(prompt_gpu: str, token_gpu: str | None, requests: Sequence[Request], model: str,
                    slo: SplitwiseSLO, *, max_prompt: int = 16, max_token: int = 12,
                    gpus_per_machine: int = 8, **kwargs: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The cheapest (USD/h) design of a kind that meets every SLO on ``requests``; (best row, all rows).

    Colocated (``token_gpu=None``): the fewest machines, searched upward. Split: a staircase walk over
    (n_prompt, n_token) — start with few prompt and many token machines, drop a token machine while
    the SLOs hold, else add a prompt machine — using that more machines never hurt; each feasible
    corner is a candidate and the cheapest wins. Returns (None, rows) when nothing within the limits works.
    """
    out = _Search()

    def run(n_p: int, n_t: int) -> dict[str, Any]:
        row = evaluate_design(PoolDesign(prompt_gpu, n_p, token_gpu, n_t, gpus_per_machine), requests,
                              model, slo, **kwargs)
        out.rows.append(row)
        if row["slo_met"] and (out.best is None or row["cost_per_hour"] < out.best["cost_per_hour"]):
            out.best = row
        return row

    if token_gpu is None:
        for n in range(1, max_prompt + 1):
            if run(n, 0)["slo_met"]:
                break
        return out.best, out.rows
    n_p, n_t = 1, max_token
    while n_p <= max_prompt and n_t >= 1:
        if run(n_p, n_t)["slo_met"]:
            n_t -= 1
        else:
            n_p += 1
    return out.best, out.rows


@dataclass(frozen=True)
class Scenario:
    """One row of the "when to disaggregate" matrix: a model on a GPU type, request shape, SLOs (s)."""

    name: str
    model: str
    gpu: str
    tp: int
    prompt_tokens: int
    output_tokens: int
    ttft_slo_s: float
    tpot_slo_s: float
    dtype: str = "bf16"
    note: str = ""


#: The decision matrix of notebook 09 (shapes and SLOs are the course's choices, stated in the notebook).
DECISION_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("chatbot, long histories", "llama-3-70b", "h100-sxm", 4, 8000, 300, 2.0, 0.10,
             note="Mooncake-like: long prompts, moderate outputs"),
    Scenario("agentic tool loop", "llama-3-70b", "h100-sxm", 4, 6000, 80, 1.0, 0.05,
             note="long context re-sent every step, short tool calls"),
    Scenario("code completion", "llama-3-8b", "h100-sxm", 1, 1500, 30, 0.15, 0.03,
             note="tight TTFT, few tokens"),
    Scenario("long-form generation", "llama-3-70b", "h100-sxm", 4, 500, 1500, 1.0, 0.05,
             note="decode-dominated"),
    Scenario("batch scoring", "llama-3-70b", "h100-sxm", 4, 1000, 1, 5.0, 1.0,
             note="prefill only, loose latency"),
    Scenario("small 7B model", "mistral-7b", "a100-80gb", 1, 700, 200, 0.25, 0.10,
             note="ShareGPT-like shape, DistServe's chatbot SLOs"),
    Scenario("frontier MoE", "deepseek-v3", "h200", 8, 4000, 500, 3.0, 0.10, dtype="fp8",
             note="671B MoE with MLA, fp8 weights and KV"),
)


def mode_goodputs(scenario: Scenario, settings: Any = None, *, attainment: float = 0.9,
                  ratios: Sequence[tuple[int, int]] = ((1, 1), (3, 1), (1, 2))) -> dict[str, Any]:
    """Per-GPU goodput (req/s per GPU at ``attainment``) of colocated, chunked-prefill and disaggregated
    serving for one scenario, with :mod:`pdlab.sched.placement`'s rate search. Disaggregated takes the best
    prefill:decode instance ratio of ``ratios`` (instances of ``scenario.tp`` GPUs each)."""
    from dataclasses import replace

    from pdlab.metrics import SLO
    from pdlab.sched.placement import (
        SEARCH_PROFILES,
        ParallelConfig,
        colocated_goodput,
        make_env,
        pair_goodput,
    )

    settings = settings or SEARCH_PROFILES["ci"]
    n = max(50, settings.requests)
    base = make_requests(np.arange(n) * 0.1, scenario.prompt_tokens, scenario.output_tokens)
    env = make_env(scenario.model, scenario.gpu, base, SLO(ttft_s=scenario.ttft_slo_s, tpot_s=scenario.tpot_slo_s),
                   attainment=attainment, settings=settings)
    env = replace(env, dtype=scenario.dtype)
    cfg = ParallelConfig(scenario.tp, 1)
    colo = colocated_goodput(env, cfg, "vllm").per_gpu_goodput_rps
    chunked = colocated_goodput(env, cfg, "chunked").per_gpu_goodput_rps
    best, best_ratio = 0.0, ratios[0]
    for n_p, n_d in ratios:
        g = pair_goodput(env, cfg, cfg, n_p, n_d).per_gpu_goodput_rps
        if g > best:
            best, best_ratio = g, (n_p, n_d)
    winner = max((("colocated", colo), ("chunked prefill", chunked), ("disaggregated", best)), key=lambda kv: kv[1])
    return {"scenario": scenario.name, "model": scenario.model, "gpu": scenario.gpu, "GPUs per instance": scenario.tp,
            "prompt/output tokens": f"{scenario.prompt_tokens}/{scenario.output_tokens}",
            "TTFT/TPOT SLO (s)": f"{scenario.ttft_slo_s:g}/{scenario.tpot_slo_s:g}",
            "colocated (req/s/GPU)": colo, "chunked (req/s/GPU)": chunked, "disaggregated (req/s/GPU)": best,
            "best P:D ratio": f"{best_ratio[0]}:{best_ratio[1]}", "winner": winner[0] if winner[1] > 0 else "none meets SLO"}


@dataclass(frozen=True)
class NexusGPU:
    """One GPU shared by prefill and decode (intra-GPU disaggregation, Nexus arXiv 2507.06608), as a fluid model.

    A fraction ``x`` of the SMs runs prefill, ``1 − x`` decode. Returns diminish past saturation
    (Nexus's observation): prefill gets ``flops · (1 − e^(−x/k)) / (1 − e^(−1/k))`` of the compute,
    decode ``hbm · min(1, (1 − x) / decode_sm_saturation)`` of the bandwidth (a few SMs already
    saturate HBM for memory-bound decode). Units: FLOP/s, bytes/s, tokens, seconds.
    """

    flops: float
    hbm_bytes_per_s: float
    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_prompt_token: float
    prefill_curvature: float = 0.35
    decode_sm_saturation: float = 0.3
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    max_prefill_utilization: float = 0.8

    def prefill_rate(self, x: float) -> float:
        """Effective prefill FLOP/s with a fraction ``x`` of the SMs."""
        k = self.prefill_curvature
        return self.flops * self.compute_efficiency * (1 - np.exp(-x / k)) / (1 - np.exp(-1 / k))

    def decode_bandwidth(self, x: float) -> float:
        """Effective decode bytes/s with the other ``1 − x`` of the SMs."""
        return self.hbm_bytes_per_s * self.memory_efficiency * min(1.0, (1 - x) / self.decode_sm_saturation)

    def max_rate(self, x: float, prompt_tokens: int, output_tokens: int, tpot_slo_s: float) -> float:
        """Highest request rate (req/s) with prefill utilisation ≤ the cap and a decode step ≤ the TPOT SLO.

        Decode step T = W/Bd + n·ctx·kv/Bd with n = λ·output·T requests in flight (Little's law), so
        λ ≤ (Bd − W/TPOT) / (output·ctx·kv), ctx = prompt + output/2.
        """
        if not 0 < x < 1:
            return 0.0
        lam_p = self.max_prefill_utilization * self.prefill_rate(x) / (prompt_tokens * self.flops_per_prompt_token)
        bd = self.decode_bandwidth(x)
        ctx = prompt_tokens + output_tokens / 2
        lam_d = max(0.0, (bd - self.weight_bytes / tpot_slo_s) / (output_tokens * ctx * self.kv_bytes_per_token))
        return float(min(lam_p, lam_d))

    def colocated_max_rate(self, prompt_tokens: int, output_tokens: int, tpot_slo_s: float) -> float:
        """Time-sharing (no split): prefill takes ρ of the GPU's time and stretches every decode step by 1/(1−ρ)."""
        best = 0.0
        for lam in np.linspace(0.01, 200, 4000):
            rho = lam * prompt_tokens * self.flops_per_prompt_token / (self.flops * self.compute_efficiency)
            if rho >= self.max_prefill_utilization:
                break
            bd = self.hbm_bytes_per_s * self.memory_efficiency
            ctx = prompt_tokens + output_tokens / 2
            denom = 1 - lam * output_tokens * ctx * self.kv_bytes_per_token / bd / (1 - rho)
            if denom <= 0:
                break
            step = self.weight_bytes / bd / denom / (1 - rho)
            if step > tpot_slo_s:
                break
            best = float(lam)
        return best

    def best_split(self, prompt_tokens: int, output_tokens: int, tpot_slo_s: float,
                   grid: int = 99) -> tuple[float, float]:
        """(x, max rate) of the best static split on a grid — what a dynamic partitioner converges to."""
        xs = np.linspace(0.01, 0.99, grid)
        rates = [self.max_rate(float(x), prompt_tokens, output_tokens, tpot_slo_s) for x in xs]
        i = int(np.argmax(rates))
        return float(xs[i]), float(rates[i])


def nexus_gpu(gpu: str, model: str, dtype: str = "bf16", **kwargs: Any) -> NexusGPU:
    """A :class:`NexusGPU` for a catalog GPU and model (prefill FLOPs per token ≈ 2 × active parameters)."""
    from pdlab.models import param_counts, weight_bytes

    g, m = get_gpu(gpu), get_model(model)
    return NexusGPU(g.peak_flops("bf16" if dtype not in ("fp8",) else "fp8"), g.hbm_bytes_per_s,
                    weight_bytes(m, dtype), kv_bytes_per_token(m, dtype), 2.0 * param_counts(m)["active"], **kwargs)
