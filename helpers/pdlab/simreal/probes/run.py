"""Sim-to-real's first stage: run the live probes of a plan and fit what they measured.

The probes themselves (:mod:`pdlab.serve.probes` for one server, :mod:`pdlab.serve.pair_probes` for a
prefill/decode pair) send requests through the course's client and return typed points; this module
turns them into the simulator's terms with the fits of :mod:`pdlab.simreal.fit`:

- :func:`calibrate` — a :class:`~pdlab.simreal.probes.plan.ProbePlan` run against a live deployment,
  returned as a :class:`~pdlab.simreal.calibration.Calibration` (lab 05, ``pdlab sim calibrate``);
- :func:`step_points`, :func:`handoff_rows`, :func:`stall_rows`, :func:`contention_from`,
  :func:`admission_from` — one probe's points as the fit stage's input or as a calibration term;
- :func:`fit_prefill_model` — the prefill model the proxy's admission predicts with (lab 07).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pdlab.sched.admission import PrefillModel
from pdlab.serve import pair_probes as pair
from pdlab.serve import probes as live
from pdlab.serve.pair_probes import AdmissionTimes, ContentionTimes, HandoffPoint
from pdlab.serve.probes import DecodePoint, PrefillPoint, StallPoint
from pdlab.simreal.calibration import Admission, Calibration, Contention, PrefillStall, StepPoint
from pdlab.simreal.fit import (
    admission_overhead_s,
    contention_factor,
    fit_handoff,
    fit_prefill_stall,
    fit_profile,
    fit_row,
    merge_prefill_points,
)
from pdlab.simreal.probes.plan import PROBE_PLANS, ProbePlan

__all__ = ["calibrate", "step_points", "handoff_rows", "stall_rows", "contention_from", "admission_from",
           "fit_prefill_model"]


# ---------------------------------------------------------------------------------------------
# The probes' points as the fit stage reads them


def step_points(points: Sequence[PrefillPoint | DecodePoint]) -> list[StepPoint]:
    """Prefill and decode probe points as the fit's :class:`~pdlab.simreal.calibration.StepPoint` rows.

    >>> step_points([PrefillPoint(257, 0.02, 3, (0.019, 0.02, 0.03))])[0].prefill_sq_tokens
    66049.0
    >>> step_points([DecodePoint(4, 1100.0, 0.005, 60, 256)])[0].kind
    'decode'
    """
    out = []
    for p in points:
        if isinstance(p, PrefillPoint):
            out.append(StepPoint.prefill(p.tokens, p.time_s, samples=p.samples, times_s=tuple(p.times_s)))
        elif isinstance(p, DecodePoint):
            out.append(StepPoint.decode(p.batch, p.ctx_tokens, p.time_s, samples=p.samples,
                                        prompt_tokens=p.prompt_tokens))
        else:
            raise TypeError(f"a step point comes from probe_prefill or probe_decode, got {type(p).__name__}")
    return out


def handoff_rows(points: Sequence[HandoffPoint]) -> list[dict[str, float]]:
    """Hand-off points as the rows :func:`~pdlab.simreal.fit.fit_handoff` fits and a calibration keeps
    (``tokens``, ``ttft_s``, ``samples``, and ``prefill_leg_s`` where the proxy timed the leg)."""
    return [{k: v for k, v in asdict(p).items() if v is not None} for p in points]


def stall_rows(points: Sequence[StallPoint]) -> list[dict[str, float]]:
    """Prefill stall points as the rows :func:`~pdlab.simreal.fit.fit_prefill_stall` fits."""
    return [asdict(p) for p in points]


def contention_from(times: ContentionTimes) -> Contention:
    """The calibration's :class:`~pdlab.simreal.calibration.Contention` of the times
    :func:`pdlab.serve.pair_probes.probe_contention` measured: each role's
    :func:`~pdlab.simreal.fit.contention_factor`, max(0, busy/alone − 1)."""
    return Contention(prompt_tokens=times.prompt_tokens, decode_streams=times.decode_streams,
                      prefill_alone_s=times.prefill_alone_s, prefill_busy_s=times.prefill_busy_s,
                      decode_alone_s=times.decode_alone_s, decode_busy_s=times.decode_busy_s,
                      prefill=contention_factor(times.prefill_alone_s, times.prefill_busy_s),
                      decode=contention_factor(times.decode_alone_s, times.decode_busy_s),
                      prefill_background=times.prefill_background)


def admission_from(times: AdmissionTimes) -> Admission:
    """The calibration's :class:`~pdlab.simreal.calibration.Admission` of the times
    :func:`pdlab.serve.pair_probes.probe_admission` measured: F =
    :func:`~pdlab.simreal.fit.admission_overhead_s` (``raw_overhead_s``) and max(0, F) (``overhead_s``)."""
    overhead = admission_overhead_s(times.period_s, times.itl_alone_s, times.itl_busy_s)
    return Admission(streams=times.streams, stream_prompt=times.stream_prompt, side_prompt=times.side_prompt,
                     side_requests=times.side_requests, period_s=times.period_s, itl_alone_s=times.itl_alone_s,
                     itl_busy_s=times.itl_busy_s, gaps_busy=times.gaps_busy, raw_overhead_s=overhead,
                     overhead_s=max(0.0, overhead))


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
    measured (:func:`pdlab.serve.pair_probes.probe_contention`, ``contention``), and with a proxy too,
    what each handed-off request costs the running decode streams
    (:func:`pdlab.serve.pair_probes.probe_admission`, ``admission``). With one server, what a prefill
    costs the streams it decodes (:func:`pdlab.serve.probes.probe_prefill_stall`, fitted by
    :func:`~pdlab.simreal.fit.fit_prefill_stall`: ``prefill_stall``), where the plan has stall rounds;
    its streams decode long enough, by the decode fit, to span every prefill (at most the server's
    context less the prompt). ``plan`` is a :class:`ProbePlan` or a key of :data:`PROBE_PLANS`; its
    ``warmup_passes`` run first, untimed.
    """
    if isinstance(plan, str):
        if plan not in PROBE_PLANS:
            raise ValueError(f"unknown probe plan {plan!r}; known: {', '.join(PROBE_PLANS)}")
        plan = PROBE_PLANS[plan]
    plan.check()
    t0 = time.perf_counter()
    for k in range(plan.warmup_passes):     # untimed: the engine's first runs of each shape are slower
        live.probe_prefill(url, plan.prefill_lengths, repeats=1, seed=seed + 10 + 2 * k, **bench_kwargs)
        live.probe_decode(decode_url or url, plan.decode_pairs(), output_tokens=plan.decode_tokens, repeats=1,
                          seed=seed + 11 + 2 * k, **bench_kwargs)
    first = live.probe_prefill(url, plan.prefill_lengths, repeats=plan.repeats, seed=seed, **bench_kwargs)
    dec = step_points(live.probe_decode(decode_url or url, plan.decode_pairs(), output_tokens=plan.decode_tokens,
                                        repeats=plan.decode_repeats, seed=seed + 1, **bench_kwargs))
    handoff: list[dict[str, float]] = []
    if proxy_url:
        handoff = handoff_rows(pair.probe_handoff(proxy_url, plan.handoff_lengths, repeats=plan.handoff_repeats,
                                                  warmup=plan.warmup_passes,
                                                  seed=seed + 2, **bench_kwargs))
    contention = admission = None
    if decode_url and decode_url != url:
        contention = contention_from(pair.probe_contention(
            url, decode_url, prompt_tokens=plan.contention_prompt, decode_tokens=max(48, plan.decode_tokens),
            repeats=plan.repeats, seed=seed + 3, proxy_url=proxy_url, **bench_kwargs))
        if proxy_url and plan.admission:
            admission = admission_from(pair.probe_admission(proxy_url, decode_url, seed=seed + 4, **bench_kwargs))
    passes = [step_points(first)]
    if plan.prefill_passes == 2:
        passes.append(step_points(live.probe_prefill(url, plan.prefill_lengths, repeats=plan.repeats, seed=seed + 5,
                                                     **bench_kwargs)))
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
    """:func:`pdlab.serve.probes.probe_prefill_stall` with ``plan``'s stall settings, its streams long
    enough by the decode fit ``lat`` (1.5× the window, at the context they reach), fitted on ``lat``."""
    lengths = [int(p) for p in plan.stall_lengths] * plan.stall_per_length
    spacing_s, start_s, prompt = 0.25, 1.0, 256
    window_s = start_s + len(lengths) * spacing_s + 0.5
    cap = (live.server_context_tokens(url) or 2048) - prompt - 1
    step = lat.step_time_s(0, 0.0, plan.stall_streams, plan.stall_streams * (prompt + cap // 2))
    tokens = int(min(cap, max(64, 1.5 * window_s / max(step, 1e-4))))
    points = live.probe_prefill_stall(url, lengths, streams=plan.stall_streams, stream_prompt=prompt,
                                      stream_tokens=tokens, rounds=plan.stall_rounds, spacing_s=spacing_s,
                                      start_s=start_s, seed=seed, **bench_kwargs)
    return fit_prefill_stall(stall_rows(points), lat, streams=plan.stall_streams, stream_prompt=prompt)


# ---------------------------------------------------------------------------------------------
# The admission's prefill model (lab 07)


def fit_prefill_model(prefill_url: str, lengths: Sequence[int], *, repeats: int = 3, seed: int = 0
                      ) -> tuple[PrefillModel, list[dict[str, Any]]]:
    """Probe ``prefill_url`` with single prompts of ``lengths`` tokens and fit ``a + b·l + c·l²`` (s):
    the :class:`~pdlab.sched.admission.PrefillModel` the proxy's admission predicts with.

    Returns the model and the probe points as table rows: each
    :class:`~pdlab.simreal.calibration.StepPoint`'s ``to_dict()`` (``prefill_tokens``, ``time_s`` =
    median TTFT, ...) with ``fit_s``, the fitted time (s), and on the first row ``fit_quality``.
    """
    if len(set(lengths)) < 3:
        raise ValueError(f"need ≥ 3 distinct prompt lengths to fit a, b and c, got {list(lengths)}")
    points = step_points(live.probe_prefill(prefill_url, lengths, repeats=repeats, seed=seed))
    (a, b, c), quality = fit_row(points, "prefill")
    rows = [{**p.to_dict(), "fit_s": a + b * p.prefill_tokens + c * p.prefill_tokens ** 2} for p in points]
    rows[0]["fit_quality"] = quality
    return PrefillModel(a, b, c), rows
