"""Stage 1 of sim-to-real: fit the simulator's step times and hand-off to a live probe's points.

The live probes (:mod:`pdlab.serve.probes`) time single prompts (prefill: TTFT with ``max_tokens=1``),
N concurrent streams (decode: their token gaps at batch N), single requests through a
disaggregation proxy (the KV hand-off) and prompts injected among decoding streams (the prefill
stall); they hand their points here. :func:`fit_profile` fits DistServe's form
(:class:`pdlab.sim.latency.FittedLatency`; prefill = a + b·Σl + c·Σl², decode = a + b·Σctx +
c·batch) by non-negative least squares on relative errors (:func:`pdlab.sim.latency.nnls_fit`, the
package's one fitting core). The fixed cost ``a`` absorbs what the client sees beyond the forward
pass (HTTP, tokenisation, detokenisation, streaming). A live run's refit is :mod:`pdlab.simreal.runfit`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from pdlab.sim.latency import FittedLatency, nnls_fit
from pdlab.simreal.calibration import LinkFit, PrefillStall, StepPoint

__all__ = [
    "POINT_KEYS",
    "fit_row",
    "fit_quality",
    "fit_profile",
    "fit_handoff",
    "fit_prefill_stall",
    "merge_prefill_points",
    "contention_factor",
    "admission_overhead_s",
]


#: Fields of a :class:`~pdlab.simreal.calibration.StepPoint` that the fit reads: the keys a timing point
#: given as a mapping must have (the format of :func:`pdlab.sim.latency.sample_points`).
POINT_KEYS = ("prefill_tokens", "prefill_sq_tokens", "decode_batch", "decode_ctx_tokens", "time_s")


def _check_fields(i: int, values: Mapping[str, Any]) -> None:
    for k in POINT_KEYS:
        v = values[k]
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
                or not math.isfinite(float(v)):
            raise ValueError(f"point {i}: {k} must be a finite number, got {v!r}")
        if float(v) < 0:
            raise ValueError(f"point {i}: {k} must be >= 0, got {v!r}")


def _validate_points(points: Iterable[StepPoint | Mapping[str, Any]]) -> list[StepPoint]:
    """``points`` as StepPoints, checked: each one prefill-only or decode-only, every fitted field a
    finite number >= 0, a positive time; a mapping needs the keys :data:`POINT_KEYS`."""
    out = []
    for i, p in enumerate(points):
        if isinstance(p, Mapping):
            missing = [k for k in POINT_KEYS if k not in p]
            if missing:
                raise ValueError(f"point {i} lacks {', '.join(missing)} (a point needs {', '.join(POINT_KEYS)})")
            _check_fields(i, p)
            p = StepPoint.from_dict(p)
        elif not isinstance(p, StepPoint):
            raise ValueError(f"point {i} must be a mapping with keys {', '.join(POINT_KEYS)} or a StepPoint, "
                             f"got {type(p).__name__}")
        _check_fields(i, {k: getattr(p, k) for k in POINT_KEYS})
        if p.time_s <= 0:
            raise ValueError(f"point {i}: time_s must be > 0 seconds, got {p.time_s!r}")
        if p.prefill_tokens > 0 and p.decode_batch > 0:
            raise ValueError(f"point {i} mixes prefill and decode; calibration points are prefill-only or decode-only")
        if p.prefill_tokens == 0 and p.decode_batch == 0:
            raise ValueError(f"point {i} has neither prefill tokens nor a decode batch")
        out.append(p)
    return out


def _design(kind: str, pts: list[StepPoint]) -> np.ndarray:
    if kind == "prefill":
        return np.array([[1.0, p.prefill_tokens, p.prefill_sq_tokens] for p in pts])
    return np.array([[1.0, p.decode_ctx_tokens, p.decode_batch] for p in pts])


def fit_row(points: Iterable[StepPoint | Mapping[str, Any]], kind: str, *, relative: bool = True
            ) -> tuple[tuple[float, float, float], dict[str, float]]:
    """Fit one row of :class:`FittedLatency` (``kind`` = ``"prefill"`` or ``"decode"``).

    ``points``: :class:`~pdlab.simreal.calibration.StepPoint` (or mappings with the keys :data:`POINT_KEYS`,
    as :func:`pdlab.sim.latency.sample_points` makes them); those of the other kind are left out.
    Non-negative least squares (:func:`pdlab.sim.latency.nnls_fit`), on relative errors
    when ``relative`` (every point counts the same, short and long). Returns the coefficients
    (a, b, c) in seconds (prefill: s, s/token, s/token²; decode: s, s/context token, s/sequence)
    and fit quality: ``r2``, ``mape`` (mean |relative residual|), ``max_rel_err``, ``points``.

    Raises ValueError naming the problem for malformed points, fewer than three points of this
    kind, or points that cannot separate the three coefficients (e.g. one prompt length only).
    """
    if kind not in ("prefill", "decode"):
        raise ValueError(f"kind must be 'prefill' or 'decode', got {kind!r}")
    pts = [p for p in _validate_points(points) if (p.prefill_tokens > 0 if kind == "prefill" else p.decode_batch > 0)]
    if len(pts) < 3:
        raise ValueError(f"need >= 3 {kind} points to fit a + b·x + c·y, got {len(pts)}")
    a = _design(kind, pts)
    y = np.array([p.time_s for p in pts])
    if np.linalg.matrix_rank(a / np.abs(a).max(axis=0)) < 3:
        what = "distinct prompt lengths" if kind == "prefill" else \
            "batch sizes and contexts that vary independently (several batches, several prompt lengths)"
        raise ValueError(f"{kind} points cannot separate the three coefficients: they need >= 3 {what}")
    coef = nnls_fit(a, y, relative=relative)
    return (float(coef[0]), float(coef[1]), float(coef[2])), fit_quality(a @ coef, y)


def fit_quality(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Fit quality of predictions against measurements: r2, mape, max_rel_err, points."""
    rel = (pred - y) / y
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"r2": 1.0 - float(((pred - y) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan"),
            "mape": float(np.abs(rel).mean()), "max_rel_err": float(np.abs(rel).max()), "points": len(y)}


def fit_profile(points: Iterable[StepPoint | Mapping[str, Any]], *,
                decode_points: Iterable[StepPoint | Mapping[str, Any]] | None = None, relative: bool = True,
                meta: dict[str, Any] | None = None) -> FittedLatency:
    """A :class:`FittedLatency` from prefill-only and decode-only timing points.

    ``points`` holds both kinds; or give the decode points separately (``decode_points``), e.g.
    prefill measured on a prefill server and decode on a decode server. Fit quality goes into
    ``meta["fit"]``. Raises ValueError as :func:`fit_row` does.
    """
    pts = list(points)
    dec = list(decode_points) if decode_points is not None else pts
    prefill, q_p = fit_row(pts, "prefill", relative=relative)
    decode, q_d = fit_row(dec, "decode", relative=relative)
    m = dict(meta or {})
    m["fit"] = {"prefill": q_p, "decode": q_d, "method": "nnls, relative residuals" if relative else "nnls"}
    return FittedLatency(prefill, decode, meta=m)


def fit_handoff(handoff: Sequence[Mapping[str, float]], latency: FittedLatency) -> LinkFit:
    """KV hand-off from proxy TTFTs: ttft − prefill(l) − decode step(1, l) = latency_s + l·s_per_token.

    prefill(l) is the point's ``prefill_leg_s`` (the proxy's own clock around its POST to the
    prefill server) where every point has one, else the fitted ``latency.prefill_time_s``. The
    leg, not the fit: the proxy's clock splits the probe's TTFT where it splits every workload
    request's (lab 05's pair), so whatever the prefill fit misses of a probe's leg (a slow
    prefill probe, the extra HTTP hop, the finished non-streamed answer) stays out of the hand-off.
    Returns a :class:`~pdlab.simreal.calibration.LinkFit`: non-negative least squares on the
    residual times (a negative residual — the proxy path faster than the model says — is clipped
    to 0); ``mae_s`` is the fit's mean absolute error in seconds. (A relative error is not
    reported: clipped residuals near 0 would make it meaningless.)
    """
    if len(handoff) < 2:
        raise ValueError(f"need >= 2 hand-off points (prompt lengths), got {len(handoff)}")
    ls = np.array([float(h["tokens"]) for h in handoff])
    if len(set(ls)) < 2:
        raise ValueError("hand-off points need >= 2 distinct prompt lengths")
    legs = all(h.get("prefill_leg_s") is not None for h in handoff)
    rest = np.array([float(h["ttft_s"]) - (float(h["prefill_leg_s"]) if legs else latency.prefill_time_s([int(n)]))
                     - latency.decode_time_s([int(n)]) for h, n in zip(handoff, ls, strict=True)])
    rest = np.maximum(rest, 0.0)
    a = np.column_stack([np.ones_like(ls), ls])
    coef = nnls_fit(a, rest)
    pred = a @ coef
    return LinkFit(latency_s=float(coef[0]), s_per_token=float(coef[1]),
                   mae_s=float(np.mean(np.abs(pred - rest))), points=len(rest))


def fit_prefill_stall(stalls: Sequence[Mapping[str, float]], latency: FittedLatency, *, streams: int,
                      stream_prompt: int) -> PrefillStall:
    """The fixed part of what a prefill costs the streams a server decodes
    (:class:`~pdlab.simreal.calibration.PrefillStall`), from :func:`pdlab.serve.probes.probe_prefill_stall`'s
    rows (``prompt_tokens``, ``stall_s``) and the server's probe fit ``latency``: the median over the
    rows of the stall − the prefill row's per-token terms (b_p·P + c_p·P²), kept within [0, a_p − a_d].

    The lone prompt's TTFT (the prefill row) has one fixed cost ``a_p``; the decode step its own,
    ``a_d``. A step that admits a prefill among decoding streams costs the decode step plus the
    prefill's per-token terms plus ``fixed_s``; the rest of ``a_p`` (``off_engine_s``) is spent
    outside the engine loop. Raises ValueError without a row."""
    if not stalls:
        raise ValueError("no prefill stall measured: need >= 1 row with prompt_tokens and stall_s")
    (ap, bp, cp), ad = latency.prefill, latency.decode[0]
    prompts = np.array([float(r["prompt_tokens"]) for r in stalls])
    extra = np.array([float(r["stall_s"]) for r in stalls]) - bp * prompts - cp * prompts ** 2
    raw = float(np.median(extra))
    span = max(ap - ad, 0.0)
    fixed = min(max(raw, 0.0), span)
    return PrefillStall(streams=int(streams), stream_prompt=int(stream_prompt), injections=len(stalls),
                        median_prompt=int(np.median(prompts)), raw_fixed_s=raw, fixed_s=fixed,
                        off_engine_s=span - fixed)


def merge_prefill_points(*passes: Sequence[StepPoint]) -> list[StepPoint]:
    """Prefill points of several passes of :func:`pdlab.serve.probes.probe_prefill` as one: per prompt length (the
    server's count), the median over every pass's samples (``times_s``; a point without them counts
    its ``time_s`` once); ``pass_medians_s`` keeps each pass's own median, in pass order (how far
    the machine drifted between them), ``passes`` their number."""
    by_len: dict[int, list[StepPoint]] = {}
    for points in passes:
        for pt in points:
            by_len.setdefault(int(pt.prefill_tokens), []).append(pt)
    out = []
    for n in sorted(by_len):
        times = tuple(t for pt in by_len[n] for t in (pt.times_s or (pt.time_s,)))
        out.append(replace(by_len[n][0], time_s=float(np.median(times)), samples=len(times), times_s=times,
                           passes=len(by_len[n]), pass_medians_s=tuple(float(pt.time_s) for pt in by_len[n])))
    return out


def contention_factor(alone_s: float, busy_s: float) -> float:
    """How much longer a step takes while the other role works: max(0, busy/alone − 1).

    The simulator's ``InstanceSpec.cpu_contention`` (a step takes ``1 + c`` times as long). A
    faster busy run (noise) gives 0; NaN when ``alone_s`` is not a positive finite time or
    ``busy_s`` is NaN.

    >>> contention_factor(0.200, 0.250)     # 25% slower while the other role works
    0.25
    >>> contention_factor(0.200, 0.190)     # faster by chance: no contention
    0.0
    """
    if not (np.isfinite(alone_s) and alone_s > 0) or np.isnan(busy_s):
        return float("nan")
    return max(0.0, float(busy_s) / float(alone_s) - 1.0)


def admission_overhead_s(period_s: float, m_alone: float, m_busy: float) -> float:
    """Seconds each admitted request adds to the running decode streams: F = T·(1 − m0/m1).

    With one arrival every ``period_s`` (T) seconds, each stretching one decode step by F, the
    mean token gap m1 (``m_busy``) is m0·T/(T − F) where m0 (``m_alone``) is the gap without
    arrivals; solved for F. Not clamped (:func:`pdlab.simreal.probes.admission_from` keeps max(0, F) beside it);
    NaN when ``m_busy`` is not a positive number or an input is NaN.

    >>> round(admission_overhead_s(0.4, 0.010, 0.0125), 6)   # gaps 25% longer, one arrival per 0.4 s
    0.08
    >>> admission_overhead_s(0.4, 0.010, 0.010)              # no change: no overhead
    0.0
    """
    if np.isnan(period_s) or np.isnan(m_alone) or not (m_busy > 0):
        return float("nan")
    return float(period_s) * (1.0 - float(m_alone) / float(m_busy))
