"""Live probes of a running engine for sim-to-real calibration (lab 05, ``pdlab sim calibrate``).

Single prompts of L tokens with ``max_tokens=1`` give the prefill step time (their TTFT); N
concurrent streams of P-token prompts with O output tokens give the decode step time at batch N
(their token gaps while all N decode). The probes of a pair (KV hand-off through a proxy, each role's
slowdown while the other works, what a hand-off costs the running streams) are in
:mod:`pdlab.serve.pair_probes` and re-exported here. All go through
the course's benchmark client (:func:`pdlab.serve.client.bench.run_bench`) with random single-token-word
prompts (no prefix-cache hits) and the server's own token counts. :func:`calibrate` runs a
:class:`ProbePlan` and fits the result with the fit stage, :mod:`pdlab.simreal.fit`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

from pdlab.metrics import RequestRecord
from pdlab.simreal.calibration import Calibration, PrefillStall, StepPoint
from pdlab.simreal.fit import (
    fit_handoff,
    fit_prefill_stall,
    fit_profile,
    merge_prefill_points,
)
from pdlab.simreal.replay import server_prompt_tokens
from pdlab.workloads import Request

T = TypeVar("T")

__all__ = ["ProbePlan", "PROBE_PLANS", "probe_prefill", "probe_decode", "decode_window", "probe_handoff",
           "probe_contention", "while_running", "probe_admission", "prefill_stalls", "probe_prefill_stall", "calibrate",
           "server_context_tokens", "server_kv_capacity_tokens", "bench_records", "decoding_together", "mean_itl"]

# ---------------------------------------------------------------------------------------------
# Probe plans


@dataclass(frozen=True)
class ProbePlan:
    """What to measure. Lengths in tokens; every point keeps the median of its samples.

    Prefill: each of ``prefill_lengths`` ``repeats`` times, one request at a time. Decode: ``b``
    concurrent streams of ``p``-token prompts for every pair with b·p ≤ ``max_probe_tokens`` (the
    KV one probe holds), each generating ``decode_tokens`` tokens, ``decode_repeats`` times; the
    step time is read while all ``b`` decode together (:func:`probe_decode`), so the pairs can
    cover the batches and contexts a workload reaches, not only prompts that fit one prefill step. Hand-off: each of ``handoff_lengths``
    ``repeats`` times through the proxy. Contention (two servers only): prefills of
    ``contention_prompt`` tokens and decode streams, each alone and while the other server works
    (:func:`probe_contention`). Prefill stall (one server only): ``stall_rounds`` rounds of
    ``stall_streams`` streams decoding while one prompt of each of ``stall_lengths`` is prefilled
    ``stall_per_length`` times (:func:`probe_prefill_stall`); 0 rounds skips it. Admission (a pair
    behind a proxy): with ``admission``, what each hand-off costs the running streams
    (:func:`probe_admission`; recorded, not charged by the replay unless asked). With ``prefill_passes=2`` the prefill probe runs again at the end
    of the calibration and each length keeps the median over both passes: a shared machine's speed
    drifts over minutes (lab 05 printed a 1,024-token prefill at 273 ms in the contention probe
    and 356 ms from the fit of the first pass, two minutes apart), and TTFT follows prefill.
    """

    prefill_lengths: tuple[int, ...] = (16, 256, 768, 1536)
    decode_batches: tuple[int, ...] = (1, 4, 8, 16)
    decode_prompts: tuple[int, ...] = (32, 512, 1024)
    decode_tokens: int = 32
    handoff_lengths: tuple[int, ...] = (32, 512, 1536)
    contention_prompt: int = 1024
    repeats: int = 3
    decode_repeats: int = 2
    max_probe_tokens: int = 16384
    prefill_passes: int = 2
    stall_lengths: tuple[int, ...] = (16, 128)
    stall_per_length: int = 4
    stall_streams: int = 4
    stall_rounds: int = 2
    admission: bool = True

    def decode_pairs(self) -> list[tuple[int, int]]:
        """(batch, prompt tokens) pairs that are probed."""
        return [(b, p) for b in self.decode_batches for p in self.decode_prompts if b * p <= self.max_probe_tokens]

    def check(self) -> None:
        """Raise ValueError when the plan cannot identify the three coefficients of each row."""
        if len(set(self.prefill_lengths)) < 3:
            raise ValueError(f"prefill_lengths needs >= 3 distinct lengths, got {self.prefill_lengths}")
        pairs = self.decode_pairs()
        if len({b for b, _ in pairs}) < 2 or len({p for _, p in pairs}) < 2 or len(pairs) < 3:
            raise ValueError("decode probes need >= 3 (batch, prompt) pairs with >= 2 batch sizes and >= 2 prompt "
                             f"lengths (b·p ≤ max_probe_tokens={self.max_probe_tokens}), got {pairs}")
        if self.decode_tokens < 4:
            raise ValueError(f"decode_tokens must be >= 4, got {self.decode_tokens}")
        if self.prefill_passes not in (1, 2):
            raise ValueError(f"prefill_passes must be 1 or 2, got {self.prefill_passes}")
        if self.stall_rounds < 0 or (self.stall_rounds and (self.stall_streams < 1 or self.stall_per_length < 1
                                                            or not self.stall_lengths)):
            raise ValueError("the prefill stall probe needs stall_rounds >= 0 and, when it runs, stall_streams >= 1, "
                             f"stall_per_length >= 1 and some stall_lengths, got {self.stall_rounds}, "
                             f"{self.stall_streams}, {self.stall_per_length}, {self.stall_lengths}")
        if self.repeats < 1 or self.decode_repeats < 1:
            raise ValueError(f"repeats and decode_repeats must be >= 1, got {self.repeats}, {self.decode_repeats}")


#: Plans by profile: ``smoke`` (a few seconds), ``ci`` (about 20 s of probes on a quiet 2-core
#: machine), ``full`` (GPU servers, longer prompts and bigger batches).
PROBE_PLANS: dict[str, ProbePlan] = {
    # smoke's decode pairs reach 16 streams of 256 tokens: at (1, 8) × (32, 128) a busy machine's noise
    # could hide the batch cost altogether and leave a flat decode row
    "smoke": ProbePlan(prefill_lengths=(16, 256, 1024), decode_batches=(1, 16), decode_prompts=(32, 256),
                       decode_tokens=16, handoff_lengths=(32, 512), repeats=1, decode_repeats=1,
                       max_probe_tokens=4096, prefill_passes=1, stall_per_length=2, stall_rounds=1),
    "ci": ProbePlan(),
    "full": ProbePlan(prefill_lengths=(16, 128, 512, 1024, 2048, 4096, 8192), decode_batches=(1, 8, 32, 64, 128),
                      decode_prompts=(128, 1024), decode_tokens=128, handoff_lengths=(128, 1024, 4096),
                      repeats=5, decode_repeats=3, max_probe_tokens=131072),
}


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
                  **bench_kwargs: Any) -> list[StepPoint]:
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
        tokens = int(np.median([server_prompt_tokens(r) for r in group]))
        times = [float(r.ttft_s) for r in group]
        points.append(StepPoint.prefill(tokens, float(np.median(times)), samples=len(group), times_s=tuple(times)))
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
            ctx += list(server_prompt_tokens(rec) + k)
        if not gaps or sum(gaps) > 0:  # no gaps at all: the caller says the window was too short
            return gaps, ctx
    raise RuntimeError(f"decode probe b={b}, p={p}: in {attempts} runs the client read every token of the decode "
                       f"window in one burst (0 s of gaps); the machine is too busy to time steps from the client")


def probe_decode(url: str, pairs: Sequence[tuple[int, int]], *, output_tokens: int = 64, repeats: int = 2,
                 seed: int = 0, **bench_kwargs: Any) -> list[StepPoint]:
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
        points.append(StepPoint.decode(int(b), float(b * np.mean(ctx)), float(np.mean(gaps)), samples=len(gaps),
                                       prompt_tokens=int(p)))
    return points


def prefill_stalls(records: Sequence[RequestRecord], injected_ids: Sequence[int | str], *,
                   margin_steps: int = 3, neighbours: int = 20) -> list[dict[str, float]]:
    """What each injected prefill cost the streams decoding around it, from one client run.

    ``records``: the run's requests, long streams and the injected prefills (``injected_ids``,
    each ``max_tokens=1``). A stream's gaps are per step (a chunk of n tokens spans n steps); a
    gap is busy when it overlaps an injected request's window, send to first token +
    ``margin_steps`` steps. For each injected request and stream, the stall is the time from the
    stream's last token before the send to its first token after the window, minus the steps in
    between at the stream's local step: the median of the ``neighbours`` free gaps on each side
    (the step grows with the context as a stream decodes). The row holds the streams' mean:
    ``prompt_tokens`` (the server's count), ``ttft_s`` and ``stall_s`` (s). A stream that does not
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
            rows.append({"prompt_tokens": float(server_prompt_tokens(r)), "ttft_s": float(r.ttft_s),
                         "stall_s": float(np.mean(per))})
    return rows


def probe_prefill_stall(url: str, lengths: Sequence[int], *, streams: int = 4, stream_prompt: int = 256,
                        stream_tokens: int = 1024, rounds: int = 2, spacing_s: float = 0.25, start_s: float = 1.0,
                        seed: int = 0, **bench_kwargs: Any) -> list[dict[str, float]]:
    """How long one prefill holds up the streams a server is decoding (:func:`prefill_stalls` rows).

    Each of ``rounds`` rounds is one client run: ``streams`` streams of ``stream_prompt``-token
    prompts generating ``stream_tokens`` tokens from t = 0, and from ``start_s`` one prompt of each
    of ``lengths`` (shuffled; ``max_tokens=1``) every ``spacing_s`` seconds. Fresh prompt text every
    round (no prefix-cache hits). ``stream_tokens`` must keep the streams decoding past the last
    prefill; a RuntimeError says so when no prefill could be timed."""
    if streams < 1 or rounds < 1 or not lengths:
        raise ValueError(f"need streams >= 1, rounds >= 1 and some lengths, got {streams}, {rounds}, {list(lengths)}")
    rng = np.random.default_rng(seed)
    rows: list[dict[str, float]] = []
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


# ---------------------------------------------------------------------------------------------
# Calibration end to end


def calibrate(url: str, *, plan: ProbePlan | str = "ci", decode_url: str | None = None,
              proxy_url: str | None = None, seed: int = 0, meta: dict[str, Any] | None = None,
              **bench_kwargs: Any) -> Calibration:
    """Probe ``url`` (prefill) and ``decode_url`` (decode; default ``url``), fit, and return the
    :class:`~pdlab.simreal.calibration.Calibration` (its ``latency.meta`` carries the measurements too).

    With ``proxy_url`` (a disaggregation proxy in front of those servers) the KV hand-off is
    probed too and fitted as a link with a fixed latency and a per-token time (``kv_link``).
    With two servers (``decode_url`` ≠ ``url``) each role's slowdown while the other works is
    measured (:func:`probe_contention`, ``contention``), and with a proxy too, what
    each handed-off request costs the running decode streams (:func:`probe_admission`,
    ``admission``). With one server, what a prefill costs the streams it decodes
    (:func:`probe_prefill_stall`, fitted by :func:`~pdlab.simreal.fit.fit_prefill_stall`:
    ``prefill_stall``), where the plan has stall rounds; its streams decode long enough, by the
    decode fit, to span every prefill (at most the server's context less the prompt).
    ``plan`` is a :class:`ProbePlan` or a key of :data:`PROBE_PLANS`.
    """

    if isinstance(plan, str):
        if plan not in PROBE_PLANS:
            raise ValueError(f"unknown probe plan {plan!r}; known: {', '.join(PROBE_PLANS)}")
        plan = PROBE_PLANS[plan]
    plan.check()
    t0 = time.perf_counter()
    first = probe_prefill(url, plan.prefill_lengths, repeats=plan.repeats, seed=seed, **bench_kwargs)
    dec = probe_decode(decode_url or url, plan.decode_pairs(), output_tokens=plan.decode_tokens,
                       repeats=plan.decode_repeats, seed=seed + 1, **bench_kwargs)
    handoff = []
    if proxy_url:
        handoff = probe_handoff(proxy_url, plan.handoff_lengths, repeats=plan.repeats, seed=seed + 2, **bench_kwargs)
    contention = admission = None
    if decode_url and decode_url != url:
        contention = probe_contention(url, decode_url, prompt_tokens=plan.contention_prompt,
                                      decode_tokens=max(48, plan.decode_tokens), repeats=plan.repeats,
                                      seed=seed + 3, proxy_url=proxy_url, **bench_kwargs)
        if proxy_url and plan.admission:
            admission = probe_admission(proxy_url, decode_url, seed=seed + 4, **bench_kwargs)
    passes = [first]
    if plan.prefill_passes == 2:
        passes.append(probe_prefill(url, plan.prefill_lengths, repeats=plan.repeats, seed=seed + 5, **bench_kwargs))
    pre = merge_prefill_points(*passes)
    info = {"source": "pdlab sim calibrate", "url": url, "decode_url": decode_url or url,
            "probe_plan": asdict(plan), **(meta or {})}
    if proxy_url:
        info["proxy_url"] = proxy_url
    lat = fit_profile(pre, decode_points=dec, meta=info)
    link = fit_handoff(handoff, lat) if proxy_url else None
    stall = None
    if plan.stall_rounds and (not decode_url or decode_url == url):
        stall = _probe_and_fit_stall(url, plan, lat, seed=seed + 6, **bench_kwargs)
    return Calibration(lat, pre, dec, handoff, kv_link=link, contention=contention, admission=admission,
                       seconds=time.perf_counter() - t0, prefill_stall=stall)


def _probe_and_fit_stall(url: str, plan: ProbePlan, lat: Any, *, seed: int, **bench_kwargs: Any) -> PrefillStall:
    """:func:`probe_prefill_stall` with ``plan``'s stall settings, its streams long enough by the
    decode fit ``lat`` (1.5× the window, at the context they reach), fitted on ``lat``."""
    lengths = [int(p) for p in plan.stall_lengths] * plan.stall_per_length
    spacing_s, start_s, prompt = 0.25, 1.0, 256
    window_s = start_s + len(lengths) * spacing_s + 0.5
    cap = (server_context_tokens(url) or 2048) - prompt - 1
    step = lat.step_time_s(0, 0.0, plan.stall_streams, plan.stall_streams * (prompt + cap // 2))
    tokens = int(min(cap, max(64, 1.5 * window_s / max(step, 1e-4))))
    rows = probe_prefill_stall(url, lengths, streams=plan.stall_streams, stream_prompt=prompt, stream_tokens=tokens,
                               rounds=plan.stall_rounds, spacing_s=spacing_s, start_s=start_s, seed=seed,
                               **bench_kwargs)
    return fit_prefill_stall(rows, lat, streams=plan.stall_streams, stream_prompt=prompt)


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


# The pair probes live in pdlab.serve.pair_probes; calibrate() calls them by these names.
from pdlab.serve.pair_probes import probe_admission, probe_contention, probe_handoff, while_running  # noqa: E402
