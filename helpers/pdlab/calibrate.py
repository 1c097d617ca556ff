"""Sim-to-real: calibrate the simulator's latency model on a live engine and measure its error.

Three steps, each a function here:

1. **Probe** a live OpenAI-compatible server (vLLM) with the benchmark client
   (:func:`pdlab.serve.bench.run_bench`): single prompts of L tokens with ``max_tokens=1`` give the
   prefill step time (their TTFT); N concurrent streams of P-token prompts with O output tokens
   give the decode step time at batch N and context ≈ P + O/2 (their TPOT); single requests sent
   through a disaggregation proxy give the KV hand-off (proxy + transfer + decode's first step).
   Prompts are random single-token words (no prefix-cache hits); token counts are the server's
   own (``usage.prompt_tokens``), so tokenisation differences do not leak into the fit.
2. **Fit** DistServe's form (:class:`pdlab.sim.latency.FittedLatency`; prefill = a + b·Σl + c·Σl²,
   decode = a + b·Σctx + c·batch) by non-negative least squares on *relative* errors
   (:func:`fit_profile`), and write a profile JSON that :func:`pdlab.sim.latency.load_profile`
   reads (``pdlab simulate --profile PATH``). The fixed cost ``a`` absorbs what the client sees
   beyond the forward pass (HTTP, tokenisation, detokenisation, streaming).
3. **Validate**: replay a benchmark's requests (their actual send times and server token counts)
   in the calibrated simulator (:func:`simulate_like_live`) and compare median/p99 TTFT and TPOT
   and SLO attainment (:func:`compare_runs`, :func:`error_table`).

Simulator set-ups mirror vLLM V1: a colocated server is Sarathi-style chunked batching with a
token budget (``--max-num-batched-tokens``, 2048 by default on CPU) and ``--max-num-seqs``; a
disaggregated deployment follows vLLM's proxy protocol, where the prefill server's one token is
discarded and the decode server generates every output token (so the first token the client sees
comes from decode, after the KV hand-off).

Error targets from the literature: Vidur (MLSys'24, arXiv 2405.05465v2) reports < 9 % error on
request latencies; DistServe (OSDI'24, arXiv 2401.09670v3 §6.5) < 2 % on SLO attainment.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord, percentiles, slo_attainment, tpot_s, ttft_s
from pdlab.sim.latency import PROFILE_FORMAT, FittedLatency, load_profile, save_profile
from pdlab.workloads import Request

__all__ = [
    "ProbePlan",
    "PROBE_PLANS",
    "POINT_KEYS",
    "CalibrationResult",
    "probe_prefill",
    "probe_decode",
    "probe_handoff",
    "probe_contention",
    "calibrate",
    "fit_row",
    "fit_profile",
    "fit_handoff",
    "save_calibration",
    "load_calibration",
    "server_kv_capacity_tokens",
    "build_sim",
    "requests_from_records",
    "simulate_like_live",
    "compare_runs",
    "error_table",
    "TTFT_PHASES",
    "live_ttft_phases",
    "sim_ttft_phases",
    "offered_prefill_load",
    "ERROR_COLUMNS",
]

#: Keys of one timing point (the format of :func:`pdlab.sim.latency.sample_points`).
POINT_KEYS = ("prefill_tokens", "prefill_sq_tokens", "decode_batch", "decode_ctx_tokens", "time_s")


# ---------------------------------------------------------------------------------------------
# Probe plans


@dataclass(frozen=True)
class ProbePlan:
    """What to measure. Lengths in tokens; every point keeps the median of its samples.

    Prefill: each of ``prefill_lengths`` ``repeats`` times, one request at a time. Decode: ``b``
    concurrent streams of ``p``-token prompts for every pair with b·p ≤ ``max_batched_tokens`` (so
    all prompts fit one prefill step and the streams decode together), each generating
    ``decode_tokens`` tokens, ``decode_repeats`` times. Hand-off: each of ``handoff_lengths``
    ``repeats`` times through the proxy. Contention (two servers only): prefills of
    ``contention_prompt`` tokens and decode streams, each alone and while the other server works
    (:func:`probe_contention`).
    """

    prefill_lengths: tuple[int, ...] = (16, 256, 768, 1536)
    decode_batches: tuple[int, ...] = (1, 4, 16, 32)
    decode_prompts: tuple[int, ...] = (32, 512)
    decode_tokens: int = 32
    handoff_lengths: tuple[int, ...] = (32, 512, 1536)
    contention_prompt: int = 1024
    repeats: int = 3
    decode_repeats: int = 2
    max_batched_tokens: int = 2048

    def decode_pairs(self) -> list[tuple[int, int]]:
        """(batch, prompt tokens) pairs that are probed."""
        return [(b, p) for b in self.decode_batches for p in self.decode_prompts if b * p <= self.max_batched_tokens]

    def check(self) -> None:
        """Raise ValueError when the plan cannot identify the three coefficients of each row."""
        if len(set(self.prefill_lengths)) < 3:
            raise ValueError(f"prefill_lengths needs >= 3 distinct lengths, got {self.prefill_lengths}")
        pairs = self.decode_pairs()
        if len({b for b, _ in pairs}) < 2 or len({p for _, p in pairs}) < 2 or len(pairs) < 3:
            raise ValueError("decode probes need >= 3 (batch, prompt) pairs with >= 2 batch sizes and >= 2 prompt "
                             f"lengths (b·p ≤ max_batched_tokens={self.max_batched_tokens}), got {pairs}")
        if self.decode_tokens < 4:
            raise ValueError(f"decode_tokens must be >= 4, got {self.decode_tokens}")
        if self.repeats < 1 or self.decode_repeats < 1:
            raise ValueError(f"repeats and decode_repeats must be >= 1, got {self.repeats}, {self.decode_repeats}")


#: Plans by profile: ``smoke`` (a few seconds), ``ci`` (about 20 s of probes on a quiet 2-core
#: machine), ``full`` (GPU servers, longer prompts and bigger batches).
PROBE_PLANS: dict[str, ProbePlan] = {
    "smoke": ProbePlan(prefill_lengths=(16, 256, 1024), decode_batches=(1, 8), decode_prompts=(32, 128),
                       decode_tokens=16, handoff_lengths=(32, 512), repeats=1, decode_repeats=1),
    "ci": ProbePlan(),
    "full": ProbePlan(prefill_lengths=(16, 128, 512, 1024, 2048, 4096, 8192), decode_batches=(1, 8, 32, 64, 128),
                      decode_prompts=(128, 1024), decode_tokens=128, handoff_lengths=(128, 1024, 4096),
                      repeats=5, decode_repeats=3, max_batched_tokens=8192),
}


# ---------------------------------------------------------------------------------------------
# Probes (live)


def _bench(url: str, requests: list[Request], *, seed: int, max_concurrency: int | None = None,
           **kwargs: Any) -> list[RequestRecord]:
    from pdlab.serve.bench import run_bench

    res = run_bench(url, requests, progress=False, seed=seed, max_concurrency=max_concurrency, **kwargs)
    bad = [r.error for r in res.records if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(res.records)} probe requests to {url} failed: {bad[0]}")
    return res.records


def _server_prompt_tokens(rec: RequestRecord) -> int:
    return int(rec.extra.get("server_prompt_tokens", rec.prompt_tokens))


def probe_prefill(url: str, lengths: Sequence[int], *, repeats: int = 3, seed: int = 0,
                  **bench_kwargs: Any) -> list[dict[str, float]]:
    """Prefill points: one prompt at a time of each length, ``max_tokens=1``; time = median TTFT (s).

    Requests are sent one after another (never overlapping) in a shuffled order, so slow drift
    of the machine spreads over all lengths.
    """
    order = [int(x) for x in lengths for _ in range(repeats)]
    np.random.default_rng(seed).shuffle(order)
    reqs = [Request(i, 0.0, n, 1) for i, n in enumerate(order)]
    recs = _bench(url, reqs, seed=seed, max_concurrency=1, **bench_kwargs)
    by_len: dict[int, list[RequestRecord]] = {}
    for rec in recs:
        by_len.setdefault(rec.prompt_tokens, []).append(rec)
    points = []
    for n in sorted(by_len):
        group = by_len[n]
        tokens = int(np.median([_server_prompt_tokens(r) for r in group]))
        points.append({"prefill_tokens": tokens, "prefill_sq_tokens": float(tokens * tokens), "decode_batch": 0,
                       "decode_ctx_tokens": 0, "time_s": float(np.median([r.ttft_s for r in group])),
                       "samples": len(group), "kind": "prefill"})
    return points


def probe_decode(url: str, pairs: Sequence[tuple[int, int]], *, output_tokens: int = 64, repeats: int = 2,
                 seed: int = 0, **bench_kwargs: Any) -> list[dict[str, float]]:
    """Decode points: ``b`` concurrent streams of ``p``-token prompts generating ``output_tokens``.

    time = median TPOT over streams and repeats (s) — the step time of a decode batch of ``b``
    whose mean context is p + (O − 2)/2 tokens: the O − 1 decode steps read contexts p … p + O − 2
    (the simulator's accounting, :mod:`pdlab.sim.engine`).
    """
    points = []
    for i, (b, p) in enumerate(pairs):
        tpots, ctx = [], []
        for r in range(repeats):
            reqs = [Request(j, 0.0, int(p), int(output_tokens)) for j in range(int(b))]
            recs = _bench(url, reqs, seed=seed + 1000 * i + r, **bench_kwargs)
            tpots += [t for rec in recs if (t := rec.tpot_s) is not None]
            ctx += [_server_prompt_tokens(rec) + (output_tokens - 2) / 2 for rec in recs]
        if not tpots:
            raise RuntimeError(f"decode probe b={b}, p={p}: no request produced more than one token")
        points.append({"prefill_tokens": 0, "prefill_sq_tokens": 0.0, "decode_batch": int(b),
                       "decode_ctx_tokens": float(b * np.mean(ctx)), "time_s": float(np.median(tpots)),
                       "samples": len(tpots), "kind": "decode", "prompt_tokens": int(p)})
    return points


def probe_handoff(proxy_url: str, lengths: Sequence[int], *, repeats: int = 3, seed: int = 0,
                  **bench_kwargs: Any) -> list[dict[str, float]]:
    """TTFT through a disaggregation proxy of single prompts, ``max_tokens=1``: ``{"tokens", "ttft_s"}``.

    Through the proxy a request is prefilled (one token, discarded), its KV is handed to the
    decode server, which generates the first token the client sees. Subtracting the prefill and
    one decode step (:func:`fit_handoff`) leaves the hand-off: proxy, KV transfer, decode-side work.
    """
    order = [int(x) for x in lengths for _ in range(repeats)]
    np.random.default_rng(seed).shuffle(order)
    reqs = [Request(i, 0.0, n, 1) for i, n in enumerate(order)]
    recs = _bench(proxy_url, reqs, seed=seed + 7, max_concurrency=1, **bench_kwargs)
    by_len: dict[int, list[RequestRecord]] = {}
    for rec in recs:
        by_len.setdefault(rec.prompt_tokens, []).append(rec)
    return [{"tokens": int(np.median([_server_prompt_tokens(r) for r in g])),
             "ttft_s": float(np.median([r.ttft_s for r in g])), "samples": len(g)}
            for _, g in sorted(by_len.items())]


def probe_contention(prefill_url: str, decode_url: str, *, prompt_tokens: int = 1024, repeats: int = 3,
                     decode_streams: int = 16, decode_prompt: int = 256, decode_tokens: int = 48, seed: int = 0,
                     **bench_kwargs: Any) -> dict[str, float]:
    """How much each role slows down while the other one works (two servers on one host).

    Prefill: the median TTFT of ``repeats`` single ``prompt_tokens``-token prompts, alone and
    while ``decode_streams`` streams decode on ``decode_url``. Decode: the median TPOT of
    ``decode_streams`` streams, alone and while prompts are prefilled back to back on
    ``prefill_url``. Returns the times (s) and ``prefill``/``decode`` = max(0, busy/alone − 1):
    the simulator's ``InstanceSpec.cpu_contention`` of each role (an iteration takes
    ``1 + cpu_contention`` times as long while the other instance is busy). Measured, not fitted:
    on the course's 2-core CPU the roles are pinned to a core each but share the last-level
    cache, memory bandwidth and the cores' other processes (API servers, proxy, client).
    """
    import threading

    def prefills(tag: int) -> float:
        reqs = [Request(i, 0.0, int(prompt_tokens), 1) for i in range(repeats)]
        recs = _bench(prefill_url, reqs, seed=seed + tag, max_concurrency=1, **bench_kwargs)
        return float(np.median([r.ttft_s for r in recs]))

    def decodes(tag: int) -> float:
        reqs = [Request(i, 0.0, int(decode_prompt), int(decode_tokens)) for i in range(decode_streams)]
        tpots = [t for r in _bench(decode_url, reqs, seed=seed + tag, **bench_kwargs) if (t := r.tpot_s) is not None]
        if not tpots:
            raise RuntimeError("contention probe: no decode stream produced more than one token")
        return float(np.median(tpots))

    def while_busy(background, measure) -> float:
        stop, errors = threading.Event(), []

        def loop() -> None:
            k = 0
            while not stop.is_set():
                try:
                    background(100 + k)
                except Exception as exc:  # noqa: BLE001 - re-raised below, after the thread ends
                    errors.append(exc)
                    return
                k += 1

        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
        try:
            import time

            time.sleep(0.5)   # the background work is under way
            return measure(50)
        finally:
            stop.set()
            worker.join(timeout=120)
            if errors:
                raise RuntimeError(f"contention probe: background load failed: {errors[0]}") from errors[0]

    prefill_alone = prefills(1)
    prefill_busy = while_busy(decodes, prefills)
    decode_alone = decodes(2)
    decode_busy = while_busy(prefills, decodes)
    return {"prompt_tokens": int(prompt_tokens), "decode_streams": int(decode_streams),
            "prefill_alone_s": prefill_alone, "prefill_busy_s": prefill_busy,
            "decode_alone_s": decode_alone, "decode_busy_s": decode_busy,
            "prefill": max(0.0, prefill_busy / prefill_alone - 1.0),
            "decode": max(0.0, decode_busy / decode_alone - 1.0)}


# ---------------------------------------------------------------------------------------------
# Fitting


def _validate_points(points: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    out = []
    for i, p in enumerate(points):
        if not isinstance(p, Mapping):
            raise ValueError(f"point {i} must be a mapping with keys {', '.join(POINT_KEYS)}, got {type(p).__name__}")
        missing = [k for k in POINT_KEYS if k not in p]
        if missing:
            raise ValueError(f"point {i} lacks {', '.join(missing)} (a point needs {', '.join(POINT_KEYS)})")
        row = {}
        for k in POINT_KEYS:
            v = p[k]
            if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) \
                    or not math.isfinite(float(v)):
                raise ValueError(f"point {i}: {k} must be a finite number, got {v!r}")
            if float(v) < 0:
                raise ValueError(f"point {i}: {k} must be >= 0, got {v!r}")
            row[k] = float(v)
        if row["time_s"] <= 0:
            raise ValueError(f"point {i}: time_s must be > 0 seconds, got {p['time_s']!r}")
        if row["prefill_tokens"] > 0 and row["decode_batch"] > 0:
            raise ValueError(f"point {i} mixes prefill and decode; calibration points are prefill-only or decode-only")
        if row["prefill_tokens"] == 0 and row["decode_batch"] == 0:
            raise ValueError(f"point {i} has neither prefill tokens nor a decode batch")
        out.append(row)
    return out


def _design(kind: str, pts: list[dict[str, float]]) -> np.ndarray:
    if kind == "prefill":
        return np.array([[1.0, p["prefill_tokens"], p["prefill_sq_tokens"]] for p in pts])
    return np.array([[1.0, p["decode_ctx_tokens"], p["decode_batch"]] for p in pts])


def fit_row(points: Iterable[Mapping[str, Any]], kind: str, *, relative: bool = True
            ) -> tuple[tuple[float, float, float], dict[str, float]]:
    """Fit one row of :class:`FittedLatency` (``kind`` = ``"prefill"`` or ``"decode"``).

    Non-negative least squares (as :func:`pdlab.sim.latency.fit_latency`), on relative errors
    when ``relative`` (every point counts the same, short and long). Returns the coefficients
    (a, b, c) in seconds (prefill: s, s/token, s/token²; decode: s, s/context token, s/sequence)
    and fit quality: ``r2``, ``mape`` (mean |relative residual|), ``max_rel_err``, ``points``.

    Raises ValueError naming the problem for malformed points, fewer than three points of this
    kind, or points that cannot separate the three coefficients (e.g. one prompt length only).
    """
    from scipy.optimize import nnls

    if kind not in ("prefill", "decode"):
        raise ValueError(f"kind must be 'prefill' or 'decode', got {kind!r}")
    pts = [p for p in _validate_points(points)
           if (p["prefill_tokens"] > 0 if kind == "prefill" else p["decode_batch"] > 0)]
    if len(pts) < 3:
        raise ValueError(f"need >= 3 {kind} points to fit a + b·x + c·y, got {len(pts)}")
    a = _design(kind, pts)
    y = np.array([p["time_s"] for p in pts])
    if np.linalg.matrix_rank(a / np.abs(a).max(axis=0)) < 3:
        what = "distinct prompt lengths" if kind == "prefill" else \
            "batch sizes and contexts that vary independently (several batches, several prompt lengths)"
        raise ValueError(f"{kind} points cannot separate the three coefficients: they need >= 3 {what}")
    w = 1.0 / y if relative else np.ones_like(y)
    aw = a * w[:, None]
    scale = np.abs(aw).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(aw / scale, y * w)
    coef = coef / scale
    pred = a @ coef
    rel = (pred - y) / y
    ss_tot = float(((y - y.mean()) ** 2).sum())
    quality = {"r2": 1.0 - float(((pred - y) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan"),
               "mape": float(np.abs(rel).mean()), "max_rel_err": float(np.abs(rel).max()), "points": len(pts)}
    return (float(coef[0]), float(coef[1]), float(coef[2])), quality


def fit_profile(points: Iterable[Mapping[str, Any]], *, decode_points: Iterable[Mapping[str, Any]] | None = None,
                relative: bool = True, meta: dict[str, Any] | None = None) -> FittedLatency:
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


def fit_handoff(handoff: Sequence[Mapping[str, float]], latency: FittedLatency) -> dict[str, float]:
    """KV hand-off from proxy TTFTs: ttft − prefill(l) − decode step(1, l) = latency_s + l·s_per_token.

    Returns ``{"latency_s", "s_per_token", "mae_s", "points"}``: non-negative least squares on the
    residual times (a negative residual — the proxy path faster than the model says — is clipped
    to 0); ``mae_s`` is the fit's mean absolute error in seconds. (A relative error is not
    reported: clipped residuals near 0 would make it meaningless.)
    """
    from scipy.optimize import nnls

    if len(handoff) < 2:
        raise ValueError(f"need >= 2 hand-off points (prompt lengths), got {len(handoff)}")
    ls = np.array([float(h["tokens"]) for h in handoff])
    if len(set(ls)) < 2:
        raise ValueError("hand-off points need >= 2 distinct prompt lengths")
    rest = np.array([float(h["ttft_s"]) - latency.prefill_time_s([int(n)]) - latency.decode_time_s([int(n)])
                     for h, n in zip(handoff, ls, strict=True)])
    rest = np.maximum(rest, 0.0)
    a = np.column_stack([np.ones_like(ls), ls])
    scale = np.abs(a).max(axis=0)
    coef, _ = nnls(a / scale, rest)
    coef = coef / scale
    pred = a @ coef
    return {"latency_s": float(coef[0]), "s_per_token": float(coef[1]),
            "mae_s": float(np.mean(np.abs(pred - rest))), "points": len(rest)}


# ---------------------------------------------------------------------------------------------
# Calibration end to end


@dataclass
class CalibrationResult:
    """A calibrated latency model, the points it was fitted to, and the KV hand-off (if probed)."""

    latency: FittedLatency
    prefill_points: list[dict[str, float]]
    decode_points: list[dict[str, float]]
    handoff_points: list[dict[str, float]] = field(default_factory=list)
    kv_link: dict[str, float] | None = None
    seconds: float = 0.0
    contention: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"prefill": list(self.latency.prefill), "decode": list(self.latency.decode),
                "fit": self.latency.meta.get("fit"), "kv_link": self.kv_link, "seconds": self.seconds,
                "cpu_contention": self.contention}


def calibrate(url: str, *, plan: ProbePlan | str = "ci", decode_url: str | None = None,
              proxy_url: str | None = None, seed: int = 0, meta: dict[str, Any] | None = None,
              **bench_kwargs: Any) -> CalibrationResult:
    """Probe ``url`` (prefill) and ``decode_url`` (decode; default ``url``), fit, and return the model.

    With ``proxy_url`` (a disaggregation proxy in front of those servers) the KV hand-off is
    probed too and fitted as a link with a fixed latency and a per-token time (``kv_link``).
    With two servers (``decode_url`` ≠ ``url``) each role's slowdown while the other works is
    measured (:func:`probe_contention`, ``meta["cpu_contention"]``).
    ``plan`` is a :class:`ProbePlan` or a key of :data:`PROBE_PLANS`.
    """
    import time

    if isinstance(plan, str):
        if plan not in PROBE_PLANS:
            raise ValueError(f"unknown probe plan {plan!r}; known: {', '.join(PROBE_PLANS)}")
        plan = PROBE_PLANS[plan]
    plan.check()
    t0 = time.perf_counter()
    pre = probe_prefill(url, plan.prefill_lengths, repeats=plan.repeats, seed=seed, **bench_kwargs)
    dec = probe_decode(decode_url or url, plan.decode_pairs(), output_tokens=plan.decode_tokens,
                       repeats=plan.decode_repeats, seed=seed + 1, **bench_kwargs)
    info = {"source": "pdlab sim calibrate", "url": url, "decode_url": decode_url or url,
            "probe_plan": asdict(plan), "points": pre + dec, **(meta or {})}
    lat = fit_profile(pre, decode_points=dec, meta=info)
    handoff, link = [], None
    if proxy_url:
        handoff = probe_handoff(proxy_url, plan.handoff_lengths, repeats=plan.repeats, seed=seed + 2, **bench_kwargs)
        link = fit_handoff(handoff, lat)
        lat.meta["kv_link"] = link
        lat.meta["handoff_points"] = handoff
        lat.meta["proxy_url"] = proxy_url
    contention = None
    if decode_url and decode_url != url:
        contention = probe_contention(url, decode_url, prompt_tokens=plan.contention_prompt,
                                      repeats=plan.repeats, seed=seed + 3, **bench_kwargs)
        lat.meta["cpu_contention"] = contention
    res = CalibrationResult(lat, pre, dec, handoff, link, time.perf_counter() - t0, contention)
    lat.meta["calibration_s"] = res.seconds
    return res


def save_calibration(result: CalibrationResult | FittedLatency, path: str | Path) -> Path:
    """Write the profile JSON (``pdlab-latency-profile/1``; readable by ``load_profile``)."""
    lat = result.latency if isinstance(result, CalibrationResult) else result
    path = save_profile(lat, path)
    json.loads(path.read_text())  # written as valid JSON
    return path


def load_calibration(path: str | Path) -> FittedLatency:
    """Read a calibrated profile (``load_profile``; the points, fit and ``kv_link`` are in ``meta``)."""
    lat = load_profile(path)
    fmt = json.loads(Path(path).read_text()).get("format")
    if fmt not in (None, PROFILE_FORMAT):
        raise ValueError(f"{path}: unknown profile format {fmt!r}; expected {PROFILE_FORMAT}")
    return lat


def server_kv_capacity_tokens(url: str, default: int | None = None) -> int:
    """KV tokens a vLLM server holds: ``num_gpu_blocks × block_size`` from ``vllm:cache_config_info``."""
    import urllib.request

    from pdlab.serve.evidence import parse_prometheus

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as resp:
            samples = parse_prometheus(resp.read().decode("utf-8", "replace"))
    except OSError:
        samples = []
    for name, labels, _ in samples:
        if name in ("vllm:cache_config_info", "vllm_cache_config_info"):
            try:
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                break
    if default is None:
        raise ValueError(f"{url}/metrics has no vllm:cache_config_info with num_gpu_blocks and block_size")
    return default


# ---------------------------------------------------------------------------------------------
# The simulator, set up like the live deployments


def build_sim(mode: str, latency: FittedLatency, *, decode_latency: FittedLatency | None = None,
              kv_capacity_tokens: int = 131072, token_budget: int = 2048, max_num_seqs: int = 128,
              kv_link: Mapping[str, float] | None = None, cpu_contention: Mapping[str, float] | None = None,
              handoff_reservation: str = "vllm", link_sharing: str = "fair"):
    """A :class:`pdlab.sim.Simulator` shaped like the live set-up.

    ``colocated``: one instance, vLLM V1 scheduling = chunked prefill with ``token_budget``
    (``--max-num-batched-tokens``) and ``max_num_seqs``. ``disaggregated``: one prefill instance
    (``latency``) and one decode instance (``decode_latency``, default ``latency``) joined by a
    link with ``kv_link`` = ``{"latency_s", "s_per_token"}`` (default: ``latency.meta["kv_link"]``,
    else instantaneous), and the hand-off physics of vLLM's NIXL connector
    (:mod:`pdlab.sim.engine`): the decode instance reserves the prompt's KV before the pull and
    starts none while ``max_num_seqs`` requests run (``handoff_reservation="vllm"``), concurrent
    pulls share the link (``link_sharing="fair"``), and each role is slowed by the other's work
    by ``cpu_contention`` = ``{"prefill": c_p, "decode": c_d}`` (default:
    ``latency.meta["cpu_contention"]``, measured by :func:`probe_contention`; else none).
    """
    from pdlab.sim import ClusterSpec, KVLink, PoolSpec, build_cluster

    if mode == "colocated":
        pool = PoolSpec("colocated", latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                        options={"scheduler": "chunked", "token_budget": token_budget, "max_num_seqs": max_num_seqs,
                                 "max_batched_tokens": token_budget})
        return build_cluster(ClusterSpec([pool], dispatch="round_robin"))
    if mode != "disaggregated":
        raise ValueError(f"mode must be colocated or disaggregated, got {mode!r}")
    link = dict(kv_link if kv_link is not None else latency.meta.get("kv_link") or {})
    s_per_token = float(link.get("s_per_token", 0.0))
    kvl = KVLink(kv_bytes_per_token=1.0, bandwidth_bytes_per_s=1.0 / s_per_token if s_per_token > 0 else None,
                 latency_s=float(link.get("latency_s", 0.0)), sharing=link_sharing)
    contention = dict(cpu_contention if cpu_contention is not None else latency.meta.get("cpu_contention") or {})
    shared = {role: float(contention.get(role, 0.0)) for role in ("prefill", "decode")}
    group = "host" if any(shared.values()) else None
    common = dict(token_budget=token_budget, max_num_seqs=max_num_seqs, max_batched_tokens=token_budget,
                  cpu_group=group)
    pools = [PoolSpec("prefill", latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["prefill"]}),
             PoolSpec("decode", latency=decode_latency or latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["decode"],
                               "handoff_reservation": handoff_reservation})]
    return build_cluster(ClusterSpec(pools, link=kvl, dispatch="shortest_queue"))


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
        prompt = _server_prompt_tokens(r) if use_server_tokens else r.prompt_tokens
        output = int(r.extra.get("target_output_tokens", r.output_tokens) or r.output_tokens)
        out.append(Request(i if not isinstance(r.request_id, int) else r.request_id, r.arrival_s - t0,
                           max(1, prompt), max(1, output)))
    return out


def simulate_like_live(requests: Sequence[Request], mode: str, latency: FittedLatency, **kwargs: Any
                       ) -> list[RequestRecord]:
    """Simulate ``requests`` in the set-up ``mode`` (see :func:`build_sim`, same keywords).

    Disaggregated: vLLM's proxy protocol — the prefill instance's token is discarded and decode
    generates all ``output_tokens``; each request is simulated with one more output token and its
    first token time is that of the first decode step (the token the client sees first).
    """
    sim = build_sim(mode, latency, **kwargs)
    if mode == "colocated":
        return sim.run(list(requests)).records
    padded = [replace(r, output_tokens=r.output_tokens + 1) for r in requests]
    out = []
    for rec, req in zip(sim.run(padded).records, padded, strict=True):
        times = list(rec.token_times_s or [])
        if rec.ok and len(times) >= 2:
            rec = replace(rec, first_token_s=times[1], token_times_s=times[1:], output_tokens=req.output_tokens - 1)
        else:
            rec = replace(rec, output_tokens=req.output_tokens - 1)
        out.append(rec)
    return out


# ---------------------------------------------------------------------------------------------
# Errors


#: Columns of :func:`error_table` (relative errors are (sim − live) / live; attainment in points).
ERROR_COLUMNS = ("setup", "rate_rps", "requests", "ttft_p50_live_s", "ttft_p50_sim_s", "ttft_p50_err",
                 "ttft_p99_live_s", "ttft_p99_sim_s", "ttft_p99_err", "tpot_p50_live_s", "tpot_p50_sim_s",
                 "tpot_p50_err", "tpot_p99_live_s", "tpot_p99_sim_s", "tpot_p99_err", "attainment_live",
                 "attainment_sim", "attainment_diff_pp")


def _rel(sim: float, live: float) -> float:
    if not (math.isfinite(sim) and math.isfinite(live)) or live == 0:
        return float("nan")
    return (sim - live) / live


def compare_runs(live: Sequence[RequestRecord], sim: Sequence[RequestRecord], slo: SLO, **labels: Any
                 ) -> dict[str, Any]:
    """One row: median and p99 TTFT and TPOT of both runs (s), their relative errors
    ((sim − live) / live), and SLO attainment of both with the difference in percentage points.

    ``labels`` (e.g. ``setup="colocated", rate_rps=4``) are put first in the row. Raises
    ValueError when either run is empty.
    """
    if not live or not sim:
        raise ValueError(f"both runs need records, got {len(live)} live and {len(sim)} simulated")
    row: dict[str, Any] = dict(labels)
    row["requests"] = len(live)
    for metric, fn in (("ttft", ttft_s), ("tpot", tpot_s)):
        lv, sv = percentiles(fn(live), (50, 99)), percentiles(fn(sim), (50, 99))
        for p in ("p50", "p99"):
            row[f"{metric}_{p}_live_s"] = lv[p]
            row[f"{metric}_{p}_sim_s"] = sv[p]
            row[f"{metric}_{p}_err"] = _rel(sv[p], lv[p])
    row["attainment_live"] = slo_attainment(live, slo)
    row["attainment_sim"] = slo_attainment(sim, slo)
    row["attainment_diff_pp"] = 100.0 * (row["attainment_sim"] - row["attainment_live"])
    return row


def error_table(rows: Sequence[Mapping[str, Any]]):
    """A pandas DataFrame of :func:`compare_runs` rows, columns in :data:`ERROR_COLUMNS` order."""
    import pandas as pd

    if not rows:
        raise ValueError("no comparison rows")
    df = pd.DataFrame(list(rows))
    cols = [c for c in ERROR_COLUMNS if c in df.columns] + [c for c in df.columns if c not in ERROR_COLUMNS]
    return df[cols]


# ---------------------------------------------------------------------------------------------
# Where the TTFT goes, live and simulated

#: The two phases of a disaggregated TTFT that both the live breakdown and the simulator have.
TTFT_PHASES = ("prefill side", "hand-off to first token")

#: Which parts of a live breakdown (:mod:`pdlab.serve.ttft`) make up each phase.
_LIVE_PHASE_PARTS = {"prefill side": ("proxy", "prefill front end", "prefill queue", "prefill compute"),
                     "hand-off to first token": ("decode front end", "decode queue", "KV transfer",
                                                 "decode first step")}


def live_ttft_phases(parts: Mapping[str, float]) -> dict[str, float]:
    """A live disaggregated TTFT breakdown's parts (s, ``TTFTBreakdown.parts``) summed into
    :data:`TTFT_PHASES`: the prefill side (proxy, prefill front end, queue and compute) and the
    hand-off to the first token (decode front end, queue, KV transfer, first step). Raises KeyError
    on a missing part."""
    return {phase: float(sum(parts[k] for k in keys)) for phase, keys in _LIVE_PHASE_PARTS.items()}


def sim_ttft_phases(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Mean :data:`TTFT_PHASES` (s) of simulated disaggregated records: arrival → start of the KV
    pull, and from there to the first token (the fitted hand-off, the decode queue and first step).
    Raises ValueError without hand-off records."""
    rows = [(r.extra["kv_transfer_start_s"] - r.arrival_s, r.first_token_s - r.extra["kv_transfer_start_s"])
            for r in records if r.ok and r.first_token_s is not None and "kv_transfer_start_s" in r.extra]
    if not rows:
        raise ValueError("no simulated record has a KV hand-off (is this a disaggregated run?)")
    means = np.mean(np.array(rows), axis=0)
    return dict(zip(TTFT_PHASES, (float(x) for x in means), strict=True))


def offered_prefill_load(requests: Sequence[Request], latency: FittedLatency) -> float:
    """Utilisation the prompts alone ask of one server: Σ isolated prefill times / arrival span.

    Near 1 the queue (and so TTFT) is extremely sensitive to the server's speed: a few percent of
    unmodelled slowdown becomes a large TTFT error. Raises ValueError for fewer than 2 requests.
    """
    if len(requests) < 2:
        raise ValueError(f"need >= 2 requests to define an arrival span, got {len(requests)}")
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals)
    if span <= 0:
        raise ValueError("all requests arrive at once: no arrival span")
    n = len(requests)
    return sum(latency.prefill_time_s([r.prompt_tokens]) for r in requests) * (n - 1) / n / span
