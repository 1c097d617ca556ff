"""Mooncake's Conductor: KVCache-centric scheduling of a prefill pool and a decode pool, and overload control.

Mooncake's architecture (FAST'25 §3–4 = arXiv 2407.00079v3 §4–7) on the course's one simulator
(:class:`pdlab.sim.Simulator`): the Conductor's dispatch policy is the simulator's dispatch hook, its
admission rule the simulator's admission hook (:mod:`pdlab.sim.admission`), and a subclass adds the
rule that refuses a request at the end of its prefill.

- **Prefill instances** (one 8-GPU node each) serve requests first-come first-served, one at a
  time (Mooncake chunks a long prefill across the pipeline instead of batching requests). Each keeps a
  local LRU cache of prefix blocks in its DRAM (the simulator's prefix cache, ``cache_blocks_per_instance``
  blocks); together those caches form the global pool that the global policy can read across the network.
- **Decode instances** run the simulator's continuous batching; a step is memory-bound,
  ``overhead + (weight bytes + KV bytes of all active tokens) / HBM bandwidth``
  (:class:`DecodeCostModel`), and a request whose KV arrives joins at the next step.
- **Prefill time** (:class:`PrefillCostModel`) from FAST'25 §2.2: ``flops(n) = l·(a·n²·d + b·n·d²)``
  with a = 4, b = 22; a prefill of ``new`` tokens after a cached prefix of ``p`` costs
  ``flops(p + new) − flops(p)`` at an effective FLOP/s (peak × MFU). A polynomial in (p, new), as the
  paper's offline-fitted regression.

Dispatch policies (FAST'25 Fig. 5): ``random``, ``load_balance`` (shortest queue), ``local_cache_aware``
(min queue + prefill of the part not in *that* instance's cache) and ``global_cache_aware``
(Mooncake Algorithm 1: also consider fetching the best prefix held anywhere, when its length beats the
local match by ``balancing_threshold``, paying the transfer time; the fetched blocks are then
replicated to the chosen instance). Every policy benefits from the chosen instance's own cache.

Admission (arXiv v3 §7): ``none`` (serve everything — to compare latency distributions),
``slo`` (Algorithm 1: reject on arrival when the estimated TTFT misses its SLO; reject after prefill
when the decode instance cannot take the request within the TBT SLO — that prefill was wasted),
``early`` (also reject on arrival when the *current* decode load exceeds 1) and ``predicted``
(system-level prediction: the decode load expected when this request's prefill ends, assuming every
request stays in decode for a uniform time ``t_d``).

Both cost models are one latency model of the simulator (:class:`ConductorLatency`).

Simplifications (the notebook states them): the Conductor decides from its own view — each node's
queue is the prefill work it sent there (its prediction), its cache the blocks of the requests sent
there, cached at dispatch; a fetched prefix lands in the chosen node's cache at dispatch and the node
does not wait for it (the estimate counts the transfer; on this trace it is under 1 % of the TTFT);
``extra["tbt_max_s"]`` is the slowest step a request saw (the mean is the record's TPOT); the first
token comes from prefill; the KV hand-off to decode is instantaneous; no chunked pipeline across
prefill nodes.
Times are seconds, sizes tokens and decimal bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdlab.hardware import get_gpu
from pdlab.kvcache import BLOCK_TOKENS, HasPrefix, LRUBlockCache, prefix_hit_tokens
from pdlab.metrics import SLO, RequestRecord, summarize
from pdlab.models import get_model, kv_bytes_per_token, weight_bytes
from pdlab.sim import DispatchPolicy, InstanceSpec, LatencyModel, SimRequest, Simulator
from pdlab.workloads import Request

__all__ = [
    "PrefillCostModel",
    "DecodeCostModel",
    "Cluster",
    "mooncake_cluster",
    "CONDUCTOR_POLICIES",
    "ADMISSIONS",
    "PrefillChoice",
    "ConductorLatency",
    "Conductor",
    "ConductorResult",
    "compare_policies",
]

CONDUCTOR_POLICIES = ("random", "load_balance", "local_cache_aware", "global_cache_aware")
ADMISSIONS = ("none", "slo", "early", "predicted")


@dataclass(frozen=True)
class PrefillCostModel:
    """Prefill time of ``new`` tokens after ``prefix`` cached tokens, from FLOPs (FAST'25 §2.2).

    ``flops(n) = num_layers · (a·n²·hidden + b·n·hidden²)``; time = Δflops / ``flops_per_s`` +
    ``overhead_s``. ``flops_per_s`` is the instance's effective rate (GPUs × peak × MFU).
    """

    num_layers: int
    hidden_size: int
    flops_per_s: float
    overhead_s: float = 0.02
    a: float = 4.0
    b: float = 22.0

    def flops(self, tokens: float) -> float:
        """FLOPs of a full prefill of ``tokens`` tokens."""
        d = self.hidden_size
        return self.num_layers * (self.a * tokens * tokens * d + self.b * tokens * d * d)

    def time_s(self, new_tokens: float, prefix_tokens: float = 0) -> float:
        """Seconds to prefill ``new_tokens`` after a cached prefix of ``prefix_tokens``."""
        new_tokens = max(new_tokens, 1)
        return self.overhead_s + (self.flops(prefix_tokens + new_tokens) - self.flops(prefix_tokens)) \
            / self.flops_per_s


@dataclass(frozen=True)
class DecodeCostModel:
    """Memory-bound decode step: ``overhead + (weights + kv_tokens · kv_bytes_per_token) / bandwidth``."""

    weight_bytes: float
    kv_bytes_per_token: float
    hbm_bytes_per_s: float
    kv_capacity_tokens: int
    overhead_s: float = 0.005

    def step_time_s(self, batch: int, kv_tokens: float) -> float:
        """Seconds per decode step for ``batch`` requests holding ``kv_tokens`` tokens of KV (0 if idle)."""
        if batch <= 0:
            return 0.0
        return self.overhead_s + (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / self.hbm_bytes_per_s


@dataclass(frozen=True)
class Cluster:
    """A Mooncake deployment: pools, cost models, cache size, network, SLOs (seconds)."""

    n_prefill: int
    n_decode: int
    prefill: PrefillCostModel
    decode: DecodeCostModel
    kv_bytes_per_token: float
    transfer_bytes_per_s: float
    cache_blocks_per_instance: int | None
    block_tokens: int = BLOCK_TOKENS
    balancing_threshold: float = 1.2
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    gpus_per_instance: int = 8

    @property
    def num_gpus(self) -> int:
        return (self.n_prefill + self.n_decode) * self.gpus_per_instance

    def transfer_s(self, tokens: float) -> float:
        """Seconds to move ``tokens`` tokens of KV between nodes."""
        return tokens * self.kv_bytes_per_token / self.transfer_bytes_per_s


def mooncake_cluster(n_prefill: int = 8, n_decode: int = 8, *, model: str = "llama-3-70b", gpu: str = "a800",
                     gpus_per_instance: int = 8, prefill_mfu: float = 0.5, hbm_efficiency: float = 0.7,
                     kv_dtype: str = "bf16", cache_tokens_per_instance: float | None = 3e6,
                     transfer_bytes_per_s: float = 87e9, memory_fraction: float = 0.9,
                     **kwargs: Any) -> Cluster:
    """A cluster shaped like FAST'25's testbed: 8-GPU A800 nodes serving (dummy) LLaMA3-70B.

    ``cache_tokens_per_instance`` is the DRAM prefix cache per prefill node (3 M tokens ≈ 1 TB of
    LLaMA3-70B KV — the local size FAST'25 §5 reports as under half the global pool's hit rate);
    ``transfer_bytes_per_s`` defaults to the 87 GB/s FAST'25 measured for its transfer engine on
    4×200 Gbps NICs. ``kwargs`` go to :class:`Cluster` (SLOs, threshold).
    """
    m = get_model(model)
    g = get_gpu(gpu)
    kvb = kv_bytes_per_token(m, kv_dtype)
    weights = weight_bytes(m, "bf16")
    prefill = PrefillCostModel(m.num_layers, m.hidden_size, gpus_per_instance * g.peak_flops("bf16") * prefill_mfu)
    capacity = int((gpus_per_instance * g.memory_bytes * memory_fraction - weights) // kvb)
    decode = DecodeCostModel(weights, kvb, gpus_per_instance * g.hbm_bytes_per_s * hbm_efficiency, capacity)
    blocks = None if cache_tokens_per_instance is None else int(cache_tokens_per_instance // BLOCK_TOKENS)
    return Cluster(n_prefill, n_decode, prefill, decode, kvb, transfer_bytes_per_s, blocks,
                   gpus_per_instance=gpus_per_instance, **kwargs)


@dataclass(frozen=True)
class PrefillChoice:
    """Where a request's prefill goes and what the Conductor estimated (seconds, tokens)."""

    instance: int
    prefix_tokens: int
    local_tokens: int
    remote_tokens: int
    queue_s: float
    transfer_s: float
    prefill_s: float

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.transfer_s + self.prefill_s


class ConductorLatency(LatencyModel):
    """The Conductor's cost models as the simulator's latency model of one 8-GPU node.

    A prefill of ``c`` tokens after ``p`` earlier (cached) tokens has ``prefill_sq_tokens`` =
    c·(2p + c) = (p + c)² − p², so :class:`PrefillCostModel`'s ``flops(p + c) − flops(p)`` is
    ``num_layers · (a·sq·d + b·c·d²)``; a decode step is :class:`DecodeCostModel`'s memory-bound step.
    """

    def __init__(self, prefill: PrefillCostModel, decode: DecodeCostModel, gpus: int = 8) -> None:
        self.prefill, self.decode, self.tp = prefill, decode, gpus
        d = prefill.hidden_size
        self._sq = prefill.num_layers * prefill.a * d / prefill.flops_per_s
        self._lin = prefill.num_layers * prefill.b * d * d / prefill.flops_per_s

    def step_time_s(self, prefill_tokens: int, prefill_sq_tokens: float, decode_batch: int,
                    decode_ctx_tokens: int) -> float:
        t = 0.0
        if prefill_tokens > 0:
            t += self.prefill.overhead_s + self._sq * prefill_sq_tokens + self._lin * prefill_tokens
        if decode_batch > 0:
            t += self.decode.step_time_s(decode_batch, decode_ctx_tokens)
        return t

    def decode_affine(self, decode_batch: int) -> tuple[float, float, float, float, float]:
        m = self.decode
        a, b = m.weight_bytes / m.hbm_bytes_per_s, m.kv_bytes_per_token / m.hbm_bytes_per_s
        return (a, b, a, b, m.overhead_s)


def _decode_state(inst: Any) -> tuple[int, int]:
    """Requests on a simulated decode instance (decoding, or with their KV arrived) and the tokens of
    KV they hold."""
    n, ctx = 0, 0
    for group in (inst.running, inst.waiting):
        n += len(group)
        for r in group:
            ctx += r.kv
    return n, ctx


def _prefix_cache(inst: Any) -> Any:
    """The simulated instance's prefix cache (:class:`pdlab.sim.state.PrefixLRU`)."""
    return getattr(inst, "kv_manager", inst).prefix_cache


class _Dispatch(DispatchPolicy):
    """The Conductor's choice of prefill instance (Algorithm 1, :meth:`Conductor.place`) as the
    simulator's dispatch policy; the choice waits for the admission rule in ``pending``."""

    name = "conductor"

    def __init__(self, conductor: Conductor) -> None:
        self.conductor = conductor

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
        return self.conductor.dispatch(request.req, now)


class _DecodeDispatch(DispatchPolicy):
    """The decode instance holding the fewest KV tokens (then the fewest requests): the Conductor's choice."""

    name = "conductor_decode"

    def choose(self, instances: Sequence[Any], request: SimRequest, now: float) -> int:
        return min(range(len(instances)), key=lambda j: (instances[j].kv_used, instances[j].num_running, j))


@dataclass(frozen=True)
class _Verdict:
    admit: bool
    reason: str = ""


class _Admission:
    """The Conductor's admission rule as the simulator's admission hook (:mod:`pdlab.sim.admission`):
    it judges the choice :class:`_Dispatch` just made, and commits it when the request is admitted."""

    def __init__(self, conductor: Conductor) -> None:
        self.conductor = conductor
        self.clock = lambda: 0.0

    def decide(self, prompt_tokens: int, output_tokens: int = 0) -> _Verdict:
        reason = self.conductor.judge(self.clock())
        return _Verdict(not reason, reason)

    def start(self, key: str, prompt_tokens: int) -> None:
        self.conductor.commit(self.clock())

    def done(self, key: str) -> None:
        self.conductor.prefill_ended(key)


class _Simulator(Simulator):
    """The simulator with the Conductor's rule at the end of a prefill: a request no decode instance
    can take within the TBT SLO (or its KV) is refused then, its prefill wasted."""

    def __init__(self, conductor: Conductor, specs: list[InstanceSpec]) -> None:
        super().__init__(specs, dispatch=_Dispatch(conductor), decode_dispatch=_DecodeDispatch(),
                         admission=_Admission(conductor))
        self.conductor = conductor

    def prefill_done(self, src: Any, r: SimRequest, now: float) -> None:
        c = self.conductor
        c.advance(now)
        k = self.decode_dispatch.choose(self.decode, r, now)
        n, ctx_now = _decode_state(self.decode[k])
        ctx = r.prompt + 1
        step = c.cluster.decode.step_time_s(n + 1, ctx_now + ctx)
        key = str(r.req.request_id)
        extra = c.extra_of(key)
        extra["decode_load_at_join"] = step / c.cluster.tbt_slo_s
        if c.admission != "none" and (step > c.cluster.tbt_slo_s or
                                      ctx_now + ctx + r.output > c.cluster.decode.kv_capacity_tokens):
            extra["rejected"] = "decode"
            src.release(r)
            src.wake(now)
            r.error = "rejected after prefill: decode instance full"
            self.on_request_finished(r, now)
            return
        extra["decode_instance"] = f"D{k}"
        c.join_decode(key, now)
        super().prefill_done(src, r, now)

    def on_request_finished(self, r: SimRequest, now: float) -> None:
        self.conductor.leave_decode(str(r.req.request_id), now, finished=r.finish is not None)
        super().on_request_finished(r, now)


@dataclass
class ConductorResult:
    """Records of one replay plus counters and a load time series."""

    policy: str
    admission: str
    cluster: Cluster
    records: list[RequestRecord]
    samples: list[dict[str, float]] = field(default_factory=list)

    @property
    def rejected_on_arrival(self) -> int:
        return sum(1 for r in self.records if r.extra.get("rejected") == "arrival")

    @property
    def rejected_after_prefill(self) -> int:
        return sum(1 for r in self.records if r.extra.get("rejected") == "decode")

    @property
    def rejected(self) -> int:
        return self.rejected_on_arrival + self.rejected_after_prefill

    def hit_ratio(self) -> float:
        """Reused prefix tokens (local + fetched) ÷ prompt tokens, over the requests that were prefilled."""
        done = [r for r in self.records if "prefix_tokens" in r.extra]
        total = sum(r.prompt_tokens for r in done)
        return sum(r.extra["prefix_tokens"] for r in done) / total if total else 0.0

    def ttfts_s(self) -> np.ndarray:
        return np.array([r.ttft_s for r in self.records if r.ok and r.ttft_s is not None])

    def summary(self, slo: SLO | None = None) -> dict[str, Any]:
        """:func:`pdlab.metrics.summarize` plus hit ratio, rejections and the policy names."""
        slo = slo or SLO(ttft_s=self.cluster.ttft_slo_s, tpot_s=self.cluster.tbt_slo_s)
        out = {"policy": self.policy, "admission": self.admission}
        out.update(summarize(self.records, slo, num_gpus=self.cluster.num_gpus))
        out.update(hit_ratio=self.hit_ratio(), rejected=self.rejected,
                   rejected_on_arrival=self.rejected_on_arrival,
                   rejected_after_prefill=self.rejected_after_prefill,
                   prefill_s_mean=float(np.mean([r.extra["prefill_s"] for r in self.records
                                                 if "prefill_s" in r.extra] or [np.nan])))
        return out


class Conductor:
    """Replays requests (anything with ``request_id``, ``arrival_s``, ``prompt_tokens``,
    ``output_tokens``, ``hash_ids``) through a :class:`Cluster` under one dispatch policy and one
    admission rule, on the course's simulator (:class:`pdlab.sim.Simulator`): the policy is its
    dispatch hook, the rule its admission hook. Subclass and override :meth:`place` to try another
    global scheduler.

    ``prediction`` (for ``admission="predicted"``): ``uniform`` — the paper's system-level rule, every
    request stays in decode ``t_d`` seconds (``decode_time_s``, else a running mean); ``exponential`` —
    a memoryless residual time, each decoding request still present with p = exp(−Δ/t_d).
    """

    def __init__(self, cluster: Cluster, policy: str = "global_cache_aware", admission: str = "none", *,
                 seed: int = 0, sample_every_s: float = 10.0, decode_time_s: float | None = None,
                 prediction: str = "uniform") -> None:
        if policy not in CONDUCTOR_POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(CONDUCTOR_POLICIES)}")
        if admission not in ADMISSIONS:
            raise ValueError(f"unknown admission {admission!r}; known: {', '.join(ADMISSIONS)}")
        if cluster.n_prefill < 1 or cluster.n_decode < 1:
            raise ValueError("a cluster needs at least one prefill and one decode instance")
        self.cluster, self.policy, self.admission = cluster, policy, admission
        self.seed = seed
        self.rng = random.Random(seed)
        self.sample_every_s = sample_every_s
        self.decode_time_s = decode_time_s
        if prediction not in ("uniform", "exponential"):
            raise ValueError(f"prediction must be uniform or exponential, got {prediction!r}")
        self.prediction = prediction
        self._now = 0.0

    # -- the scheduling decision (Algorithm 1) ---------------------------------------------------
    def place(self, req: HasPrefix, now: float) -> PrefillChoice:
        """Choose the prefill instance for ``req`` arriving at ``now`` (FAST'25 Algorithm 1).

        The Conductor's own view: each node's queue is the prefill work it has been sent and not
        finished (its prediction), its cache the blocks of the requests sent to it (an LRU of
        ``cache_blocks_per_instance`` blocks)."""
        c = self.cluster
        bt = c.block_tokens
        n = req.prompt_tokens
        local = [prefix_hit_tokens(cache.match(req.hash_ids), n, bt) for cache in self._caches]
        queue = [max(0.0, busy - now) for busy in self._busy_until]

        def est(i: int, use_remote: bool, best: int) -> PrefillChoice:
            if use_remote and best > local[i] and (local[i] == 0 or best / local[i] > c.balancing_threshold):
                tr = c.transfer_s(best - local[i])
                return PrefillChoice(i, best, local[i], best - local[i], queue[i], tr, c.prefill.time_s(n - best, best))
            return PrefillChoice(i, local[i], local[i], 0, queue[i], 0.0, c.prefill.time_s(n - local[i], local[i]))

        if self.policy == "random":
            return est(self.rng.randrange(c.n_prefill), False, 0)
        if self.policy == "load_balance":
            i = min(range(c.n_prefill), key=lambda k: (queue[k], self.rng.random()))
            return est(i, False, 0)
        best = max(local) if self.policy == "global_cache_aware" else 0
        cands = [est(i, self.policy == "global_cache_aware", best) for i in range(c.n_prefill)]
        return min(cands, key=lambda p: (p.ttft_s, self.rng.random()))

    # -- loads (arXiv v3 §7) -------------------------------------------------------------------
    def _step_with(self, inst: Any, context_tokens: float) -> float:
        n, ctx = _decode_state(inst)
        return self.cluster.decode.step_time_s(n + 1, ctx + context_tokens)

    def decode_load_now(self) -> float:
        """Current decode load: step time of the least-loaded decode instance with one more request
        of average context, ÷ the TBT SLO (> 1: it could not take another request now)."""
        return min(self._step_with(d, self._ctx_mean) for d in self._sim.decode) / self.cluster.tbt_slo_s

    def decode_load_predicted(self, at_s: float) -> float:
        """System-level prediction (arXiv v3 §7.2) of the decode load at ``at_s`` (when this request's
        prefill would end): requests now in decode that are younger than ``t_d`` stay, requests in
        prefill that finish by ``at_s`` arrive, plus this one; spread evenly over the decode pool."""
        td = self.decode_time_s if self.decode_time_s is not None else self._td_mean
        if self.prediction == "exponential":
            # memoryless residual time: each decoding request is still there with p = exp(-Δ/t_d)
            staying = len(self._joined) * float(np.exp(-(at_s - self._now) / td))
        else:
            staying = sum(1 for joined in self._joined.values() if joined + td > at_s)
        # requests whose prefill ends by at_s join decode — and are gone again if they joined over t_d ago
        arriving = sum(1 for f in self._in_prefill.values() if f <= at_s and f + td > at_s) + 1
        per = (staying + arriving) / self.cluster.n_decode
        step = self.cluster.decode.step_time_s(max(1, round(per)), per * self._ctx_mean)
        return step / self.cluster.tbt_slo_s

    def _observe(self, decode_s: float | None = None, ctx: float | None = None) -> None:
        alpha = 0.02  # exponentially weighted means of decode time and context length
        if decode_s is not None:
            self._td_mean += alpha * (decode_s - self._td_mean)
        if ctx is not None:
            self._ctx_mean += alpha * (ctx - self._ctx_mean)

    # -- the replay ------------------------------------------------------------------------------
    def specs(self) -> list[InstanceSpec]:
        """The simulator's instances: prefill nodes one prompt at a time (first come first served)
        with a prefix cache of ``cache_blocks_per_instance`` blocks, decode nodes with continuous
        batching and the decode model's KV capacity; :class:`ConductorLatency` on both."""
        c = self.cluster
        latency = ConductorLatency(c.prefill, c.decode, c.gpus_per_instance)
        blocks = c.cache_blocks_per_instance if c.cache_blocks_per_instance is not None else 1 << 40
        prefill = InstanceSpec(latency, kv_capacity_tokens=blocks * c.block_tokens, role="prefill", max_num_seqs=1,
                               max_batched_tokens=1 << 40, prefix_caching=True, prefix_block_tokens=c.block_tokens)
        decode = InstanceSpec(latency, kv_capacity_tokens=c.decode.kv_capacity_tokens, role="decode",
                              max_num_seqs=1 << 20)
        return [*([prefill] * c.n_prefill), *([decode] * c.n_decode)]

    def run(self, requests: Sequence[Any]) -> ConductorResult:
        """Replay ``requests`` in arrival order; return per-request records and load samples."""
        c = self.cluster
        self.rng = random.Random(self.seed)
        self._caches = [LRUBlockCache(c.cache_blocks_per_instance) for _ in range(c.n_prefill)]
        self._busy_until = [0.0] * c.n_prefill
        self._in_prefill: dict[str, float] = {}   # admitted request -> predicted end of its prefill
        self._joined: dict[str, float] = {}       # request in decode -> when it joined
        self._extra: dict[str, dict[str, Any]] = {}
        self._td_mean = 20.0     # seconds in decode, learnt as requests finish
        self._ctx_mean = 8000.0  # tokens of context per decoding request, learnt on admission
        self.samples: list[dict[str, float]] = []
        self._window = [0, 0]    # accepted, rejected in the current sampling window
        reqs = [r if isinstance(r, Request) else Request(r.request_id, r.arrival_s, r.prompt_tokens,
                                                         r.output_tokens, tuple(r.hash_ids)) for r in requests]
        self._next_sample_s = min((r.arrival_s for r in reqs), default=0.0)
        self._sim = _Simulator(self, self.specs())
        result = self._sim.run(reqs)
        records = sorted(result.records, key=lambda r: r.request_id)
        for rec in records:
            extra = self._extra.get(str(rec.request_id), {})
            if rec.extra.get("rejected") == "arrival":
                extra = {k: v for k, v in extra.items() if k.startswith("decode_load")}
            rec.extra.update(extra)
            if rec.extra.get("rejected") == "decode":
                rec.first_token_s = None
            if rec.instance.startswith("prefill-"):
                rec.instance = "P" + rec.instance.removeprefix("prefill-")
            times = rec.token_times_s
            rec.extra["tbt_max_s"] = float(np.max(np.diff(times))) if times is not None and len(times) > 1 else 0.0
            rec.token_times_s = None
        return ConductorResult(self.policy, self.admission, c, records, self.samples)

    def _sample_until(self, now: float) -> None:
        """Load samples every ``sample_every_s`` up to ``now`` (loads ÷ SLOs; admissions per window)."""
        c = self.cluster
        while now >= self._next_sample_s:
            t = self._next_sample_s
            steps, n_all = [], 0
            for d in self._sim.decode:
                n, ctx = _decode_state(d)
                steps.append(c.decode.step_time_s(n, ctx))
                n_all += n
            self.samples.append({
                "time_s": t,
                "prefill_load": float(np.mean([max(0.0, b - t) for b in self._busy_until])) / c.ttft_slo_s,
                "decode_load": float(np.mean(steps)) / c.tbt_slo_s,
                "decode_requests": float(n_all),
                "accepted": self._window[0], "rejected": self._window[1],
            })
            self._window = [0, 0]
            self._next_sample_s += self.sample_every_s

    def _rejection_on_arrival(self, req: Any, p: PrefillChoice, now: float) -> str:
        """Why the admission rule turns the request away on arrival ("" to accept it)."""
        extra = self._extra[str(req.request_id)] = {}
        if self.admission in ("early", "predicted"):
            extra["decode_load_now"] = self.decode_load_now()
            extra["decode_load_predicted"] = self.decode_load_predicted(now + p.ttft_s)
        if self.admission == "none":
            return ""
        if p.ttft_s > self.cluster.ttft_slo_s:
            return "TTFT SLO"
        if self.admission == "early" and extra["decode_load_now"] > 1.0:
            return "decode load"
        if self.admission == "predicted" and extra["decode_load_predicted"] > 1.0:
            return "predicted decode load"
        return ""

    # -- the simulator's hooks call these (the Conductor's view, as events happen) -----------------
    def advance(self, now: float) -> None:
        """The Conductor's clock moves to ``now`` (seconds), taking the load samples due up to then."""
        self._now = now
        self._sample_until(now)

    def dispatch(self, req: Any, now: float) -> int:
        """A request arrives at ``now``: choose its prefill instance (:meth:`place`) and hold the choice
        as ``pending`` for the admission rule; return that instance's index."""
        self.advance(now)
        self.pending = (req, self.place(req, now))
        return self.pending[1].instance

    def judge(self, now: float) -> str:
        """Why the admission rule turns the ``pending`` request away on arrival ("" to accept it); a
        refusal counts in the current sampling window."""
        req, choice = self.pending
        reason = self._rejection_on_arrival(req, choice, now)
        if reason:
            self._window[1] += 1
        return reason

    def prefill_ended(self, key: str) -> None:
        """Request ``key``'s prefill left its node: it no longer counts as arriving in decode."""
        self._in_prefill.pop(key, None)

    def extra_of(self, key: str) -> dict[str, Any]:
        """The record fields (``extra``) the Conductor keeps for request ``key``, updated in place."""
        return self._extra[key]

    def join_decode(self, key: str, now: float) -> None:
        """Request ``key`` joins a decode instance at ``now`` (seconds)."""
        self._joined[key] = now

    def leave_decode(self, key: str, now: float, *, finished: bool) -> None:
        """Request ``key`` leaves the system at ``now``; one that decoded to the end teaches the mean
        time in decode."""
        joined = self._joined.pop(key, None)
        if joined is not None and finished:
            self._observe(decode_s=now - joined)

    def commit(self, now: float) -> None:
        """The pending request is admitted: its prefill joins the chosen node's queue (the Conductor's
        prediction), its blocks that node's cache, and a fetched prefix lands in that node's DRAM."""
        r, p = self.pending
        self._window[0] += 1
        finish = now + p.ttft_s
        self._busy_until[p.instance] = finish
        self._caches[p.instance].insert(r.hash_ids)  # computed or replicated blocks stay here
        if p.remote_tokens:
            fetched = -(-p.prefix_tokens // self.cluster.block_tokens)
            _prefix_cache(self._sim.front[p.instance]).insert(r.hash_ids[:fetched])
        key = str(r.request_id)
        self._in_prefill[key] = finish
        self._observe(ctx=r.prompt_tokens + r.output_tokens / 2)
        self._extra[key].update(prefix_tokens=p.prefix_tokens, local_tokens=p.local_tokens,
                                remote_tokens=p.remote_tokens, queue_s=p.queue_s, transfer_s=p.transfer_s,
                                prefill_s=p.prefill_s)


def compare_policies(requests: Sequence[Any], cluster: Cluster, policies: Sequence[str] = CONDUCTOR_POLICIES, *,
                     admission: str = "none", seed: int = 0) -> dict[str, ConductorResult]:
    """Run each policy on the same requests; ``{policy: result}``."""
    return {p: Conductor(cluster, p, admission, seed=seed).run(requests) for p in policies}
