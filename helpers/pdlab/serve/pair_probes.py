"""Live probes of a prefill/decode pair (lab 05, ``pdlab sim calibrate``): the KV hand-off through a
disaggregation proxy (:func:`probe_handoff`), each role's slowdown while the other works
(:func:`probe_contention`, measured with :func:`while_running`) and what each handed-off request
costs the streams already decoding (:func:`probe_admission`). They return what they timed
(:class:`HandoffPoint`, :class:`ContentionTimes`, :class:`AdmissionTimes`) and fit nothing:
:mod:`pdlab.simreal.probes` turns the times into the simulator's terms. The one-server probes are
:mod:`pdlab.serve.probes`; every request goes through its :func:`~pdlab.serve.probes.bench_records`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from pdlab.metrics import RequestRecord
from pdlab.serve import probes as one
from pdlab.workloads import Request

T = TypeVar("T")

__all__ = ["HandoffPoint", "ContentionTimes", "AdmissionTimes", "probe_handoff", "while_running", "probe_contention",
           "probe_admission"]


@dataclass(frozen=True)
class HandoffPoint:
    """One prompt length through the proxy: ``tokens`` (the server's count), ``ttft_s`` the median TTFT
    of ``samples`` single prompts (s), ``prefill_leg_s`` the median of the proxy's ``X-Prefill-Seconds``
    (s; None where a request came back without one)."""

    tokens: int
    ttft_s: float
    samples: int
    prefill_leg_s: float | None = None


@dataclass(frozen=True)
class ContentionTimes:
    """What :func:`probe_contention` timed (s): a ``prompt_tokens``-token prefill alone and while the decode
    side works (``prefill_background`` says how), and the decode step of ``decode_streams`` streams alone
    and while prompts are prefilled."""

    prompt_tokens: int
    decode_streams: int
    prefill_alone_s: float
    prefill_busy_s: float
    decode_alone_s: float
    decode_busy_s: float
    prefill_background: str


@dataclass(frozen=True)
class AdmissionTimes:
    """What :func:`probe_admission` timed: the mean token gap (s) of ``streams`` streams of
    ``stream_prompt``-token prompts alone (``itl_alone_s``) and while ``side_requests`` prompts of
    ``side_prompt`` tokens arrived through the proxy one every ``period_s`` (``itl_busy_s``, over
    ``gaps_busy`` gaps)."""

    streams: int
    stream_prompt: int
    side_prompt: int
    side_requests: int
    period_s: float
    itl_alone_s: float
    itl_busy_s: float
    gaps_busy: int


def probe_handoff(proxy_url: str, lengths: Sequence[int], *, repeats: int = 3, warmup: int = 0, seed: int = 0,
                  **bench_kwargs: Any) -> list[HandoffPoint]:
    """TTFT through a disaggregation proxy of single prompts, ``max_tokens=1``: one :class:`HandoffPoint`
    per length (medians), with the proxy's prefill leg where every request of the length carried one.

    Through the proxy a request is prefilled (one token, discarded), its KV is handed to the
    decode server, which generates the first token the client sees. Subtracting the prefill leg
    (or, without one, the fitted prefill) and one decode step
    (:func:`pdlab.simreal.fit.fit_handoff`) leaves the hand-off: proxy, KV transfer, decode-side work.
    ``warmup`` untimed passes over the lengths (other prompt text) go first: a fresh pair's first
    hand-offs of each length are slower.
    """
    if warmup:
        warm = [Request(i, 0.0, int(n), 1) for i, n in enumerate(int(x) for x in lengths for _ in range(warmup))]
        one.bench_records(proxy_url, warm, seed=seed + 8, max_concurrency=1, **bench_kwargs)
    order = [int(x) for x in lengths for _ in range(repeats)]
    np.random.default_rng(seed).shuffle(order)
    reqs = [Request(i, 0.0, n, 1) for i, n in enumerate(order)]
    recs = one.bench_records(proxy_url, reqs, seed=seed + 7, max_concurrency=1, **bench_kwargs)
    by_len: dict[int, list[RequestRecord]] = {}
    for rec in recs:
        by_len.setdefault(rec.prompt_tokens, []).append(rec)
    rows = []
    for _, g in sorted(by_len.items()):
        leg = float(np.median([r.extra["prefill_leg_s"] for r in g])) if all("prefill_leg_s" in r.extra for r in g) \
            else None
        rows.append(HandoffPoint(int(np.median([r.counted_prompt_tokens for r in g])),
                                 float(np.median([r.ttft_s for r in g])), len(g), leg))
    return rows


def while_running(background: Callable[[int], Any], measure: Callable[[], T], *, settle_s: float = 0.5,
                  first_tag: int = 100, join_timeout_s: float = 120.0, label: str = "measurement") -> T:
    """``measure()``, started ``settle_s`` after ``background(tag)`` began running in a loop on a thread
    (``tag`` = ``first_tag``, ``first_tag`` + 1, …: a seed offset per round, so no prompt repeats). The
    loop ends after the round under way when ``measure`` returns; an exception in the background is
    raised here (RuntimeError naming ``label`` and it), after the thread ended."""
    import threading

    stop, errors = threading.Event(), []

    def loop() -> None:
        k = first_tag
        while not stop.is_set():
            try:
                background(k)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the thread ends
                errors.append(exc)
                return
            k += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        time.sleep(settle_s)   # the background work is under way
        return measure()
    finally:
        stop.set()
        worker.join(timeout=join_timeout_s)
        if errors:
            raise RuntimeError(f"{label}: background load failed: {errors[0]}") from errors[0]


def probe_contention(prefill_url: str, decode_url: str, *, prompt_tokens: int = 1024, repeats: int = 3,
                     decode_streams: int = 16, decode_prompt: int = 256, decode_tokens: int = 48, seed: int = 0,
                     proxy_url: str | None = None, renewed_streams: int = 1, **bench_kwargs: Any) -> ContentionTimes:
    """How much each role slows down while the other one works (two servers on one host).

    Prefill: the median TTFT of ``repeats`` single ``prompt_tokens``-token prompts, alone and
    while ``decode_streams`` streams decode on ``decode_url``. Decode: the decode step of
    ``decode_streams`` streams (their mean token gap while all decode, as :func:`probe_decode`),
    alone and while prompts are prefilled back to back on ``prefill_url``. Returns the times
    (:class:`ContentionTimes`); :mod:`pdlab.simreal.probes` turns them into each role's
    ``cpu_contention`` of the simulator (max(0, busy/alone − 1)). Measured, not fitted:
    on the course's 2-core CPU the roles are pinned to a core each but share the last-level
    cache, memory bandwidth and the cores' other processes (API servers, proxy, client).

    With ``proxy_url`` (the pair's proxy) the prefill side is measured as a workload meets it: the
    proxy's prefill legs (``X-Prefill-Seconds``) of the same prompts sent through it, alone and
    while ``renewed_streams`` short streams at a time (16-token prompts, 64 tokens) go through the
    proxy, each replaced as it ends. On the course's CPU pair (AMD EPYC type) a stream slows a
    prefill in its first second or two (c_p 0.21 half a second after it was sent, 0.00 after 2.5 s),
    so streams that keep starting, as a workload's do, slow it steadily (0.21–0.33 by run), and the
    old background of 16 streams at once landed in either of its phases (0.03–0.85):
    ``notes/sim-to-real/contention_phase.py``.
    """
    def prefills(tag: int) -> float:
        reqs = [Request(i, 0.0, int(prompt_tokens), 1) for i in range(repeats)]
        recs = one.bench_records(proxy_url or prefill_url, reqs, seed=seed + tag, max_concurrency=1, **bench_kwargs)
        if proxy_url is None:
            return float(np.median([r.ttft_s for r in recs]))
        legs = [r.extra.get("prefill_leg_s") for r in recs]
        if any(leg is None for leg in legs):
            raise RuntimeError(f"contention probe: {proxy_url} answered without X-Prefill-Seconds; "
                               "probe without proxy_url, or through the course proxy")
        return float(np.median(legs))

    def renewed(tag: int) -> None:
        # 8 per stream: one client call lasts seconds, so the timed prefills never meet a call's start
        reqs = [Request(j, 0.0, 16, 64) for j in range(8 * int(renewed_streams))]
        one.bench_records(proxy_url, reqs, seed=seed + tag, max_concurrency=int(renewed_streams), **bench_kwargs)

    def decodes(tag: int) -> float:
        gaps, _ = one.decoding_together(decode_url, decode_streams, decode_prompt, decode_tokens, seed=seed + tag,
                                     **bench_kwargs)
        if not gaps:
            raise RuntimeError("contention probe: the decode streams never decoded together; raise decode_tokens")
        return float(np.mean(gaps))

    if proxy_url is not None and renewed_streams < 1:
        raise ValueError(f"renewed_streams must be >= 1, got {renewed_streams}")
    prefill_alone = prefills(1)
    prefill_busy = while_running(renewed if proxy_url else decodes, lambda: prefills(50), label="contention probe")
    decode_alone = decodes(2)
    decode_busy = while_running(lambda tag: one.bench_records(prefill_url, [Request(i, 0.0, int(prompt_tokens), 1)
                                                                 for i in range(repeats)], seed=seed + tag,
                                                   max_concurrency=1, **bench_kwargs), lambda: decodes(50),
                                label="contention probe")
    background = (f"{renewed_streams} renewed stream{'s' if renewed_streams > 1 else ''} through the proxy"
                  if proxy_url else f"{decode_streams} streams decoding")
    return ContentionTimes(prompt_tokens=int(prompt_tokens), decode_streams=int(decode_streams),
                           prefill_alone_s=prefill_alone, prefill_busy_s=prefill_busy, decode_alone_s=decode_alone,
                           decode_busy_s=decode_busy, prefill_background=background)


def _stream_tokens(need_s: float, step_s: float, most: int | None) -> int:
    """Output tokens that keep a stream decoding ``need_s`` at ``step_s`` a step, at most ``most``."""
    tokens = int(np.ceil(need_s / step_s)) + 8
    return min(tokens, most) if most else tokens


def _span_s(records: Sequence[RequestRecord]) -> float:
    """Seconds from a run's first send to its last finish."""
    return max(r.finish_s or 0.0 for r in records) - min(r.arrival_s for r in records)


def probe_admission(proxy_url: str, decode_url: str, *, streams: int = 8, stream_prompt: int = 256,
                    side_prompt: int = 16, side_requests: int = 12, period_s: float = 0.4, seed: int = 0,
                    **bench_kwargs: Any) -> AdmissionTimes:
    """Seconds each request handed off through the proxy takes from the streams already decoding.

    ``streams`` streams of ``stream_prompt``-token prompts decode on ``decode_url``: alone, then
    while ``side_requests`` ``side_prompt``-token prompts (``max_tokens=1``) arrive through the
    proxy one every ``period_s``, then alone again. If each arrival stretches one decode step by
    ``F`` seconds, the mean inter-token gap during the side traffic is m1 = m0·T/(T − F), so
    F = T·(1 − m0/m1), with m0 the mean of the two runs alone (bracketing drift). Short side
    prompts keep the prefill role's own contention out (a 16-token prefill is a few ms), so F is
    the per-request work on the decode role's cores that a step-time model does not see: the
    decode API server's HTTP and tokenisation of the prompt, the connector's bookkeeping, and on
    a shared CPU the proxy's and the client's work. Returns the times (:class:`AdmissionTimes`);
    :func:`pdlab.simreal.fit.admission_overhead_s` solves them for F, the simulator's
    ``InstanceSpec.admit_overhead_s`` (floored at 0).
    """
    import threading

    first = one.bench_records(decode_url, [Request(i, 0.0, int(stream_prompt), 48) for i in range(streams)], seed=seed,
                   **bench_kwargs)
    alone0, _ = one.mean_itl(first, *one.decode_window(first))
    if not np.isfinite(alone0):
        raise RuntimeError("admission probe: no decode stream produced more than one token")
    context = one.server_context_tokens(decode_url)
    most_tokens = context - int(stream_prompt) - 8 if context else None

    def streams_run(tag: int) -> list[RequestRecord]:
        return one.bench_records(decode_url, [Request(i, 0.0, int(stream_prompt), tokens) for i in range(streams)],
                      seed=seed + tag, **bench_kwargs)

    # The streams must outlast the side traffic (it starts 0.5 s in) with a margin. The first run's
    # 48 tokens can overstate the step (a cold first step weighs on so few), so the first full-length
    # run is timed too and, if it ended early, the streams are lengthened by what it fell short;
    # where the context caps them, fewer side requests are sent, not fewer than 3.
    need_s = side_requests * period_s + 2.0
    tokens = _stream_tokens(need_s, alone0, most_tokens)
    before = streams_run(1)
    lasted = _span_s(before)
    if lasted < need_s:
        tokens = _stream_tokens(need_s * 1.2, lasted / max(tokens, 1), most_tokens)
        before = streams_run(4)
        lasted = _span_s(before)
    if lasted < need_s:
        side_requests = max(3, min(side_requests, int((lasted - 2.0) / period_s)))
    span = side_requests * period_s

    side: list[RequestRecord] = []
    errors: list[BaseException] = []

    def side_traffic() -> None:
        reqs = [Request(i, 0.5 + i * period_s, int(side_prompt), 1) for i in range(side_requests)]
        try:
            side.extend(one.bench_records(proxy_url, reqs, seed=seed + 77, **bench_kwargs))
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the thread ends
            errors.append(exc)

    worker = threading.Thread(target=side_traffic, daemon=True)
    worker.start()
    busy = streams_run(2)
    worker.join(timeout=120)
    after = streams_run(3)
    if errors or len(side) != side_requests:
        why = errors[0] if errors else f"{len(side)} of {side_requests} side requests ran"
        raise RuntimeError(f"admission probe: side requests through {proxy_url} failed: {why}")
    first_side = min(r.arrival_s for r in side)
    window_end = first_side + span
    if max(r.finish_s or 0.0 for r in busy) < window_end:
        raise RuntimeError("admission probe: the decode streams ended before the side traffic; raise side_requests "
                           "or lower period_s")
    m_busy, n_busy = one.mean_itl(busy, first_side, window_end)
    m_alone = float(np.nanmean([one.mean_itl(run, *one.decode_window(run))[0] for run in (before, after)]))
    return AdmissionTimes(streams=int(streams), stream_prompt=int(stream_prompt), side_prompt=int(side_prompt),
                          side_requests=int(side_requests), period_s=float(period_s), itl_alone_s=m_alone,
                          itl_busy_s=m_busy, gaps_busy=n_busy)
