"""Stage 3 of sim-to-real: replay a live run's requests in the simulator, set up like the live
deployment and calibrated by one :class:`~pdlab.simreal.calibration.Calibration`.

:func:`replay` applies every term the calibration holds (the fitted rows, the KV hand-off, each
role's contention, the prefill stall, the run fit's front-end delay and prefill core load) and is
what both lab 05 and ``pdlab simulate --profile`` run, so one profile gives one answer.

Simulator set-ups mirror vLLM V1: a colocated server is Sarathi-style chunked batching with a
token budget (``--max-num-batched-tokens``, 2048 by default on CPU) and ``--max-num-seqs``; a
disaggregated deployment follows vLLM's proxy protocol, where the prefill server's one token is
discarded and the decode server generates every output token (so the first token the client sees
comes from decode, after the KV hand-off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from pdlab.metrics import RequestRecord
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibration import Calibration, RunFit
from pdlab.workloads import Request

__all__ = ["replay", "build_sim", "check_terms", "engine_latency", "with_prefill_core_load", "arrival_rate_rps",
           "requests_from_records", "server_prompt_tokens", "replay_pairs"]


def server_prompt_tokens(rec: RequestRecord) -> int:
    """The prompt's length as the server counted it (``usage.prompt_tokens``), else as requested."""
    return int(rec.server_prompt_tokens if rec.server_prompt_tokens is not None else rec.prompt_tokens)


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
        prompt = server_prompt_tokens(r) if use_server_tokens else r.prompt_tokens
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


def with_prefill_core_load(latency: FittedLatency, run_fit: RunFit, requests: Sequence[Request]) -> FittedLatency:
    """``latency`` with its prefill row stretched by ``1 / (1 − u)``: ``u`` = the share of the
    prefill role's core its co-runners (API servers, proxy, client) take while requests are in
    flight, ``run_fit.prefill_core_base_cores`` + the requests' rate (:func:`arrival_rate_rps`) ×
    ``run_fit.prefill_core_cpu_s_per_request``. A prefill of ``T`` seconds of compute that shares
    the core with work arriving at ``u`` cores gets the rest of it, so it ends after ``T / (1 − u)``.
    Unchanged without a load; ValueError when ``u`` >= 1 (the co-runners alone would need the
    whole core)."""
    if not run_fit.has_prefill_core_load:
        return latency
    base, cpu_s = run_fit.prefill_core_base_cores, run_fit.prefill_core_cpu_s_per_request
    u = base + arrival_rate_rps(requests) * cpu_s
    if u >= 1:
        raise ValueError(f"the prefill core's co-runners would need {u:.2f} cores at this rate "
                         f"({base:.2f} cores + {cpu_s * 1e3:.1f} ms of CPU per request): the model needs u < 1")
    return latency.derive(prefill_scale=1.0 / (1.0 - u))


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


#: Terms each set-up's replay applies (profile keys, :data:`pdlab.simreal.calibration.TERM_KEYS`).
_APPLIES = {"colocated": {"prefill_stall", "run_fit"},
            "disaggregated": {"kv_link", "cpu_contention", "run_fit"}}


def check_terms(calibration: Calibration, mode: str) -> None:
    """Raise ValueError naming the calibration's terms that the replay of ``mode`` cannot apply
    (a hand-off, contention or prefill core load on one colocated server; a one-server prefill
    stall on a pair), or an unknown ``mode``."""
    if mode not in _APPLIES:
        raise ValueError(f"mode must be colocated or disaggregated, got {mode!r}")
    bad = [t for t in calibration.terms() if t not in _APPLIES[mode]]
    if mode == "colocated" and calibration.run_fit is not None and calibration.run_fit.has_prefill_core_load:
        bad.append("run_fit.prefill_core (a pair's prefill core)")
    if bad:
        raise ValueError(f"the {mode} replay cannot apply the calibration's {', '.join(bad)} "
                         f"(it applies {', '.join(sorted(_APPLIES[mode]))})")


def build_sim(mode: str, calibration: Calibration, *, latency: FittedLatency | None = None,
              decode_latency: FittedLatency | None = None, kv_capacity_tokens: int = 131072,
              token_budget: int = 2048, max_num_seqs: int = 128, handoff_reservation: str = "vllm",
              link_sharing: str = "fair", admit_overhead_s: float = 0.0):
    """A :class:`pdlab.sim.Simulator` shaped like the live set-up, with ``calibration``'s hand-off
    and contention (``latency`` / ``decode_latency``: the rows each role runs, default the
    calibration's).

    ``colocated``: one instance, vLLM V1 scheduling = chunked prefill with ``token_budget``
    (``--max-num-batched-tokens``) and ``max_num_seqs``. ``disaggregated``: one prefill and one
    decode instance joined by the calibration's ``kv_link`` (instantaneous without one), and the
    hand-off physics of vLLM's NIXL connector (:mod:`pdlab.sim.engine`): the decode instance
    reserves the prompt's KV before the pull and starts none while ``max_num_seqs`` requests run
    (``handoff_reservation="vllm"``), concurrent pulls share the link (``link_sharing="fair"``),
    each role is slowed by the other's work by the calibration's ``contention``, and every
    handed-off request adds ``admit_overhead_s`` (s) to the decode step that admits it (default 0:
    the calibration's ``admission`` is recorded, charged only when passed here; on the course's
    2-core CPU it moves with the machine's other load).
    """
    from pdlab.sim import ClusterSpec, KVLink, PoolSpec, build_cluster

    check_terms(calibration, mode)
    latency = latency or calibration.latency
    if mode == "colocated":
        pool = PoolSpec("colocated", latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                        options={"scheduler": "chunked", "token_budget": token_budget, "max_num_seqs": max_num_seqs,
                                 "max_batched_tokens": token_budget})
        return build_cluster(ClusterSpec([pool], dispatch="round_robin"))
    link = calibration.kv_link
    kvl = KVLink(kv_bytes_per_token=1.0,
                 bandwidth_bytes_per_s=1.0 / link.s_per_token if link and link.s_per_token > 0 else None,
                 latency_s=link.latency_s if link else 0.0, sharing=link_sharing)
    cont = calibration.contention
    shared = {"prefill": cont.prefill if cont else 0.0, "decode": cont.decode if cont else 0.0}
    common = dict(token_budget=token_budget, max_num_seqs=max_num_seqs, max_batched_tokens=token_budget,
                  cpu_group="host" if any(shared.values()) else None)
    pools = [PoolSpec("prefill", latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["prefill"]}),
             PoolSpec("decode", latency=decode_latency or calibration.latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["decode"], "admit_overhead_s": admit_overhead_s,
                               "handoff_reservation": handoff_reservation})]
    return build_cluster(ClusterSpec(pools, link=kvl, dispatch="shortest_queue"))


def replay(requests: Sequence[Request], mode: str, calibration: Calibration | FittedLatency,
           **sim_options: Any) -> list[RequestRecord]:
    """Simulate ``requests`` in the set-up ``mode`` with every term of ``calibration`` (a
    :class:`~pdlab.simreal.calibration.Calibration`; a bare fitted model is read as one), one
    record per request in order. ``sim_options``: :func:`build_sim`'s keywords (KV capacity,
    token budget, max_num_seqs, admission overhead, ...).

    - Disaggregated: vLLM's proxy protocol — the prefill instance's token is discarded and decode
      generates all ``output_tokens``; each request is simulated with one more output token and its
      first token time is that of the first decode step (the token the client sees first). A run
      fit's prefill core load stretches the prefill role's row at these requests' rate
      (:func:`with_prefill_core_load`); the decode role keeps the calibration's row.
    - Colocated, with a prefill stall: the engine runs :func:`engine_latency`'s model and each
      request reaches it ``off_engine_s`` later.
    - The run fit's ``front_end_s``: each request reaches the simulated engine that much after it
      was sent, and its TTFT counts from the send.

    Raises ValueError naming a term the set-up cannot apply (:func:`check_terms`).
    """
    cal = calibration if isinstance(calibration, Calibration) else Calibration.from_latency(calibration)
    check_terms(cal, mode)
    run = cal.run_fit or RunFit()
    front_end_s, latency, decode_latency = run.front_end_s, cal.latency, None
    if mode == "colocated":
        latency, off_engine_s = engine_latency(cal)
        front_end_s += off_engine_s
    elif run.has_prefill_core_load:
        latency, decode_latency = with_prefill_core_load(cal.latency, run, requests), cal.latency
    sent = {r.request_id: r.arrival_s for r in requests}
    if front_end_s:
        requests = [replace(r, arrival_s=r.arrival_s + front_end_s) for r in requests]
    sim = build_sim(mode, cal, latency=latency, decode_latency=decode_latency, **sim_options)
    padded = mode == "disaggregated"      # decode generates every token the client sees
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
