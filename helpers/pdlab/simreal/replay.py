"""Stage 3 of sim-to-real: replay requests in the simulator, on a deployment built from the
calibrated engine (:class:`Deployment`: N colocated replicas behind a dispatch policy, chunked
prefill, or xPyD) with the terms of one :class:`~pdlab.simreal.calibration.Calibration`.

Each term belongs to an engine on its core or to the link between two engines, and :func:`carry`
says how each carries to the deployment asked for, or raises naming the term that cannot and why.
:func:`replay` applies every term that carries (the fitted rows, the KV hand-off, each role's
contention, the prefill stall, the run fit's front-end delay and prefill core load, a front end
on its engine's core) and is what both lab 05 and ``pdlab sim run --profile`` run, so one profile
gives one answer.

Simulator set-ups mirror vLLM V1: a colocated server is Sarathi-style chunked batching with a
token budget (``--max-num-batched-tokens``, 2048 by default on CPU) and ``--max-num-seqs``; a
disaggregated deployment follows vLLM's proxy protocol, where the prefill server's one token is
discarded and the decode server generates every output token (so the first token the client sees
comes from decode, after the KV hand-off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pdlab.metrics import RequestRecord
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibration import Calibration, CoreShare, RunFit
from pdlab.workloads import Request

__all__ = ["MODES", "Deployment", "Carry", "carry", "replay", "build_sim", "check_terms", "engine_latency",
           "engine_latencies", "with_prefill_core_load", "with_front_end_core", "arrival_rate_rps",
           "requests_from_records", "replay_pairs"]


def requests_from_records(records: Sequence[RequestRecord], *, use_server_tokens: bool = True) -> list[Request]:
    """The requests a live run actually sent: send times (s from the first send) and token counts.

    Prompt tokens are the server's count (``usage.prompt_tokens``) when known; output tokens the
    target (``max_tokens`` with ``ignore_eos``). Replaying these removes client scheduling jitter
    and tokenisation differences from the comparison.
    """
    if not records:
        raise ValueError("no records to replay")
    t0 = min(r.arrival_s for r in records)
    out = []
    for i, r in enumerate(sorted(records, key=lambda r: r.arrival_s)):
        prompt = r.counted_prompt_tokens if use_server_tokens else r.prompt_tokens
        output = int(r.extra.get("target_output_tokens", r.output_tokens) or r.output_tokens)
        out.append(Request(i if not isinstance(r.request_id, int) else r.request_id, r.arrival_s - t0,
                           max(1, prompt), max(1, output)))
    return out


def arrival_rate_rps(requests: Sequence[Request], *, break_factor: float = 20.0) -> float:
    """Requests per second while a run was sending: its gaps between arrivals over their sum,
    leaving out gaps longer than ``break_factor`` × the median gap (breaks between a run's blocks,
    lab 05's mirrored order; a Poisson gap is that long with probability 2^−20). Raises ValueError
    for fewer than 2 requests or no time between them."""
    if len(requests) < 2:
        raise ValueError(f"need >= 2 requests for a rate, got {len(requests)}")
    gaps = np.diff(sorted(r.arrival_s for r in requests))
    kept = gaps[gaps <= break_factor * np.median(gaps)]
    if kept.sum() <= 0:
        raise ValueError("all requests arrive at once: no rate")
    return float(len(kept) / kept.sum())


def _stretch(share_cores: float, who: str, detail: str) -> float:
    """``1 / (1 − u)``: a step of ``T`` seconds of compute on a core whose co-runners (``who``,
    ``detail``) take ``u`` = ``share_cores`` of it ends after ``T / (1 − u)``. ValueError when ``u`` >= 1."""
    if share_cores >= 1:
        raise ValueError(f"{who} would need {share_cores:.2f} cores at this rate ({detail}): the model needs u < 1")
    return 1.0 / (1.0 - share_cores)


def with_prefill_core_load(latency: FittedLatency, run_fit: RunFit, requests: Sequence[Request], *,
                           engines: int = 1) -> FittedLatency:
    """``latency`` with its prefill row stretched by ``1 / (1 − u)``: ``u`` = the share of a
    prefill engine's core its co-runners (API servers, proxy, client) take while requests are in
    flight, ``run_fit.prefill_core_base_cores`` + the rate through that engine (the requests' rate,
    :func:`arrival_rate_rps`, over ``engines`` prefill engines) × ``run_fit.prefill_core_cpu_s_per_request``.
    A prefill of ``T`` seconds of compute that shares the core with work arriving at ``u`` cores
    gets the rest of it, so it ends after ``T / (1 − u)``. Unchanged without a load; ValueError
    when ``u`` >= 1 (the co-runners alone would need the whole core)."""
    if not run_fit.has_prefill_core_load:
        return latency
    base, cpu_s = run_fit.prefill_core_base_cores, run_fit.prefill_core_cpu_s_per_request
    u = base + arrival_rate_rps(requests) / engines * cpu_s
    k = _stretch(u, "the prefill core's co-runners", f"{base:.2f} cores + {cpu_s * 1e3:.1f} ms of CPU per request")
    return latency.derive(prefill_scale=k)


def with_front_end_core(latency: FittedLatency, share: CoreShare, requests: Sequence[Request], *,
                        engines: int = 1) -> FittedLatency:
    """``latency`` (one engine's) stretched by its own front end on its core, at the rate through
    the engine (the requests' rate, :func:`arrival_rate_rps`, over ``engines`` engines of its kind).

    - The prefill row by ``1 / (1 − u)``, ``u`` = :meth:`CoreShare.share
      <pdlab.simreal.calibration.CoreShare.share>` (cores in flight + CPU per request × rate): the
      prefill probe sends one 1-token prompt at a time, so its front end sat idle while it ran.
    - The decode row by ``1 / (1 − r·c)``, the per-request CPU ``c`` alone (HTTP, tokenising new
      arrivals): the decode probe streamed its tokens through the same front end on the same core,
      so the in-flight part (``base_cores``, mostly streaming) is in the decode fit already.

    ValueError when ``u`` >= 1."""
    rate = arrival_rate_rps(requests) / engines
    detail = f"{share.base_cores:.2f} cores + {share.cpu_s_per_request * 1e3:.1f} ms of CPU per request"
    k_prefill = _stretch(share.share(rate), "a front end on its engine's core", detail)
    k_decode = _stretch(rate * share.cpu_s_per_request, "a front end on its engine's core", detail)
    return latency.derive(prefill_scale=k_prefill, decode_scale=k_decode)


def engine_latency(calibration: Calibration) -> tuple[FittedLatency, float]:
    """The calibration's model as one engine runs it, and the seconds each request spends outside it.

    With a measured prefill stall (:class:`~pdlab.simreal.calibration.PrefillStall`) the prefill
    row's fixed cost becomes ``a_d + fixed_s``, so a mixed step costs the decode step + ``fixed_s``
    + the prefill's per-token terms, and ``off_engine_s`` (= a_p − that) is returned to be added to
    each request's arrival: a lone prompt's TTFT is unchanged. Without one (or with its
    ``fixed_s`` unknown), the model unchanged and 0."""
    latency, stall = calibration.latency, calibration.prefill_stall
    if stall is None:
        return latency, 0.0
    (ap, bp, cp), ad = latency.prefill, latency.decode[0]
    if not np.isfinite(stall.fixed_s) or ap <= ad + stall.fixed_s:
        return latency, 0.0
    engine_a = ad + stall.fixed_s
    return latency.derive(prefill=(engine_a, bp, cp)), ap - engine_a


#: Deployment modes the calibrated simulator builds.
MODES = ("colocated", "chunked", "disaggregated")


@dataclass(frozen=True)
class Deployment:
    """A deployment built from the calibrated engine and its link.

    ``mode``: ``"colocated"`` or ``"chunked"``: ``instances`` replicas of the engine, each serving
    prefill and decode, behind ``dispatch`` (default round robin). For a calibrated vLLM V1 engine
    the two are the same: its scheduler always chunks prefills within its token budget
    (``--max-num-batched-tokens``, the replay's ``token_budget``), and the replay simulates that
    scheduler for both. ``"disaggregated"``: ``prefill`` prefill engines and ``decode`` decode
    engines (xPyD) behind vLLM's proxy protocol, every hand-off over the calibration's link;
    ``dispatch`` picks the prefill engine (default shortest queue), the least loaded decode engine
    takes each hand-off.
    ``front_end_shares_core``: each engine's front end (its API server) runs on the engine's core
    (two replicas on a two-core host): the calibration's ``front_end_core`` slows every engine.
    """

    mode: str = "colocated"
    instances: int = 1
    prefill: int = 1
    decode: int = 1
    dispatch: str | None = None
    front_end_shares_core: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("instances", "prefill", "decode"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.dispatch is not None:
            from pdlab.sim.dispatch import make_dispatch

            make_dispatch(self.dispatch)

    @classmethod
    def of(cls, deployment: str | Deployment) -> Deployment:
        """``deployment`` as a Deployment (a mode name: one engine, or one prefill/decode pair)."""
        return deployment if isinstance(deployment, Deployment) else cls(deployment)

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run on separate engines."""
        return self.mode == "disaggregated"

    @property
    def engines(self) -> int:
        """Engines the deployment runs (one core or one GPU each)."""
        return self.prefill + self.decode if self.disaggregated else self.instances

    def __str__(self) -> str:
        if self.disaggregated:
            text = f"{self.prefill}P{self.decode}D"
        else:
            text = f"{self.instances} {self.mode} engine{'s' if self.instances > 1 else ''}"
            if self.instances > 1:
                text += f" ({self.dispatch or 'round_robin'})"
        return text + (", front ends on the engines' cores" if self.front_end_shares_core else "")


@dataclass(frozen=True)
class Carry:
    """How each of a calibration's terms carries to one :class:`Deployment` (:func:`carry`):
    ``applied`` and ``unused`` map a term to how it is applied, or why the deployment has no use
    for it (term names: :data:`~pdlab.simreal.calibration.TERM_KEYS`, the run fit in its two
    parts ``run_fit.front_end_s`` and ``run_fit.prefill_core``)."""

    applied: dict[str, str]
    unused: dict[str, str]


def carry(calibration: Calibration, deployment: str | Deployment) -> Carry:
    """How each term of ``calibration`` carries to ``deployment`` (a :class:`Deployment` or a mode).

    Terms belong to what they describe: the step-time rows, the prefill stall and a front end on
    the core (``front_end_core``) to one engine, applied to every engine of the deployment (the
    stall to engines that prefill); the pair's prefill core load (``run_fit.prefill_core``) to each
    prefill engine; the contention (``cpu_contention``) to each prefill and decode engine beside
    the others on the host; the hand-off (``kv_link``) to every prefill-to-decode link; the
    front-end delay (``run_fit.front_end_s``) to every request.

    Raises ValueError naming each term that cannot carry to the deployment, and why: a
    contention measured between a prefill and a decode role on several colocated engines (a
    colocated engine does both, and its slowdown beside another engine is not measured); a pair's
    prefill core load on colocated engines (that core hosted the pair's co-runners); a front end
    on the engine's core where the calibration has no ``front_end_core``, or where a pair's
    prefill core load already charges the front ends. :meth:`Calibration.without
    <pdlab.simreal.calibration.Calibration.without>` drops a term on purpose."""
    dep = Deployment.of(deployment)
    cal = calibration
    applied, unused, bad = {}, {}, {}
    if cal.kv_link is not None:
        if dep.disaggregated:
            applied["kv_link"] = "every hand-off from a prefill to a decode engine"
        else:
            unused["kv_link"] = "no KV hand-off between colocated engines"
    if "cpu_contention" in cal.terms():
        c = cal.contention
        if dep.disaggregated:
            applied["cpu_contention"] = (f"each step of an engine is 1 + c·n times as long while n other engines on "
                                         f"the host are busy (c = {c.prefill:.3g} prefill, {c.decode:.3g} decode; "
                                         "measured beside one engine of the other role, every busy engine "
                                         "counts alike)")
        elif dep.instances == 1:
            unused["cpu_contention"] = "one engine: no other engine on the host"
        else:
            bad["cpu_contention"] = ("measured as a prefill role's and a decode role's slowdown while the other "
                                     "works; a colocated engine does both, and its slowdown beside another "
                                     "colocated engine is not measured")
    if "prefill_stall" in cal.terms():
        where = "each prefill engine (decode engines do not prefill)" if dep.disaggregated else "each engine"
        applied["prefill_stall"] = f"{where}: a prefill costs a_d + fixed_s in the step, off_engine_s before it"
    run = cal.run_fit or RunFit()
    if run.front_end_s:
        applied["run_fit.front_end_s"] = f"each request reaches its engine {run.front_end_s * 1e3:.3g} ms after it is sent"
    if run.has_prefill_core_load:
        if not dep.disaggregated:
            bad["run_fit.prefill_core"] = ("measured on a prefill/decode pair's prefill core, which hosted the pair's "
                                           "co-runners (both API servers, the proxy, the client); a colocated "
                                           "engine's core does not")
        elif dep.front_end_shares_core:
            bad["run_fit.prefill_core"] = ("already charges the front ends on the prefill core; a front end on every "
                                           "engine's core (front_end_shares_core) would charge them twice")
        else:
            applied["run_fit.prefill_core"] = "each prefill engine's prefill row, at the rate through that engine"
    share = cal.front_end_core if "front_end_core" in cal.terms() else None
    if dep.front_end_shares_core and share is None:
        bad["front_end_core"] = ("missing: the deployment runs each front end on its engine's core, and the "
                                 "calibration has not measured what a front end takes "
                                 "(pdlab.simreal.probes.frontend.probe_front_end_core)")
    elif share is not None and dep.front_end_shares_core:
        applied["front_end_core"] = "every engine's steps, at the rate through that engine"
    elif share is not None:
        unused["front_end_core"] = "the deployment's front ends run on other cores (front_end_shares_core is off)"
    if bad:
        raise ValueError(f"the calibration's terms cannot carry to {dep}: "
                         + "; ".join(f"{term}: {why}" for term, why in bad.items())
                         + " (drop a term on purpose with Calibration.without, or `--without TERM` on the command line)")
    return Carry(applied, unused)


def check_terms(calibration: Calibration, deployment: str | Deployment) -> None:
    """Raise ValueError naming the calibration's terms that cannot carry to ``deployment``
    (:func:`carry`), or an unknown mode."""
    carry(calibration, deployment)


def engine_latencies(calibration: Calibration, deployment: str | Deployment, requests: Sequence[Request]
                     ) -> tuple[FittedLatency, FittedLatency, float]:
    """The rows each engine of ``deployment`` runs, with every term of ``calibration`` that carries
    to it (:func:`carry`), at the rate of ``requests``: (a colocated or prefill engine's, a decode
    engine's, the seconds each request spends before its engine: the run fit's front-end delay and
    the stall's off-engine part)."""
    dep = Deployment.of(deployment)
    carry(calibration, dep)
    run = calibration.run_fit or RunFit()
    first, off_engine_s = engine_latency(calibration)
    second = calibration.latency
    if dep.disaggregated and run.has_prefill_core_load:
        first = with_prefill_core_load(first, run, requests, engines=dep.prefill)
    if dep.front_end_shares_core:
        share = calibration.front_end_core
        first = with_front_end_core(first, share, requests, engines=dep.prefill if dep.disaggregated else dep.instances)
        second = with_front_end_core(second, share, requests, engines=dep.decode)
    return first, second, run.front_end_s + off_engine_s


def build_sim(deployment: str | Deployment, calibration: Calibration, *, latency: FittedLatency | None = None,
              decode_latency: FittedLatency | None = None, kv_capacity_tokens: int = 131072,
              token_budget: int = 2048, max_num_seqs: int = 128, handoff_reservation: str = "vllm",
              link_sharing: str = "fair", admit_overhead_s: float = 0.0):
    """A :class:`pdlab.sim.Simulator` of ``deployment`` (a :class:`Deployment`, or a mode: one
    engine or one pair), with ``calibration``'s hand-off and contention (``latency`` /
    ``decode_latency``: the rows the colocated or prefill engines and the decode engines run,
    default the calibration's).

    Colocated and chunked: ``instances`` engines behind the deployment's dispatch, vLLM V1
    scheduling = chunked prefill with ``token_budget`` (``--max-num-batched-tokens``) and
    ``max_num_seqs``. Disaggregated: the prefill and decode engines joined by the calibration's
    ``kv_link`` (instantaneous without one), and the hand-off physics of vLLM's NIXL connector
    (:mod:`pdlab.sim.engine`): a decode engine reserves the prompt's KV before the pull and starts
    none while ``max_num_seqs`` requests run (``handoff_reservation="vllm"``), concurrent pulls
    share the link (``link_sharing="fair"``), each engine is slowed by the others' work by the
    calibration's ``contention`` (all in one CPU group), and every handed-off request adds
    ``admit_overhead_s`` (s) to the decode step that admits it (default 0: the calibration's
    ``admission`` is recorded, charged only when passed here; on the course's 2-core CPU it moves
    with the machine's other load). Raises ValueError naming a term that cannot carry (:func:`carry`).
    """
    from pdlab.sim import ClusterSpec, KVLink, PoolSpec, build_cluster

    dep = Deployment.of(deployment)
    carry(calibration, dep)
    latency = latency or calibration.latency
    if not dep.disaggregated:
        pool = PoolSpec("colocated", count=dep.instances, latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                        options={"scheduler": "chunked", "token_budget": token_budget, "max_num_seqs": max_num_seqs,
                                 "max_batched_tokens": token_budget})
        return build_cluster(ClusterSpec([pool], dispatch=dep.dispatch or "round_robin"))
    link = calibration.kv_link
    kvl = KVLink(kv_bytes_per_token=1.0,
                 bandwidth_bytes_per_s=1.0 / link.s_per_token if link and link.s_per_token > 0 else None,
                 latency_s=link.latency_s if link else 0.0, sharing=link_sharing)
    cont = calibration.contention
    shared = {"prefill": cont.prefill if cont else 0.0, "decode": cont.decode if cont else 0.0}
    common = dict(token_budget=token_budget, max_num_seqs=max_num_seqs, max_batched_tokens=token_budget,
                  cpu_group="host" if any(shared.values()) else None)
    pools = [PoolSpec("prefill", count=dep.prefill, latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["prefill"]}),
             PoolSpec("decode", count=dep.decode, latency=decode_latency or calibration.latency,
                      kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["decode"], "admit_overhead_s": admit_overhead_s,
                               "handoff_reservation": handoff_reservation})]
    return build_cluster(ClusterSpec(pools, link=kvl, dispatch=dep.dispatch or "shortest_queue"))


def replay(requests: Sequence[Request], deployment: str | Deployment, calibration: Calibration | FittedLatency,
           **sim_options: Any) -> list[RequestRecord]:
    """Simulate ``requests`` on ``deployment`` (a :class:`Deployment`, or a mode name: one engine
    or one prefill/decode pair, the live set-ups of lab 05) with every term of ``calibration`` (a
    :class:`~pdlab.simreal.calibration.Calibration`; a bare fitted model is read as one) that
    carries to it (:func:`carry`), one record per request in order. ``sim_options``:
    :func:`build_sim`'s keywords (KV capacity, token budget, max_num_seqs, admission overhead, ...).

    - Each engine runs :func:`engine_latencies`'s rows: with a prefill stall, the engine's part of a
      prefill (:func:`engine_latency`) in colocated and prefill engines, the rest delaying each
      request before its engine; a pair's prefill core load stretches each prefill engine's row at
      the rate through it (:func:`with_prefill_core_load`); with the front ends on the engines'
      cores, the calibration's ``front_end_core`` stretches every engine (:func:`with_front_end_core`:
      prefill by the front end's whole share, decode by its per-request part).
    - Disaggregated: vLLM's proxy protocol — the prefill engine's token is discarded and decode
      generates all ``output_tokens``; each request is simulated with one more output token and its
      first token time is that of the first decode step (the token the client sees first).
    - The run fit's ``front_end_s``: each request reaches the simulated engine that much after it
      was sent, and its TTFT counts from the send.

    Raises ValueError naming a term that cannot carry to the deployment (:func:`carry`).
    """
    dep = Deployment.of(deployment)
    cal = calibration if isinstance(calibration, Calibration) else Calibration.from_latency(calibration)
    latency, decode_latency, front_end_s = engine_latencies(cal, dep, requests)
    sent = {r.request_id: r.arrival_s for r in requests}
    if front_end_s:
        requests = [replace(r, arrival_s=r.arrival_s + front_end_s) for r in requests]
    sim = build_sim(dep, cal, latency=latency, decode_latency=decode_latency, **sim_options)
    padded = dep.disaggregated      # decode generates every token the client sees
    runs = [replace(r, output_tokens=r.output_tokens + 1) for r in requests] if padded else list(requests)
    out = []
    for rec, req in zip(sim.run(runs).records, requests, strict=True):
        if padded:
            times = list(rec.token_times_s or [])
            if rec.ok and len(times) >= 2:
                rec = replace(rec, first_token_s=times[1], token_times_s=times[1:], output_tokens=req.output_tokens)
            else:
                rec = replace(rec, output_tokens=req.output_tokens)
        if front_end_s:
            rec = replace(rec, arrival_s=sent[req.request_id])
        out.append(rec)
    return out


def replay_pairs(live: Sequence[RequestRecord], sim: Sequence[RequestRecord]
                 ) -> list[tuple[RequestRecord, RequestRecord]]:
    """Each completed live request with its replay (:func:`replay` of
    :func:`requests_from_records` of ``live``), matched by the id the replay gave it (the live id
    when it is an int, else the request's place in send order); pairs where either side failed
    are left out."""
    by_id = {s.request_id: s for s in sim}
    out = []
    for i, r in enumerate(sorted(live, key=lambda r: r.arrival_s)):
        s = by_id.get(r.request_id if isinstance(r.request_id, int) else i)
        if r.ok and s is not None and s.ok:
            out.append((r, s))
    return out
