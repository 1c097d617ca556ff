"""Live probes of one running engine, the first stage of sim-to-real (lab 05, ``pdlab sim calibrate``).

Single prompts of L tokens with ``max_tokens=1`` give the prefill step time (their TTFT); N
concurrent streams of P-token prompts with O output tokens give the decode step time at batch N
(their token gaps while all N decode); streams decoding while single prompts arrive give what a
prefill costs them. Every probe goes through the course's benchmark client
(:func:`pdlab.serve.client.bench.run_bench`, here :func:`bench_records`) with random
single-token-word prompts (no prefix-cache hits) and the server's own token counts, and returns
typed points: :class:`PrefillPoint`, :class:`DecodePoint`, :class:`StallPoint`. The probes of a
prefill/decode pair are :mod:`pdlab.serve.pair_probes`. The probes measure and fit nothing:
:mod:`pdlab.simreal.probes` runs a plan of them and fits the points (``calibrate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdlab.metrics import RequestRecord
from pdlab.workloads import Request

__all__ = ["PrefillPoint", "DecodePoint", "StallPoint", "bench_records", "probe_prefill", "decode_window", "mean_itl",
           "decoding_together", "probe_decode", "prefill_stalls", "probe_prefill_stall", "server_context_tokens",
           "server_kv_capacity_tokens"]


# ---------------------------------------------------------------------------------------------
# Points


@dataclass(frozen=True)
class PrefillPoint:
    """One prompt length of the prefill probe: ``tokens`` (the server's count), ``time_s`` the median
    TTFT of ``samples`` single prompts (s), ``times_s`` every sample's TTFT (s)."""

    tokens: int
    time_s: float
    samples: int
    times_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class DecodePoint:
    """One (batch, prompt) pair of the decode probe: ``batch`` streams of ``prompt_tokens``-token prompts
    decoding together; ``time_s`` the mean gap between consecutive tokens (one decode step, s) over
    ``samples`` gaps; ``ctx_tokens`` the tokens those steps read in all (batch × mean context)."""

    batch: int
    ctx_tokens: float
    time_s: float
    samples: int
    prompt_tokens: int


@dataclass(frozen=True)
class StallPoint:
    """One prompt prefilled while streams decode: its length (the server's count, tokens), its TTFT (s)
    and ``stall_s``, the streams' mean delay past their own steps (s)."""

    prompt_tokens: float
    ttft_s: float
    stall_s: float


# ---------------------------------------------------------------------------------------------
# Probes (live)


def bench_records(url: str, requests: list[Request], *, seed: int, max_concurrency: int | None = None,
                  **kwargs: Any) -> list[RequestRecord]:
    """``requests`` sent to ``url`` by the course's benchmark client; RuntimeError if any failed."""
    from pdlab.serve.client.bench import run_bench

    res = run_bench(url, requests, progress=False, seed=seed, max_concurrency=max_concurrency, **kwargs)
    bad = [r.error for r in res.records if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(res.records)} probe requests to {url} failed: {bad[0]}")
    return res.records


def probe_prefill(url: str, lengths: Sequence[int], *, repeats: int = 3, seed: int = 0,
                  **bench_kwargs: Any) -> list[PrefillPoint]:
    """Prefill points: one prompt at a time of each length, ``max_tokens=1``; time = median TTFT (s).

    Requests are sent one after another (never overlapping) in a shuffled order, so slow drift
    of the machine spreads over all lengths.
    """
    order = [int(x) for x in lengths for _ in range(repeats)]
    np.random.default_rng(seed).shuffle(order)
    reqs = [Request(i, 0.0, n, 1) for i, n in enumerate(order)]
    recs = bench_records(url, reqs, seed=seed, max_concurrency=1, **bench_kwargs)
    by_len: dict[int, list[RequestRecord]] = {}
    for rec in recs:
        by_len.setdefault(rec.prompt_tokens, []).append(rec)
    points = []
    for n in sorted(by_len):
        group = by_len[n]
        tokens = int(np.median([r.counted_prompt_tokens for r in group]))
        times = [float(r.ttft_s) for r in group]
        points.append(PrefillPoint(tokens, float(np.median(times)), samples=len(group), times_s=tuple(times)))
    return points


def decode_window(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """[last first token, first finish] (s): the span in which every stream of a probe decodes."""
    return max(r.first_token_s for r in records), min(r.finish_s for r in records)


def _window_gaps(rec: RequestRecord, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Token gaps (s) of ``rec`` with both ends in [start_s, end_s], and the index k of each gap's
    first token (the gap from token k to k + 1)."""
    times = np.asarray(rec.token_times_s or [], dtype=float)
    k = np.flatnonzero((times[:-1] >= start_s) & (times[1:] <= end_s))
    return times[k + 1] - times[k], k


def mean_itl(records: Sequence[RequestRecord], start_s: float, end_s: float) -> tuple[float, int]:
    """Mean gap between consecutive tokens of ``records`` whose both ends lie in [start_s, end_s] (s), count."""
    gaps = np.concatenate([_window_gaps(rec, start_s, end_s)[0] for rec in records])
    return (float(gaps.mean()) if len(gaps) else float("nan")), int(len(gaps))


def decoding_together(url: str, b: int, p: int, output_tokens: int, *, seed: int, attempts: int = 3,
                       **bench_kwargs: Any) -> tuple[list[float], list[float]]:
    """Token gaps (s) of ``b`` concurrent ``p``-token streams while all decode, and each gap's
    context (prompt + k tokens). A run whose gaps add up to 0 s — the client was descheduled and
    read every token of the window in one burst, so its clock saw no steps — is sent again, up to
    ``attempts`` times, then a RuntimeError names the problem (a 0 s step would reach the fit)."""
    for attempt in range(attempts):
        reqs = [Request(j, 0.0, int(p), int(output_tokens)) for j in range(int(b))]
        recs = bench_records(url, reqs, seed=seed + 7919 * attempt, **bench_kwargs)
        start, end = decode_window(recs)
        gaps: list[float] = []
        ctx: list[float] = []
        for rec in recs:
            g, k = _window_gaps(rec, start, end)
            gaps += list(g)
            ctx += list(rec.counted_prompt_tokens + k)
        if not gaps or sum(gaps) > 0:  # no gaps at all: the caller says the window was too short
            return gaps, ctx
    raise RuntimeError(f"decode probe b={b}, p={p}: in {attempts} runs the client read every token of the decode "
                       f"window in one burst (0 s of gaps); the machine is too busy to time steps from the client")


def probe_decode(url: str, pairs: Sequence[tuple[int, int]], *, output_tokens: int = 64, repeats: int = 2,
                 seed: int = 0, **bench_kwargs: Any) -> list[DecodePoint]:
    """Decode points: ``b`` concurrent streams of ``p``-token prompts generating ``output_tokens``.

    time = mean gap between consecutive tokens while all ``b`` streams decode (s; the span from the
    last stream's first token to the first stream's end, :func:`decode_window`), over streams and
    repeats: the step time of a pure decode batch of ``b``. Prompts that the server prefills over
    several steps (b·p above its ``--max-num-batched-tokens``) are outside the span, so mixed steps
    never enter. ``decode_ctx_tokens`` = b × the mean context of those steps: the gap from token
    k to k + 1 (k from 0) is the step that reads p + k tokens (the simulator's accounting,
    :mod:`pdlab.sim.engine`). A repeat the client read in one burst is sent again
    (:func:`decoding_together`).
    """
    points = []
    for i, (b, p) in enumerate(pairs):
        gaps, ctx = [], []
        for r in range(repeats):
            g, c = decoding_together(url, b, p, output_tokens, seed=seed + 1000 * i + r, **bench_kwargs)
            gaps += g
            ctx += c
        if len(gaps) < 2 * int(b):
            raise RuntimeError(f"decode probe b={b}, p={p}: the {b} streams decoded together for fewer than 2 "
                               f"steps; raise decode_tokens (now {output_tokens})")
        points.append(DecodePoint(int(b), float(b * np.mean(ctx)), float(np.mean(gaps)), samples=len(gaps),
                                  prompt_tokens=int(p)))
    return points


def prefill_stalls(records: Sequence[RequestRecord], injected_ids: Sequence[int | str], *,
                   margin_steps: int = 3, neighbours: int = 20) -> list[StallPoint]:
    """What each injected prefill cost the streams decoding around it, from one client run.

    ``records``: the run's requests, long streams and the injected prefills (``injected_ids``,
    each ``max_tokens=1``). A stream's gaps are per step (a chunk of n tokens spans n steps); a
    gap is busy when it overlaps an injected request's window, send to first token +
    ``margin_steps`` steps. For each injected request and stream, the stall is the time from the
    stream's last token before the send to its first token after the window, minus the steps in
    between at the stream's local step: the median of the ``neighbours`` free gaps on each side
    (the step grows with the context as a stream decodes). Each :class:`StallPoint` holds the
    streams' mean stall and the prompt's own length and TTFT. A stream that does not
    span an injection on both sides (it started later or ended sooner) is left out of its row;
    with no stream left, no row."""
    injected = set(injected_ids)
    inj = [r for r in records if r.request_id in injected and r.ok and r.first_token_s is not None]
    streams = []
    for rec in records:
        if rec.request_id in injected or not rec.ok or not rec.token_times_s or len(rec.token_times_s) < 3:
            continue
        t = np.asarray(rec.token_times_s, dtype=float)
        steps = np.maximum(np.asarray(rec.chunk_tokens if rec.chunk_tokens else [1] * len(t), dtype=float), 1.0)
        per_step = np.diff(t) / steps[1:]
        busy = np.zeros(len(per_step), bool)
        typical = float(np.median(per_step))
        for r in inj:
            busy |= (t[1:] > r.arrival_s) & (t[:-1] < r.first_token_s + margin_steps * typical)
        streams.append((t, np.concatenate([[0.0], np.cumsum(steps[1:])]), per_step, busy, typical))
    rows = []
    for r in inj:
        per = []
        for t, steps_before, per_step, busy, typical in streams:
            i0 = int(np.searchsorted(t, r.arrival_s)) - 1
            i1 = int(np.searchsorted(t, r.first_token_s + margin_steps * typical))
            if i0 < 0 or i1 >= len(t):
                continue
            free = np.flatnonzero(~busy)
            near = np.concatenate([free[free < i0][-neighbours:], free[free >= i1][:neighbours]])
            base = float(np.median(per_step[near])) if len(near) >= 5 else typical
            per.append((t[i1] - t[i0]) - (steps_before[i1] - steps_before[i0]) * base)
        if per:
            rows.append(StallPoint(float(r.counted_prompt_tokens), float(r.ttft_s), float(np.mean(per))))
    return rows


def probe_prefill_stall(url: str, lengths: Sequence[int], *, streams: int = 4, stream_prompt: int = 256,
                        stream_tokens: int = 1024, rounds: int = 2, spacing_s: float = 0.25, start_s: float = 1.0,
                        seed: int = 0, **bench_kwargs: Any) -> list[StallPoint]:
    """How long one prefill holds up the streams a server is decoding (:func:`prefill_stalls` points).

    Each of ``rounds`` rounds is one client run: ``streams`` streams of ``stream_prompt``-token
    prompts generating ``stream_tokens`` tokens from t = 0, and from ``start_s`` one prompt of each
    of ``lengths`` (shuffled; ``max_tokens=1``) every ``spacing_s`` seconds. Fresh prompt text every
    round (no prefix-cache hits). ``stream_tokens`` must keep the streams decoding past the last
    prefill; a RuntimeError says so when no prefill could be timed."""
    if streams < 1 or rounds < 1 or not lengths:
        raise ValueError(f"need streams >= 1, rounds >= 1 and some lengths, got {streams}, {rounds}, {list(lengths)}")
    rng = np.random.default_rng(seed)
    rows: list[StallPoint] = []
    for k in range(rounds):
        reqs = [Request(j, 0.0, int(stream_prompt), int(stream_tokens)) for j in range(streams)]
        order = [int(x) for x in rng.permutation(np.asarray(lengths))]
        reqs += [Request(streams + i, start_s + i * spacing_s, p, 1) for i, p in enumerate(order)]
        recs = bench_records(url, reqs, seed=seed + 31 * k, **bench_kwargs)
        rows += prefill_stalls(recs, [r.request_id for r in reqs[streams:]])
    if not rows:
        raise RuntimeError(f"prefill stall probe: the {streams} streams of {stream_tokens} tokens ended before any "
                           "prefill could be timed; raise stream_tokens")
    return rows


def server_context_tokens(url: str) -> int | None:
    """The context length (tokens) a vLLM server accepts, ``max_model_len`` of its ``GET /v1/models``;
    None where the server does not say."""
    from pdlab.serve.client.bench import server_models

    try:
        data = server_models(url)
    except (OSError, KeyError, TypeError, ValueError):
        return None
    lens = [int(m["max_model_len"]) for m in data if isinstance(m, dict) and m.get("max_model_len")]
    return min(lens) if lens else None


def server_kv_capacity_tokens(url: str, default: int | None = None) -> int:
    """KV tokens a vLLM server holds: ``num_gpu_blocks × block_size`` from ``vllm:cache_config_info``
    (:meth:`~pdlab.serve.measure.evidence.MetricsSnapshot.kv_capacity_tokens`); ``default`` when the
    server does not say, ValueError without one."""
    from pdlab.serve.measure.evidence import scrape_metrics

    try:
        tokens = scrape_metrics(url, timeout_s=10).kv_capacity_tokens()
    except OSError:
        tokens = None
    if tokens is not None:
        return tokens
    if default is None:
        raise ValueError(f"{url}/metrics has no vllm:cache_config_info with num_gpu_blocks and block_size")
    return default
