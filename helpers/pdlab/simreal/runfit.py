"""Stage 1b of sim-to-real: refit the probe's calibration on one live run (observe, then predict).

A live run's token gaps are read as decode steps of the server (:func:`step_gaps`): a gap is
*quiet* when no request waits for its first token (pure decode, what the decode probe measures).
:func:`fit_on_run` takes the probe's :class:`~pdlab.simreal.calibration.Calibration` and one run of
one rate and returns the calibration the replay (:func:`pdlab.simreal.replay.replay`) uses to
predict the other rates: the decode row's level from the run's quiet steps and its median TPOT,
the decode role's contention and the prefill core's co-runners (a pair), and a front-end delay.
Every function here takes and returns a typed calibration; what each refit measured is recorded in
``latency.meta["fit"]`` (provenance only: the replay reads the typed fields).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pdlab.metrics import RequestRecord, tpot_s
from pdlab.sim.latency import nnls_fit
from pdlab.simreal.calibration import Calibration, Contention, RunFit, StepPoint
from pdlab.simreal.fit import fit_quality
from pdlab.simreal.replay import replay, replay_pairs, requests_from_records

__all__ = ["StepGap", "step_gaps", "run_decode_points",
           "prefill_quiet_requests", "scale_decode_on_run", "match_decode_to_tpot_on_run",
           "refit_decode_contention_on_run", "split_co_runner_cpu", "refit_prefill_core_load_on_run",
           "refit_front_end_on_run", "fit_on_run"]


def _noted(cal: Calibration, key: str, info: Mapping[str, Any], **changes: Any) -> Calibration:
    """``cal`` with ``changes`` (its typed fields, or ``latency``) and ``info`` as
    ``latency.meta["fit"][key]`` (what the refit measured)."""
    lat = changes.pop("latency", cal.latency)
    fit = {**lat.meta.get("fit", {}), key: dict(info)}
    return replace(cal, latency=lat.derive(meta={**lat.meta, "fit": fit}), **changes)


def _with_front_end(cal: Calibration, front_end_s: float) -> Calibration:
    """``cal`` with the run fit's front-end delay set to ``front_end_s`` seconds."""
    return replace(cal, run_fit=replace(cal.run_fit or RunFit(), front_end_s=float(front_end_s)))


def _streamed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The completed records with two or more token times (at least one gap); ValueError if none."""
    recs = [r for r in records if r.ok and r.token_times_s is not None and len(r.token_times_s) >= 2]
    if not recs:
        raise ValueError("no record with two or more token times")
    return recs


@dataclass(frozen=True, slots=True)
class StepGap:
    """One token gap of a live run, read as decode steps of the server (:func:`step_gaps`)."""

    batch: int           #: streams between their first and last token at the gap's midpoint
    context: int         #: Σ over them of prompt + tokens before the midpoint − 1 (tokens)
    gap_s: float         #: the gap (s), from one timed chunk to the next
    quiet: bool          #: no request waiting for its first token at the midpoint
    mid_s: float         #: the gap's midpoint (s, the records' clock)
    steps: int | None    #: engine steps it spans (tokens the closing chunk held); None when unknown
    stream: int          #: which streamed record (index among the completed ones with a gap)


def _chunks(rec: RequestRecord) -> tuple[np.ndarray, np.ndarray, bool]:
    """A record's timed chunks that held a token, the running token count after each, and whether
    the counts are the server's (``chunk_tokens``) rather than one per chunk."""
    times = np.asarray(rec.token_times_s, dtype=float)
    counts = rec.chunk_tokens
    if counts is None or len(counts) != len(times):
        return times, np.arange(1, len(times) + 1), False
    held = np.asarray(counts, dtype=int)
    return times[held > 0], np.cumsum(held[held > 0]), True


def step_gaps(records: Sequence[RequestRecord]) -> list[StepGap]:
    """Every token gap of a live run as decode steps of the server (:class:`StepGap`). B is the
    number of streams between their first and last token at the gap's midpoint, the context the
    sum over them of p + k (prompt, and k = tokens before the midpoint − 1: the gap from token k
    to k + 1 reads p + k, the decode probe's and the simulator's accounting). A gap is *quiet* when
    no request is waiting for its first token (no prefill, no hand-off under way): there the step
    is pure decode, what the decode probe measures. Where the server said how many tokens each
    chunk held (``chunk_tokens``), a gap closed by a chunk of n tokens spans n steps (the API
    server fell behind and merged them); chunks that held none are skipped."""
    recs = _streamed(records)
    chunks = [_chunks(r) for r in recs]
    times = [t for t, _, _ in chunks]
    first = np.array([t[0] if len(t) else np.inf for t in times])
    last = np.array([t[-1] if len(t) else -np.inf for t in times])
    arrival = np.array([r.arrival_s for r in recs])
    prompt = np.array([r.counted_prompt_tokens for r in recs])
    rows = []
    for i, (t, running, known) in enumerate(chunks):
        for gap, mid, held in zip(np.diff(t), 0.5 * (t[1:] + t[:-1]), np.diff(running), strict=True):
            active = np.flatnonzero((first <= mid) & (mid <= last))
            ctx = sum(int(prompt[j] + chunks[j][1][max(int(np.searchsorted(times[j], mid)), 1) - 1] - 1)
                      for j in active)
            quiet = not np.any((arrival <= mid) & (mid < first))
            rows.append(StepGap(len(active), ctx, float(gap), quiet, float(mid), int(held) if known else None, i))
    return rows


def _per_step(rows: Sequence[StepGap]) -> list[StepGap]:
    """``rows`` one per engine step: a gap known to span n steps becomes n rows of gap ÷ n (the
    steps' mean), a gap of unknown span stays one row (one step, as ``vllm bench serve`` reads it)."""
    out = []
    for g in rows:
        n = g.steps or 1
        out.extend([replace(g, gap_s=g.gap_s / n, steps=1)] * n)
    return out


def run_decode_points(records: Sequence[RequestRecord], *, ctx_bucket_tokens: int = 256,
                      min_gaps: int = 5) -> list[StepPoint]:
    """Decode timing points observed in a live run: its quiet steps (:func:`step_gaps`),
    grouped by batch and by mean context per stream in buckets of ``ctx_bucket_tokens``, each
    group (of at least ``min_gaps`` gaps) one point of the median gap (s) at the group's mean
    batch context. Median, not mean: a client that reads several tokens in one burst (its process
    was descheduled) sees one long gap and several of 0 s around the true step. The points feed
    :func:`pdlab.simreal.fit.fit_row` like the probe's (``kind`` ``"decode"``): the observe-then-predict calibration."""
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for g in _per_step(step_gaps(records)):
        if g.quiet and g.batch > 0:
            groups.setdefault((g.batch, int(g.context / g.batch // ctx_bucket_tokens)), []).append((g.context, g.gap_s))
    points = []
    for (b, _), rows in sorted(groups.items()):
        gaps = [g for _, g in rows]
        t = float(np.median(gaps))
        if len(rows) >= min_gaps and t > 0:
            points.append(StepPoint.decode(b, float(np.mean([c for c, _ in rows])), t, samples=len(rows)))
    return points


def prefill_quiet_requests(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The completed requests of a run that met no prefill queue: no other request was waiting for
    its first token at any moment between their arrival and their own first token."""
    ok = [r for r in records if r.ok and r.first_token_s is not None]
    return [r for r in ok if not any(o is not r and o.arrival_s < r.first_token_s and o.first_token_s > r.arrival_s
                                     for o in ok)]


def _quiet_replay_pairs(cal: Calibration, records: Sequence[RequestRecord], mode: str, min_requests: int,
                        **sim_options: Any) -> list[tuple[RequestRecord, RequestRecord]]:
    """(live, replayed) pairs of a run's prefill-quiet requests (:func:`prefill_quiet_requests`),
    the whole run replayed with :func:`~pdlab.simreal.replay.replay` (``mode``, ``sim_options``).
    Raises ValueError with fewer than ``min_requests`` quiet requests."""
    live = sorted((r for r in records if r.ok and r.first_token_s is not None), key=lambda r: r.arrival_s)
    quiet = {id(r) for r in prefill_quiet_requests(live)}
    if len(quiet) < min_requests:
        raise ValueError(f"need >= {min_requests} requests that met no prefill queue, the run has {len(quiet)}")
    sims = replay(requests_from_records(live), mode, cal, **sim_options)
    return [(r, sim) for r, sim in replay_pairs(live, sims) if id(r) in quiet]


def scale_decode_on_run(cal: Calibration, records: Sequence[RequestRecord], **kwargs: Any) -> Calibration:
    """``cal`` with its decode row scaled to a live run's level: the median, over the run's
    quiet-step points (:func:`run_decode_points`, ``kwargs``), of the observed step ÷ the fitted
    one at the point's batch and context. The probe keeps the shape (how a step grows with batch
    and context, over batches a slow run never reaches); the run sets one factor for all of it, as
    a co-runner that takes a share of the core stretches every step alike.
    ``meta["fit"]["decode"]`` holds the scale and the fit's quality on the points. Raises
    ValueError without a point."""
    points = run_decode_points(records, **kwargs)
    if not points:
        raise ValueError("no quiet decode step group in the run to scale the decode row on")
    lat = cal.latency
    fitted = np.array([lat.step_time_s(0, 0.0, p.decode_batch, p.decode_ctx_tokens) for p in points])
    observed = np.array([p.time_s for p in points])
    scale = float(np.median(observed / fitted))
    return _noted(cal, "decode_run_scale", {**fit_quality(scale * fitted, observed), "scale": scale,
                                            "source": "the probe's decode row, scaled to the live run's quiet steps"},
                  latency=lat.derive(decode_scale=scale))


def _bisect_to_match(too_fast: Callable[[float], bool], lowest: float, highest: float, iterations: int) -> float:
    """The value in [``lowest``, ``highest``] where a replay that slows as the value grows stops
    being ``too_fast`` (bisection, ``iterations`` halvings); a bound where the replay is too slow
    already at ``lowest`` (``lowest``) or still too fast at ``highest`` (``highest``)."""
    lo, hi = lowest, highest
    if not too_fast(lo):
        hi = lo
    elif too_fast(hi):
        lo = hi
    for _ in range(iterations if lo < hi else 0):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if too_fast(mid) else (lo, mid)
    return 0.5 * (lo + hi)


def match_decode_to_tpot_on_run(cal: Calibration, records: Sequence[RequestRecord], mode: str, *,
                                iterations: int = 12, lowest: float = 0.5, highest: float = 2.0,
                                **sim_options: Any) -> Calibration:
    """``cal`` with its decode row scaled by the one factor in [``lowest``, ``highest``] that gives
    the replay of its own run (``mode``, ``sim_options``) the run's median TPOT (bisection,
    ``iterations`` halvings; the replay's TPOT grows with the factor).

    :func:`scale_decode_on_run` matches the median *quiet* step; TPOT is a mean over all of a
    request's gaps, so it also carries the long ones a quiet median leaves out (stalls while a
    request is admitted, chunks the API server sent late). ``meta["fit"]["decode_tpot_match"]``
    records the factor and the medians. Where the replay is already too slow at ``lowest`` or too
    fast at ``highest``, the factor is that bound."""
    reqs = requests_from_records(records)
    live = float(np.median(tpot_s(records)))

    def scaled(f: float) -> Calibration:
        return replace(cal, latency=cal.latency.derive(decode_scale=f))

    def replay_tpot(f: float) -> float:
        return float(np.median(tpot_s(replay(reqs, mode, scaled(f), **sim_options))))

    before = replay_tpot(1.0)
    factor = _bisect_to_match(lambda f: replay_tpot(f) < live, lowest, highest, iterations)
    return _noted(cal, "decode_tpot_match", {"factor": factor, "live_tpot_p50_s": live, "replay_tpot_p50_before_s": before,
                                             "source": "live run, the replay's median TPOT matched to the run's"},
                  latency=cal.latency.derive(decode_scale=factor))


def refit_decode_contention_on_run(cal: Calibration, records: Sequence[RequestRecord], *,
                                   min_gaps: int = 50) -> Calibration:
    """``cal`` (a prefill/decode pair's) with the decode role's contention measured on a live run:
    the median live ÷ fitted step of the gaps while some request waits for its first token (a
    prefill or a hand-off under way) over that of the quiet gaps (:func:`step_gaps`), minus 1,
    never below 0. The contention probe times decode while the prefill role runs prompts back to
    back, a busier prefill core than a workload's; the run measures what the decode role actually
    loses while prefill works. ``meta["fit"]["contention_decode"]`` keeps the probe's value; raises
    ValueError with fewer than ``min_gaps`` gaps of either kind."""
    lat = cal.latency
    rows = [(g.gap_s / lat.step_time_s(0, 0.0, g.batch, g.context), g.quiet) for g in _per_step(step_gaps(records))]
    quiet = [x for x, q in rows if q]
    busy = [x for x, q in rows if not q]
    if min(len(quiet), len(busy)) < min_gaps:
        raise ValueError(f"need >= {min_gaps} quiet and busy gaps, the run has {len(quiet)} and {len(busy)}")
    c_d = max(0.0, float(np.median(busy) / np.median(quiet)) - 1.0)
    probe = cal.contention or Contention.from_dict({})
    return _noted(cal, "contention_decode", {"probe": probe.decode, "run": c_d, "quiet_gaps": len(quiet),
                                             "busy_gaps": len(busy)},
                  contention=replace(probe, decode=c_d))


def split_co_runner_cpu(samples: Sequence[Sequence[Sequence[float]]], records: Sequence[RequestRecord], *,
                        window_s: float = 1.0) -> dict[str, float]:
    """Split the CPU the co-runners of a live run used (``samples``: one list per block of
    ``(perf_counter time, CPU seconds so far)``, :class:`pdlab.serve.measure.cpucost.CPUSampler`) into a
    rate while requests are in flight and a cost per request. Each block's span from its first
    send to its last finish is cut into windows of about ``window_s`` seconds (between samples);
    each window's CPU seconds are fitted (non-negative least squares) as
    ``base_cores`` × its seconds with a request in flight + ``cpu_s_per_request`` × Σ over
    requests of the share of the request's life (send → finish) inside the window. A stream's
    work is spread over its life, so the second term follows the arrivals' bunching that the
    first cannot; the first is what the front ends spend per step, whatever the number of
    streams. Returns both, with the fit's ``r2`` and ``windows``; ValueError with fewer than 4
    windows."""
    recs = [r for r in records if r.ok and r.finish_s is not None and r.finish_s > r.arrival_s]
    rows, ys = [], []
    for block in samples:
        pts = np.asarray(block, dtype=float)
        if len(pts) < 2:
            continue
        inside = [r for r in recs if pts[0, 0] <= r.arrival_s <= pts[-1, 0]]
        if not inside:
            continue
        lo, hi = min(r.arrival_s for r in inside), max(r.finish_s for r in inside)
        kept = pts[(pts[:, 0] >= lo) & (pts[:, 0] <= hi)]
        step = max(1, int(round(window_s / max(np.median(np.diff(pts[:, 0])), 1e-9))))
        kept = kept[::step]
        for (t0, c0), (t1, c1) in zip(kept[:-1], kept[1:], strict=True):
            lives = [(max(t0, r.arrival_s), min(t1, r.finish_s), r.finish_s - r.arrival_s) for r in inside]
            share = sum((b - a) / life for a, b, life in lives if b > a)
            busy = _union_length([(a, b) for a, b, _ in lives if b > a])
            rows.append([busy, share])
            ys.append(c1 - c0)
    if len(rows) < 4:
        raise ValueError(f"need >= 4 windows of CPU samples inside the run's requests, got {len(rows)}")
    a, y = np.array(rows), np.array(ys)
    coef = nnls_fit(a, y)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((a @ coef - y) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return {"base_cores": float(coef[0]), "cpu_s_per_request": float(coef[1]), "windows": len(rows), "r2": r2}


def _union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length (s) covered by ``intervals`` (a, b), overlaps counted once."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def refit_prefill_core_load_on_run(cal: Calibration, samples: Sequence[Sequence[Sequence[float]]],
                                   records: Sequence[RequestRecord], *, per_request_only: bool = False
                                   ) -> Calibration:
    """``cal`` (a prefill/decode pair's) with the load its prefill role's co-runners (API servers,
    proxy, benchmark client) put on that core during a live run, split by
    :func:`split_co_runner_cpu` (``samples`` of their CPU seconds, ``records`` of the run) into the
    run fit's ``prefill_core_base_cores`` and ``prefill_core_cpu_s_per_request``; the replay
    charges them at the replayed rate, so a fit on one rate carries the front ends' load to
    another. With ``per_request_only`` the base is left out (where the prefill role's contention
    already charges the front ends' work per decode step). ``meta["fit"]["prefill_core_load"]``
    records the split."""
    split = split_co_runner_cpu(samples, records)
    run = replace(cal.run_fit or RunFit(), prefill_core_cpu_s_per_request=split["cpu_s_per_request"],
                  prefill_core_base_cores=0.0 if per_request_only else split["base_cores"])
    return _noted(cal, "prefill_core_load", {**split, "per_request_only": per_request_only,
                                             "source": "live run, CPU samples of the prefill core's co-runners"},
                  run_fit=run)


def refit_front_end_on_run(cal: Calibration, records: Sequence[RequestRecord], mode: str, *,
                           min_requests: int = 3, **sim_options: Any) -> Calibration:
    """``cal`` with a front-end delay fitted on a live run: the median, over the run's
    prefill-quiet requests (:func:`prefill_quiet_requests`), of live TTFT − the TTFT the run's
    replay (``mode``, ``sim_options``) gives them, never below 0: the run fit's ``front_end_s``.
    What a loaded server adds before a quiet request's first token is a fixed delay outside the
    engine (its front end serves the other requests' streams meanwhile), not slower prefill
    compute, so it delays that request alone. A run with fewer than ``min_requests`` quiet requests
    (a rate high enough that nearly every request queues) cannot show the delay apart from the
    queue: ``cal``'s delay is kept and ``latency.meta["fit"]["front_end"]`` says it was not refitted."""
    quiet = len(prefill_quiet_requests(records))
    if quiet < min_requests:
        kept = cal.run_fit.front_end_s if cal.run_fit else 0.0
        return _noted(cal, "front_end", {"delay_s": kept, "requests": quiet,
                                         "source": f"not refitted: {quiet} requests met no prefill queue "
                                                   f"(< {min_requests}); the calibration's delay is kept"})
    pairs = _quiet_replay_pairs(_with_front_end(cal, 0.0), records, mode, min_requests, **sim_options)
    gaps = [r.ttft_s - sim.ttft_s for r, sim in pairs]
    delay = max(0.0, float(np.median(gaps)))
    noted = _noted(cal, "front_end", {"delay_s": delay, "requests": len(gaps),
                                      "source": "live run, TTFT − replayed TTFT of requests that met no prefill queue"})
    return _with_front_end(noted, delay)


def fit_on_run(cal: Calibration, records: Sequence[RequestRecord], mode: str, *,
               prefill_core_samples: Sequence[Sequence[Sequence[float]]] | None = None, match_tpot: bool = True,
               **sim_options: Any) -> Calibration:
    """Lab 05's observe-then-predict calibration: the probe's calibration ``cal`` refitted on one
    live run (``records``) of the set-up ``mode``. The decode row is scaled to the run's quiet
    steps (:func:`scale_decode_on_run`); for a prefill/decode pair, the decode role's contention
    (:func:`refit_decode_contention_on_run`), the CPU the prefill core's co-runners spend per
    request when their CPU samples are given (``prefill_core_samples``, one list per block of
    :class:`~pdlab.serve.measure.cpucost.CPUSampler` samples; :func:`refit_prefill_core_load_on_run`) and,
    unless ``match_tpot`` is False, the decode row's level matched to the run's median TPOT
    (:func:`match_decode_to_tpot_on_run`); then the front-end delay (:func:`refit_front_end_on_run`).
    The prefill row, the hand-off and the prefill role's contention stay the probe's.
    ``sim_options`` go to every replay. Raises ValueError when the run has too few quiet steps or
    prefill-quiet requests to fit on."""
    fit = scale_decode_on_run(cal, records)
    if mode == "disaggregated":
        fit = refit_decode_contention_on_run(fit, records)
        if prefill_core_samples is not None:
            fit = refit_prefill_core_load_on_run(fit, prefill_core_samples, records, per_request_only=True)
        if match_tpot:
            fit = match_decode_to_tpot_on_run(fit, records, mode, **sim_options)
    return refit_front_end_on_run(fit, records, mode, **sim_options)
