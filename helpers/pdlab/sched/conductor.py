"""Mooncake's Conductor: KVCache-centric scheduling of a prefill pool and a decode pool, and overload control.

A small event-driven simulator of Mooncake's architecture (FAST'25 §3–4 = arXiv 2407.00079v3 §4–7):

- **Prefill instances** (one 8-GPU node each) serve requests first-come first-served, one at a
  time (Mooncake chunks a long prefill across the pipeline instead of batching requests). Each keeps a
  local LRU cache of prefix blocks in its DRAM (:class:`pdlab.kvcache.LRUBlockCache`); together
  those caches form the global pool that the global policy can read across the network.
- **Decode instances** run continuous batching. Modelled as a fluid: between events every active
  request advances at one token per step, and the step time is memory-bound,
  ``overhead + (weight bytes + KV bytes of all active tokens) / HBM bandwidth``
  (:class:`DecodeCostModel`).
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

Simplifications (the notebook states them): blocks are cached at dispatch time; decode TBT is the
fluid step time (``extra["tbt_max_s"]`` is the slowest step a request saw; the mean is the record's
TPOT); the first token comes from prefill; no chunked pipeline across prefill nodes.
Times are seconds, sizes tokens and decimal bytes.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdlab.hardware import get_gpu
from pdlab.kvcache import BLOCK_TOKENS, HasPrefix, LRUBlockCache, prefix_hit_tokens
from pdlab.metrics import SLO, RequestRecord, summarize
from pdlab.models import get_model, kv_bytes_per_token, weight_bytes

__all__ = [
    "PrefillCostModel",
    "DecodeCostModel",
    "Cluster",
    "mooncake_cluster",
    "CONDUCTOR_POLICIES",
    "ADMISSIONS",
    "PrefillChoice",
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


class _Active:
    """A request decoding on a :class:`_Decode` instance."""

    __slots__ = ("remaining", "context", "joined_s", "max_step_s")

    def __init__(self, remaining: float, context: float, joined_s: float) -> None:
        self.remaining = remaining      # tokens still to generate (fluid: fractional between events)
        self.context = context          # tokens of KV it holds
        self.joined_s = joined_s        # when it joined this instance
        self.max_step_s = 0.0           # slowest step it has seen (its worst TBT)


class _Decode:
    """One decode instance as a fluid: active requests advance one token per step."""

    def __init__(self, model: DecodeCostModel) -> None:
        self.model = model
        self.active: dict[int, _Active] = {}  # request id -> its decode state
        self.last_s = 0.0
        self.step_s = 0.0
        self.kv_tokens = 0.0
        self.version = 0

    def advance(self, now: float) -> None:
        if self.active and self.step_s > 0:
            steps = (now - self.last_s) / self.step_s
            for a in self.active.values():
                a.remaining -= steps
                a.context += steps
        self.last_s = now

    def refresh(self) -> None:
        self.kv_tokens = sum(a.context for a in self.active.values())
        self.step_s = self.model.step_time_s(len(self.active), self.kv_tokens)
        for a in self.active.values():
            a.max_step_s = max(a.max_step_s, self.step_s)
        self.version += 1

    def step_with(self, context_tokens: float) -> float:
        return self.model.step_time_s(len(self.active) + 1, self.kv_tokens + context_tokens)

    def next_finish(self) -> float | None:
        if not self.active:
            return None
        return self.last_s + max(min(a.remaining for a in self.active.values()), 0.0) * self.step_s


@dataclass
class _Replay:
    """The event loop's state during one :meth:`Conductor.run`."""

    events: list[tuple[float, int, str, Any]] = field(default_factory=list)  # (time, seq, kind, data)
    seq: int = 0
    records: dict[int, RequestRecord] = field(default_factory=dict)
    samples: list[dict[str, float]] = field(default_factory=list)
    next_sample_s: float = 0.0
    accepted: int = 0           # in the current sampling window
    rejected: int = 0

    def push(self, t: float, kind: str, data: Any) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, data))
        self.seq += 1


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
    admission rule. Subclass and override :meth:`place` to try another global scheduler.

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
        self.rng = random.Random(seed)
        self.sample_every_s = sample_every_s
        self.decode_time_s = decode_time_s
        if prediction not in ("uniform", "exponential"):
            raise ValueError(f"prediction must be uniform or exponential, got {prediction!r}")
        self.prediction = prediction
        self._now = 0.0

    # -- the scheduling decision (Algorithm 1) ---------------------------------------------------
    def place(self, req: HasPrefix, now: float) -> PrefillChoice:
        """Choose the prefill instance for ``req`` arriving at ``now`` (FAST'25 Algorithm 1)."""
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
    def decode_load_now(self) -> float:
        """Current decode load: step time of the least-loaded decode instance with one more request
        of average context, ÷ the TBT SLO (> 1: it could not take another request now)."""
        return min(d.step_with(self._ctx_mean) for d in self._decodes) / self.cluster.tbt_slo_s

    def decode_load_predicted(self, at_s: float) -> float:
        """System-level prediction (arXiv v3 §7.2) of the decode load at ``at_s`` (when this request's
        prefill would end): requests now in decode that are younger than ``t_d`` stay, requests in
        prefill that finish by ``at_s`` arrive, plus this one; spread evenly over the decode pool."""
        td = self.decode_time_s if self.decode_time_s is not None else self._td_mean
        if self.prediction == "exponential":
            # memoryless residual time: each decoding request is still there with p = exp(-Δ/t_d)
            staying = sum(len(d.active) for d in self._decodes) * float(np.exp(-(at_s - self._now) / td))
        else:
            staying = sum(1 for d in self._decodes for a in d.active.values() if a.joined_s + td > at_s)
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
    def run(self, requests: Sequence[Any]) -> ConductorResult:
        """Replay ``requests`` in arrival order; return per-request records and load samples."""
        c = self.cluster
        self._caches = [LRUBlockCache(c.cache_blocks_per_instance) for _ in range(c.n_prefill)]
        self._busy_until = [0.0] * c.n_prefill
        self._decodes = [_Decode(c.decode) for _ in range(c.n_decode)]
        self._in_prefill: dict[int, float] = {}
        self._td_mean = 20.0     # seconds in decode, learnt as requests finish
        self._ctx_mean = 8000.0  # tokens of context per decoding request, learnt on admission
        rp = _Replay()
        for r in sorted(requests, key=lambda r: r.arrival_s):
            rp.push(r.arrival_s, "arrive", r)
        rp.next_sample_s = rp.events[0][0] if rp.events else 0.0
        while rp.events:
            now, _, kind, data = heapq.heappop(rp.events)
            self._now = now
            self._sample_until(rp, now)
            if kind == "arrive":
                self._arrive(rp, data, now)
            elif kind == "prefilled":
                self._prefilled(rp, data, now)
            else:  # a decode instance may have finished requests
                self._decode_step(rp, *data, now)
        ordered = [rp.records[k] for k in sorted(rp.records)]
        return ConductorResult(self.policy, self.admission, c, ordered, rp.samples)

    def _sample_until(self, rp: _Replay, now: float) -> None:
        """Load samples every ``sample_every_s`` up to ``now`` (loads ÷ SLOs; admissions per window)."""
        c = self.cluster
        while now >= rp.next_sample_s:
            t = rp.next_sample_s
            rp.samples.append({
                "time_s": t,
                "prefill_load": float(np.mean([max(0.0, b - t) for b in self._busy_until])) / c.ttft_slo_s,
                "decode_load": float(np.mean([d.step_s for d in self._decodes])) / c.tbt_slo_s,
                "decode_requests": float(sum(len(d.active) for d in self._decodes)),
                "accepted": rp.accepted, "rejected": rp.rejected,
            })
            rp.accepted = rp.rejected = 0
            rp.next_sample_s += self.sample_every_s

    def _rejection_on_arrival(self, rec: RequestRecord, p: PrefillChoice, now: float) -> str:
        """Why the admission rule turns the request away on arrival ("" to accept it)."""
        if self.admission in ("early", "predicted"):
            rec.extra["decode_load_now"] = self.decode_load_now()
            rec.extra["decode_load_predicted"] = self.decode_load_predicted(now + p.ttft_s)
        if self.admission == "none":
            return ""
        if p.ttft_s > self.cluster.ttft_slo_s:
            return "TTFT SLO"
        if self.admission == "early" and rec.extra["decode_load_now"] > 1.0:
            return "decode load"
        if self.admission == "predicted" and rec.extra["decode_load_predicted"] > 1.0:
            return "predicted decode load"
        return ""

    def _arrive(self, rp: _Replay, r: Any, now: float) -> None:
        """Place the request's prefill (Algorithm 1), or reject it; start the prefill."""
        rec = RequestRecord(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
        rp.records[r.request_id] = rec
        p = self.place(r, now)
        reason = self._rejection_on_arrival(rec, p, now)
        if reason:
            rec.ok, rec.error = False, f"rejected on arrival (HTTP 429): {reason}"
            rec.extra["rejected"] = "arrival"
            rp.rejected += 1
            return
        rp.accepted += 1
        finish = now + p.ttft_s
        self._busy_until[p.instance] = finish
        self._caches[p.instance].insert(r.hash_ids)  # computed or replicated blocks stay here
        self._in_prefill[r.request_id] = finish
        self._observe(ctx=r.prompt_tokens + r.output_tokens / 2)
        rec.instance = f"P{p.instance}"
        rec.extra.update(prefix_tokens=p.prefix_tokens, local_tokens=p.local_tokens,
                         remote_tokens=p.remote_tokens, queue_s=p.queue_s, transfer_s=p.transfer_s,
                         prefill_s=p.prefill_s)
        rp.push(finish, "prefilled", r)

    def _prefilled(self, rp: _Replay, r: Any, now: float) -> None:
        """The prefill ended (first token): join the least-loaded decode instance, or be rejected."""
        c = self.cluster
        rec = rp.records[r.request_id]
        self._in_prefill.pop(r.request_id, None)
        rec.first_token_s = now
        k = min(range(c.n_decode), key=lambda j: (self._decodes[j].kv_tokens, len(self._decodes[j].active)))
        d = self._decodes[k]
        d.advance(now)
        ctx = r.prompt_tokens + 1
        rec.extra["decode_load_at_join"] = d.step_with(ctx) / c.tbt_slo_s
        if self.admission != "none" and (d.step_with(ctx) > c.tbt_slo_s or
                                         d.kv_tokens + ctx + r.output_tokens > c.decode.kv_capacity_tokens):
            rec.ok, rec.error = False, "rejected after prefill: decode instance full"
            rec.extra["rejected"] = "decode"
            rec.first_token_s = None
            return
        rec.extra["decode_instance"] = f"D{k}"
        if r.output_tokens <= 1:
            rec.finish_s = now
            rec.extra["tbt_max_s"] = 0.0
            return
        d.active[r.request_id] = _Active(float(r.output_tokens - 1), float(ctx), now)
        d.refresh()
        self._schedule_decode(rp, k)

    def _decode_step(self, rp: _Replay, k: int, version: int, now: float) -> None:
        """Decode instance ``k``'s planned finish (stale if its batch changed since): finish requests."""
        d = self._decodes[k]
        if version != d.version:
            return
        d.advance(now)
        for rid in [rid for rid, a in d.active.items() if a.remaining <= 1e-9]:
            a = d.active.pop(rid)
            rp.records[rid].finish_s = now
            rp.records[rid].extra["tbt_max_s"] = a.max_step_s
            self._observe(decode_s=now - a.joined_s)
        d.refresh()
        self._schedule_decode(rp, k)

    def _schedule_decode(self, rp: _Replay, k: int) -> None:
        t = self._decodes[k].next_finish()
        if t is not None:
            rp.push(t, "decode", (k, self._decodes[k].version))


def compare_policies(requests: Sequence[Any], cluster: Cluster, policies: Sequence[str] = CONDUCTOR_POLICIES, *,
                     admission: str = "none", seed: int = 0) -> dict[str, ConductorResult]:
    """Run each policy on the same requests; ``{policy: result}``."""
    return {p: Conductor(cluster, p, admission, seed=seed).run(requests) for p in policies}
