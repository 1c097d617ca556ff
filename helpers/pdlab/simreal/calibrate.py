"""Sim-to-real: calibrate the simulator's latency model on a live engine and measure its error.

Three steps; the first is live and lives in :mod:`pdlab.serve.probes` (with :func:`calibrate
<pdlab.serve.probes.calibrate>`, which runs the probes and the fit), the rest are pure functions here:

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord, percentiles, read_records, slo_attainment, tpot_s, ttft_s
from pdlab.sim.latency import PROFILE_FORMAT, FittedLatency, load_profile
from pdlab.simreal.records import Calibration, Contention, LinkFit, PrefillStall, StepPoint
from pdlab.workloads import Request

__all__ = [
    "POINT_KEYS",
    "fit_row",
    "fit_profile",
    "fit_handoff",
    "merge_prefill_points",
    "contention_factor",
    "admission_overhead_s",
    "save_calibration",
    "load_calibration",
    "SavedRun",
    "load_saved_run",
    "build_sim",
    "fit_prefill_stall",
    "engine_latency",
    "requests_from_records",
    "server_prompt_tokens",
    "simulate_like_live",
    "compare_runs",
    "replay_pairs",
    "paired_error",
    "error_table",
    "TTFT_PHASES",
    "live_ttft_phases",
    "sim_ttft_phases",
    "offered_prefill_load",
    "window_memory",
    "rate_for_load",
    "decode_steps_vs_model",
    "run_decode_points",
    "fit_decode_joint",
    "refit_decode_on_run",
    "scale_decode_on_run",
    "match_decode_to_tpot_on_run",
    "quiet_step_ratio",
    "quiet_ttft_ratio",
    "refit_decode_contention_on_run",
    "step_ratio_windows",
    "decode_gap_tail",
    "prefill_quiet_requests",
    "decode_busy_while_waiting",
    "streams_on_arrival",
    "ttft_sides",
    "refit_prefill_on_run",
    "refit_front_end_on_run",
    "refit_handoff_on_run",
    "match_prefill_contention_on_run",
    "with_prefill_contention",
    "fit_on_run",
    "arrival_rate_rps",
    "with_prefill_core_load",
    "refit_prefill_core_load_on_run",
    "split_co_runner_cpu",
    "ERROR_COLUMNS",
]

#: Fields of a :class:`~pdlab.simreal.records.StepPoint` that the fit reads: the keys a timing point
#: given as a mapping must have (the format of :func:`pdlab.sim.latency.sample_points`).
POINT_KEYS = ("prefill_tokens", "prefill_sq_tokens", "decode_batch", "decode_ctx_tokens", "time_s")


# ---------------------------------------------------------------------------------------------
# Fitting


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

    ``points``: :class:`~pdlab.simreal.records.StepPoint` (or mappings with the keys :data:`POINT_KEYS`,
    as :func:`pdlab.sim.latency.sample_points` makes them); those of the other kind are left out.
    Non-negative least squares (as :func:`pdlab.sim.latency.fit_latency`), on relative errors
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
    coef = _nnls(a, y, relative)
    return (float(coef[0]), float(coef[1]), float(coef[2])), _quality(a @ coef, y)


def _nnls(a: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    """Non-negative least squares of ``a @ coef ≈ y``, on relative residuals when ``relative``,
    with the columns scaled to 1 (the coefficients differ by orders of magnitude)."""
    from scipy.optimize import nnls

    w = 1.0 / y if relative else np.ones_like(y)
    aw = a * w[:, None]
    scale = np.abs(aw).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(aw / scale, y * w)
    return coef / scale


def _quality(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
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
    request's (:func:`ttft_sides`), so whatever the prefill fit misses of a probe's leg (a slow
    prefill probe, the extra HTTP hop, the finished non-streamed answer) stays out of the hand-off.
    Returns a :class:`~pdlab.simreal.records.LinkFit`: non-negative least squares on the
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
    legs = all(h.get("prefill_leg_s") is not None for h in handoff)
    rest = np.array([float(h["ttft_s"]) - (float(h["prefill_leg_s"]) if legs else latency.prefill_time_s([int(n)]))
                     - latency.decode_time_s([int(n)]) for h, n in zip(handoff, ls, strict=True)])
    rest = np.maximum(rest, 0.0)
    a = np.column_stack([np.ones_like(ls), ls])
    scale = np.abs(a).max(axis=0)
    coef, _ = nnls(a / scale, rest)
    coef = coef / scale
    pred = a @ coef
    return LinkFit(latency_s=float(coef[0]), s_per_token=float(coef[1]),
                   mae_s=float(np.mean(np.abs(pred - rest))), points=len(rest))


# ---------------------------------------------------------------------------------------------
# Probe arithmetic (the live probes that use it are pdlab.serve.probes)


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
    arrivals; solved for F. Not clamped (:func:`pdlab.serve.probes.probe_admission` reports max(0, F) beside it);
    NaN when ``m_busy`` is not a positive number or an input is NaN.

    >>> round(admission_overhead_s(0.4, 0.010, 0.0125), 6)   # gaps 25% longer, one arrival per 0.4 s
    0.08
    >>> admission_overhead_s(0.4, 0.010, 0.010)              # no change: no overhead
    0.0
    """
    if np.isnan(period_s) or np.isnan(m_alone) or not (m_busy > 0):
        return float("nan")
    return float(period_s) * (1.0 - float(m_alone) / float(m_busy))


# ---------------------------------------------------------------------------------------------
# Profiles


def save_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write ``calibration`` as a profile JSON (``pdlab-latency-profile/1``, :meth:`Calibration.to_dict`;
    readable by ``load_profile`` and :func:`load_calibration`). Creates the parent folder."""
    if not isinstance(calibration, Calibration):
        raise TypeError(f"save_calibration needs a Calibration, got {type(calibration).__name__} "
                        "(wrap a fitted model: Calibration.from_latency(latency))")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
    return path


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibrated profile: the model (checked by ``load_profile``) and the typed measurements
    its ``meta`` holds (:meth:`Calibration.from_latency`)."""
    lat = load_profile(path)
    fmt = json.loads(Path(path).read_text()).get("format")
    if fmt not in (None, PROFILE_FORMAT):
        raise ValueError(f"{path}: unknown profile format {fmt!r}; expected {PROFILE_FORMAT}")
    return Calibration.from_latency(lat)


@dataclass(frozen=True)
class SavedRun:
    """One set-up of a lab 05 ``OUT_DIR``, as the lab writes it for offline refits: the probe
    calibration (``<setup>_profile.json``), the KV capacity (tokens, ``kv_capacity.json``) and each
    rate's records (``<setup>_<rate>rps_records.jsonl``, failed requests included), by rate (req/s),
    ascending. Read with :func:`load_saved_run`."""

    out_dir: Path
    setup: str
    calibration: Calibration
    kv_capacity_tokens: int
    records: dict[float, list[RequestRecord]]

    def completed(self, rate: float) -> list[RequestRecord]:
        """``rate``'s requests that gave a first token, in arrival order."""
        return sorted((r for r in self.records[rate] if r.ok and r.first_token_s is not None),
                      key=lambda r: r.arrival_s)

    def cpu_samples(self, rate: float) -> list:
        """``rate``'s co-runner CPU samples, one list per block (``<setup>_<rate>rps_cpu_samples.json``)."""
        return json.loads((self.out_dir / f"{self.setup}_{rate:g}rps_cpu_samples.json").read_text())


def load_saved_run(out_dir: str | Path, setup: str) -> SavedRun:
    """Read ``setup``'s calibration, KV capacity and records from a lab 05 ``OUT_DIR``. Raises
    FileNotFoundError naming the file that is missing, ValueError when the folder has no records
    of ``setup``."""
    out_dir = Path(out_dir)
    paths = list(out_dir.glob(f"{setup}_*rps_records.jsonl"))
    if not paths:
        raise ValueError(f"{out_dir}: no {setup}_<rate>rps_records.jsonl (not a lab 05 OUT_DIR, or another set-up)")
    rates = sorted(float(p.name.removeprefix(f"{setup}_").removesuffix("rps_records.jsonl")) for p in paths)
    return SavedRun(out_dir, setup, load_calibration(out_dir / f"{setup}_profile.json"),
                    int(json.loads((out_dir / "kv_capacity.json").read_text())[setup]),
                    {r: read_records(out_dir / f"{setup}_{r:g}rps_records.jsonl") for r in rates})


# ---------------------------------------------------------------------------------------------
# The simulator, set up like the live deployments


def build_sim(mode: str, latency: FittedLatency, *, decode_latency: FittedLatency | None = None,
              kv_capacity_tokens: int = 131072, token_budget: int = 2048, max_num_seqs: int = 128,
              kv_link: LinkFit | Mapping[str, float] | None = None,
              cpu_contention: Contention | Mapping[str, float] | None = None,
              handoff_reservation: str = "vllm", link_sharing: str = "fair",
              admit_overhead_s: float = 0.0):
    """A :class:`pdlab.sim.Simulator` shaped like the live set-up.

    ``colocated``: one instance, vLLM V1 scheduling = chunked prefill with ``token_budget``
    (``--max-num-batched-tokens``) and ``max_num_seqs``. ``disaggregated``: one prefill instance
    (``latency``) and one decode instance (``decode_latency``, default ``latency``) joined by a
    link with ``kv_link`` (a :class:`~pdlab.simreal.records.LinkFit`, or its profile form
    ``{"latency_s", "s_per_token"}``; default: the one ``latency.meta`` holds, else instantaneous),
    and the hand-off physics of vLLM's NIXL connector
    (:mod:`pdlab.sim.engine`): the decode instance reserves the prompt's KV before the pull and
    starts none while ``max_num_seqs`` requests run (``handoff_reservation="vllm"``), concurrent
    pulls share the link (``link_sharing="fair"``), and each role is slowed by the other's work
    by ``cpu_contention`` (a :class:`~pdlab.simreal.records.Contention` or
    ``{"prefill": c_p, "decode": c_d}``; default: the one ``latency.meta`` holds, measured by
    :func:`pdlab.serve.probes.probe_contention`; else none),
    and every handed-off request adds ``admit_overhead_s`` to the decode step that admits it
    (default 0, not read from the profile: :func:`pdlab.serve.probes.probe_admission` stores its
    measurement (:class:`~pdlab.simreal.records.Admission`) in ``latency.meta``, but on the
    course's 2-core CPU it moves with the machine's other load, even changing sign between runs; lab 05 replays with and without it. Pass
    it explicitly where the probe resolves it, e.g. on a GPU host).
    """
    from pdlab.sim import ClusterSpec, KVLink, PoolSpec, build_cluster

    if mode == "colocated":
        pool = PoolSpec("colocated", latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                        options={"scheduler": "chunked", "token_budget": token_budget, "max_num_seqs": max_num_seqs,
                                 "max_batched_tokens": token_budget})
        return build_cluster(ClusterSpec([pool], dispatch="round_robin"))
    if mode != "disaggregated":
        raise ValueError(f"mode must be colocated or disaggregated, got {mode!r}")
    measured = Calibration.from_latency(latency)
    link = _record(LinkFit, kv_link) if kv_link is not None else measured.kv_link or LinkFit(0.0, 0.0)
    kvl = KVLink(kv_bytes_per_token=1.0,
                 bandwidth_bytes_per_s=1.0 / link.s_per_token if link.s_per_token > 0 else None,
                 latency_s=link.latency_s, sharing=link_sharing)
    contention = _record(Contention, cpu_contention) if cpu_contention is not None else measured.contention
    shared = {"prefill": contention.prefill if contention else 0.0, "decode": contention.decode if contention else 0.0}
    group = "host" if any(shared.values()) else None
    common = dict(token_budget=token_budget, max_num_seqs=max_num_seqs, max_batched_tokens=token_budget,
                  cpu_group=group)
    pools = [PoolSpec("prefill", latency=latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["prefill"]}),
             PoolSpec("decode", latency=decode_latency or latency, kv_capacity_tokens=kv_capacity_tokens,
                      options={**common, "cpu_contention": shared["decode"], "admit_overhead_s": admit_overhead_s,
                               "handoff_reservation": handoff_reservation})]
    return build_cluster(ClusterSpec(pools, link=kvl, dispatch="shortest_queue"))


def _record(cls: type, value: Any) -> Any:
    """``value`` as the typed record ``cls``: itself, or read from its profile form (a mapping)."""
    return value if isinstance(value, cls) else cls.from_dict(value)


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


def fit_prefill_stall(stalls: Sequence[Mapping[str, float]], latency: FittedLatency, *, streams: int,
                      stream_prompt: int) -> PrefillStall:
    """The fixed part of what a prefill costs the streams a server decodes
    (:class:`~pdlab.simreal.records.PrefillStall`), from :func:`pdlab.serve.probes.probe_prefill_stall`'s
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


def engine_latency(latency: FittedLatency) -> tuple[FittedLatency, float]:
    """``latency`` as one engine runs it, and the seconds each request spends outside that engine.

    With a measured prefill stall (``meta["prefill_stall"]``, :func:`fit_prefill_stall`) the
    prefill row's fixed cost becomes ``a_d + fixed_s``, so a mixed step costs the decode step +
    ``fixed_s`` + the prefill's per-token terms, and ``off_engine_s`` (= a_p − that) is returned to
    be added to each request's arrival: a lone prompt's TTFT is unchanged. Without one (or with
    its ``fixed_s`` unknown), ``latency`` unchanged and 0."""
    entry = latency.meta.get("prefill_stall")
    if not entry:
        return latency, 0.0
    stall = PrefillStall.from_dict(entry)
    (ap, bp, cp), ad = latency.prefill, latency.decode[0]
    if not math.isfinite(stall.fixed_s) or ap <= ad + stall.fixed_s:
        return latency, 0.0
    engine_a = ad + stall.fixed_s
    return (FittedLatency((engine_a, bp, cp), latency.decode, tp=latency.tp, pp=latency.pp, meta=latency.meta),
            ap - engine_a)


def simulate_like_live(requests: Sequence[Request], mode: str, latency: FittedLatency, *,
                       front_end_s: float | None = None, **kwargs: Any) -> list[RequestRecord]:
    """Simulate ``requests`` in the set-up ``mode`` (see :func:`build_sim`, same keywords).

    Disaggregated: vLLM's proxy protocol — the prefill instance's token is discarded and decode
    generates all ``output_tokens``; each request is simulated with one more output token and its
    first token time is that of the first decode step (the token the client sees first).

    A pair whose ``latency.meta`` holds a prefill core load (``prefill_core_base_cores``,
    ``prefill_core_cpu_s_per_request``: :func:`refit_prefill_core_load_on_run`) runs its prefill
    role with the prefill row stretched
    by the co-runners' share of that core at these requests' rate (:func:`with_prefill_core_load`);
    the decode role keeps ``latency`` (or ``decode_latency``).

    ``front_end_s`` (default: ``latency.meta["front_end_s"]``, else 0): seconds each request spends
    before it reaches the engine that the engine does not spend (HTTP, tokenisation, the front
    end's event loop busy streaming other requests' tokens; :func:`refit_front_end_on_run`). The
    request reaches the simulated engine that much after it was sent, and its TTFT counts from
    the send.

    Colocated, with a measured prefill stall (``latency.meta["prefill_stall"]``,
    :func:`fit_prefill_stall`), the engine runs :func:`engine_latency`'s model: a prefill costs the
    engine ``a_d + fixed_s`` and not the lone TTFT's ``a_p``, and each request reaches the engine
    ``off_engine_s`` later as well (its lone TTFT is unchanged; the streams it joins are held up less).
    """
    if front_end_s is None:
        front_end_s = float(latency.meta.get("front_end_s", 0.0))
    if front_end_s < 0:
        raise ValueError(f"front_end_s must be >= 0, got {front_end_s}")
    if mode == "colocated":
        latency, off_engine_s = engine_latency(latency)
        front_end_s += off_engine_s
    if latency.meta.get("prefill_core_cpu_s_per_request") or latency.meta.get("prefill_core_base_cores"):
        if mode != "disaggregated":
            raise ValueError("a prefill core load models a prefill/decode pair's prefill core; "
                             f"mode {mode!r} has no prefill role")
        kwargs.setdefault("decode_latency", latency)
        latency = with_prefill_core_load(latency, requests)
    sent = {}
    if front_end_s:
        sent = {r.request_id: r.arrival_s for r in requests}
        requests = [replace(r, arrival_s=r.arrival_s + front_end_s) for r in requests]
    sim = build_sim(mode, latency, **kwargs)
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


def replay_pairs(live: Sequence[RequestRecord], sim: Sequence[RequestRecord]
                 ) -> list[tuple[RequestRecord, RequestRecord]]:
    """Each completed live request with its replay (:func:`simulate_like_live` of
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


def paired_error(live: Sequence[RequestRecord], sim: Sequence[RequestRecord], metric: str = "ttft") -> float:
    """Median over requests of (simulated − live) / live of ``metric`` (``"ttft"`` or ``"tpot"``),
    request by request (:func:`replay_pairs`). Unlike the error of the medians it does not jump when
    the median falls between two groups of prompt lengths; NaN without a pair that has the metric."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be ttft or tpot, got {metric!r}")
    rel = [getattr(s, f"{metric}_s") / getattr(r, f"{metric}_s") - 1 for r, s in replay_pairs(live, sim)
           if getattr(r, f"{metric}_s") and getattr(s, f"{metric}_s") is not None]
    return float(np.median(rel)) if rel else float("nan")


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


def rate_for_load(requests: Sequence[Request], latency: FittedLatency, load: float) -> float:
    """Arrival rate (req/s) at which ``requests``' prompts offer ``load`` to one server with
    ``latency``: ``load`` ÷ their mean isolated prefill time (s). Rates set this way put a fast and
    a slow machine, or a CPU and a GPU, at the same point of their queueing curve
    (:func:`offered_prefill_load` of the run comes out near ``load``). Raises ValueError for no
    requests or a load outside (0, 1)."""
    if not requests:
        raise ValueError("rate_for_load needs at least one request")
    if not 0 < load < 1:
        raise ValueError(f"load must be in (0, 1): at 1 or more the queue grows without bound, got {load}")
    mean_s = float(np.mean([latency.prefill_time_s([r.prompt_tokens]) for r in requests]))
    return load / mean_s


def _streamed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The completed records with two or more token times (at least one gap); ValueError if none."""
    recs = [r for r in records if r.ok and r.token_times_s is not None and len(r.token_times_s) >= 2]
    if not recs:
        raise ValueError("no record with two or more token times")
    return recs


@dataclass(frozen=True, slots=True)
class _StepGap:
    """One token gap of a live run, read as decode steps of the server (:func:`_run_step_gaps`)."""

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


def _run_step_gaps(records: Sequence[RequestRecord]) -> list[_StepGap]:
    """Every token gap of a live run as decode steps of the server (:class:`_StepGap`). B is the
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
    prompt = np.array([server_prompt_tokens(r) for r in recs])
    rows = []
    for i, (t, running, known) in enumerate(chunks):
        for gap, mid, held in zip(np.diff(t), 0.5 * (t[1:] + t[:-1]), np.diff(running), strict=True):
            active = np.flatnonzero((first <= mid) & (mid <= last))
            ctx = sum(int(prompt[j] + chunks[j][1][max(int(np.searchsorted(times[j], mid)), 1) - 1] - 1)
                      for j in active)
            quiet = not np.any((arrival <= mid) & (mid < first))
            rows.append(_StepGap(len(active), ctx, float(gap), quiet, float(mid), int(held) if known else None, i))
    return rows


def _per_step(rows: Sequence[_StepGap]) -> list[_StepGap]:
    """``rows`` one per engine step: a gap known to span n steps becomes n rows of gap ÷ n (the
    steps' mean), a gap of unknown span stays one row (one step, as ``vllm bench serve`` reads it)."""
    out = []
    for g in rows:
        n = g.steps or 1
        out.extend([replace(g, gap_s=g.gap_s / n, steps=1)] * n)
    return out


def decode_steps_vs_model(records: Sequence[RequestRecord], latency: FittedLatency,
                          batch_edges: Sequence[int] = (1, 4, 8, 12, 16, 1 << 30)) -> list[dict[str, Any]]:
    """Live token gaps of a run against the fitted decode step, by batch size.

    Each gap is one decode step, or n where its chunk held n tokens (:func:`_run_step_gaps`,
    :func:`_per_step`: batch, context, quiet); the fitted step is
    ``latency.decode_time_s`` of that batch and context. Returns one row per batch range [lo, hi):
    gaps, quiet gaps, and the median of live / fitted over each (1.0 = the fit holds under the
    workload; the probe's own points are near 1 by construction).
    """
    rows = [(g.batch, g.gap_s / latency.step_time_s(0, 0.0, g.batch, g.context), g.quiet)
            for g in _per_step(_run_step_gaps(records))]
    batch = np.array([b for b, _, _ in rows])
    ratio = np.array([x for _, x, _ in rows])
    quiet = np.array([q for _, _, q in rows])
    out = []
    for lo, hi in zip(batch_edges[:-1], batch_edges[1:], strict=True):
        sel = (batch >= lo) & (batch < hi)
        if not sel.any():
            continue
        q = sel & quiet
        out.append({"batch": f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi - 1}", "gaps": int(sel.sum()),
                    "quiet gaps": int(q.sum()), "live / fitted, all": float(np.median(ratio[sel])),
                    "live / fitted, quiet": float(np.median(ratio[q])) if q.any() else float("nan")})
    return out


def run_decode_points(records: Sequence[RequestRecord], *, ctx_bucket_tokens: int = 256,
                      min_gaps: int = 5) -> list[StepPoint]:
    """Decode timing points observed in a live run: its quiet steps (:func:`_run_step_gaps`),
    grouped by batch and by mean context per stream in buckets of ``ctx_bucket_tokens``, each
    group (of at least ``min_gaps`` gaps) one point of the median gap (s) at the group's mean
    batch context. Median, not mean: a client that reads several tokens in one burst (its process
    was descheduled) sees one long gap and several of 0 s around the true step. The points feed
    :func:`fit_row` like the probe's (``kind`` ``"decode"``): the observe-then-predict calibration."""
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for g in _per_step(_run_step_gaps(records)):
        if g.quiet and g.batch > 0:
            groups.setdefault((g.batch, int(g.context / g.batch // ctx_bucket_tokens)), []).append((g.context, g.gap_s))
    points = []
    for (b, _), rows in sorted(groups.items()):
        gaps = [g for _, g in rows]
        t = float(np.median(gaps))
        if len(rows) >= min_gaps and t > 0:
            points.append(StepPoint.decode(b, float(np.mean([c for c, _ in rows])), t, samples=len(rows)))
    return points


def fit_decode_joint(run_points: Sequence[StepPoint], probe_points: Sequence[StepPoint]
                     ) -> tuple[tuple[float, float, float], dict[str, float]]:
    """A decode row whose slopes come from the probe's and the run's points together and whose
    level comes from the run: t = a_run + b·Σctx + c·B on the run's points, t = a_probe + b·Σctx
    + c·B on the probe's (shared b, c; one intercept each; NNLS on relative residuals).

    The probe spans batches and contexts a slow run never reaches (a run at low load has batches of
    1–3, which cannot pin the per-sequence term), and the run sets what the workload adds to every
    step. Returns (a_run, b, c) in s, s/context token, s/sequence, and the fit quality on the
    run's points, with ``probe_level_s`` (a_probe) and ``probe_points``. Raises ValueError with
    fewer than two run points or three probe points, or points that cannot separate b and c."""
    run = [p for p in _validate_points(run_points) if p.decode_batch > 0]
    probe = [p for p in _validate_points(probe_points) if p.decode_batch > 0]
    if len(run) < 2 or len(probe) < 3:
        raise ValueError(f"need >= 2 run decode points and >= 3 probe decode points, got {len(run)} and {len(probe)}")
    a = np.array([[1.0, 0.0, p.decode_ctx_tokens, p.decode_batch] for p in run] +
                 [[0.0, 1.0, p.decode_ctx_tokens, p.decode_batch] for p in probe])
    if np.linalg.matrix_rank(a / np.abs(a).max(axis=0)) < 4:
        raise ValueError("decode points cannot separate the per-context and per-sequence terms: they need several "
                         "batch sizes and contexts that vary independently")
    y = np.array([p.time_s for p in run + probe])
    coef = _nnls(a, y)
    quality = _quality(a[: len(run)] @ coef, y[: len(run)])
    return (float(coef[0]), float(coef[2]), float(coef[3])), {**quality, "probe_level_s": float(coef[1]),
                                                              "probe_points": len(probe)}


def refit_decode_on_run(latency: FittedLatency, records: Sequence[RequestRecord], *,
                        probe_points: Sequence[StepPoint] | None = None, **kwargs: Any) -> FittedLatency:
    """``latency`` with its decode row refitted on a live run's own quiet steps
    (:func:`run_decode_points`, ``kwargs``): alone (three coefficients from the run), or with the
    probe's decode points (``probe_points``, :func:`fit_decode_joint`: the slopes from both, the
    level from the run). Prefill and ``meta`` (link, contention, admission) are kept; the new fit's
    quality is in ``meta["fit"]["decode"]`` and the probe's in ``meta["fit"]["decode_probe"]``.
    Raises ValueError when the points cannot separate the decode coefficients."""
    points = run_decode_points(records, **kwargs)
    if probe_points is None:
        decode, quality = fit_row(points, "decode")
        source = "live run, quiet steps"
    else:
        decode, quality = fit_decode_joint(points, probe_points)
        source = "live run's quiet steps (level) with the probe's points (slopes)"
    return _with_decode_row(latency, decode, {**quality, "source": source})


def _with_decode_row(latency: FittedLatency, decode: Sequence[float], fit_info: Mapping[str, Any]) -> FittedLatency:
    """``latency`` with the decode row ``decode``: ``fit_info`` becomes ``meta["fit"]["decode"]``,
    the row's previous fit quality ``meta["fit"]["decode_probe"]``; prefill, tp, pp and the rest
    of ``meta`` are kept."""
    fit = dict(latency.meta.get("fit", {}))
    fit["decode_probe"], fit["decode"] = fit.get("decode"), dict(fit_info)
    return FittedLatency(latency.prefill, tuple(decode), tp=latency.tp, pp=latency.pp,
                         meta={**latency.meta, "fit": fit})


def scale_decode_on_run(latency: FittedLatency, records: Sequence[RequestRecord], **kwargs: Any) -> FittedLatency:
    """``latency`` with its decode row scaled to a live run's level: the median, over the run's
    quiet-step points (:func:`run_decode_points`, ``kwargs``), of the observed step ÷ the fitted
    one at the point's batch and context. The probe keeps the shape (how a step grows with
    batch and context, over batches a slow run never reaches); the run sets one factor for all
    of it, as a co-runner that takes a share of the core stretches every step alike.
    (:func:`refit_decode_on_run` with ``probe_points`` takes the run's level as an added
    constant instead, which weighs most on the small batches of a slow run.) Prefill and
    ``meta`` are kept; ``meta["fit"]["decode"]`` holds the scale, its points and the fit's
    quality on them, ``meta["fit"]["decode_probe"]`` the probe's. Raises ValueError without a
    point."""
    points = run_decode_points(records, **kwargs)
    if not points:
        raise ValueError("no quiet decode step group in the run to scale the decode row on")
    fitted = np.array([latency.step_time_s(0, 0.0, p.decode_batch, p.decode_ctx_tokens) for p in points])
    observed = np.array([p.time_s for p in points])
    scale = float(np.median(observed / fitted))
    return _with_decode_row(latency, [scale * c for c in latency.decode], {
        **_quality(scale * fitted, observed), "scale": scale,
        "source": "the probe's decode row, scaled to the live run's quiet steps"})


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


def match_decode_to_tpot_on_run(latency: FittedLatency, records: Sequence[RequestRecord], mode: str, *,
                                iterations: int = 12, lowest: float = 0.5, highest: float = 2.0,
                                **sim_kwargs: Any) -> FittedLatency:
    """``latency`` with its decode row scaled by the one factor in [``lowest``, ``highest``] that
    gives the replay of its own run (:func:`simulate_like_live`, ``mode``, ``sim_kwargs``) the
    run's median TPOT (bisection, ``iterations`` halvings; the replay's TPOT grows with the factor).

    :func:`scale_decode_on_run` matches the median *quiet* step; TPOT is a mean over all of a
    request's gaps, so it also carries the long ones a quiet median leaves out (stalls while a
    request is admitted, chunks the API server sent late). For lab 05's prefill/decode pair those
    make the replay's median TPOT short of the run's, by 3–5 % on average at every rate of nine
    saved runs, and matching it at one rate carried over to the others (``docs/LIVE_LABS.md``). Prefill and the rest
    of ``meta`` are kept; ``meta["fit"]["decode_tpot_match"]`` records the factor and the medians.
    Where the replay is already too slow at ``lowest`` or too fast at ``highest``, the factor is
    that bound."""
    reqs = requests_from_records(records)
    live = float(np.median(tpot_s(records)))

    def scaled(f: float, meta: Mapping[str, Any] = latency.meta) -> FittedLatency:
        return FittedLatency(latency.prefill, tuple(f * c for c in latency.decode), tp=latency.tp, pp=latency.pp,
                             meta=dict(meta))

    def replay_tpot(f: float) -> float:
        return float(np.median(tpot_s(simulate_like_live(reqs, mode, scaled(f), **sim_kwargs))))

    before = replay_tpot(1.0)
    factor = _bisect_to_match(lambda f: replay_tpot(f) < live, lowest, highest, iterations)
    return scaled(factor, {**latency.meta, "fit": {**latency.meta.get("fit", {}), "decode_tpot_match": {
        "factor": factor, "live_tpot_p50_s": live, "replay_tpot_p50_before_s": before,
        "source": "live run, the replay's median TPOT matched to the run's"}}})


def step_ratio_windows(records: Sequence[RequestRecord], latency: FittedLatency, *, window_s: float = 5.0,
                       min_gaps: int = 20) -> list[dict[str, float]]:
    """The live decode step against the fitted one over time: the run's quiet gaps
    (:func:`_run_step_gaps`, by their midpoint) in windows of ``window_s`` seconds from the first
    send, each window with at least ``min_gaps`` quiet gaps one row: ``start_s``, ``gaps``, the
    median live ÷ fitted step (``ratio``) and the mean batch. The spread of ``ratio`` within one
    run is the machine's own repeatability, seconds apart, at the same batch and context: no fit
    predicts a run better than the run repeats itself."""
    t0 = min(r.arrival_s for r in records)
    rows = [(g.mid_s, g.batch, g.gap_s / latency.step_time_s(0, 0.0, g.batch, g.context))
            for g in _per_step(_run_step_gaps(records)) if g.quiet]
    out = []
    for k in range(int(max((m - t0 for m, _, _ in rows), default=0.0) // window_s) + 1):
        sel = [(b, x) for m, b, x in rows if k * window_s <= m - t0 < (k + 1) * window_s]
        if len(sel) >= min_gaps:
            out.append({"start_s": k * window_s, "gaps": len(sel), "ratio": float(np.median([x for _, x in sel])),
                        "mean batch": float(np.mean([b for b, _ in sel]))})
    return out


def window_memory(windows: Sequence[Mapping[str, float]], window_s: float) -> dict[str, float]:
    """Does one window's decode speed tell the next? Over the consecutive pairs (starts one
    ``window_s`` apart) of :func:`step_ratio_windows` rows: ``pairs``; ``from previous``, the mean
    |previous ÷ current − 1| (what a probe just before a block would get); ``from median``, the mean
    |median of all windows ÷ current − 1| over the same windows (what one fit for the run gets); and
    ``lag-1 r``, their Pearson correlation (NaN under 3 pairs). Re-probing between blocks tracks the
    machine only where ``from previous`` is well below ``from median``. Raises ValueError without a
    consecutive pair."""
    ratio = {round(w["start_s"] / window_s): float(w["ratio"]) for w in windows}
    pairs = [(ratio[k - 1], x) for k, x in sorted(ratio.items()) if k - 1 in ratio]
    if not pairs:
        raise ValueError(f"no two consecutive {window_s:g}-s windows to compare")
    prev, cur = np.array(pairs).T
    mid = float(np.median(list(ratio.values())))
    return {"pairs": len(pairs), "from previous": float(np.mean(np.abs(prev / cur - 1))),
            "from median": float(np.mean(np.abs(mid / cur - 1))),
            "lag-1 r": float(np.corrcoef(prev, cur)[0, 1]) if len(pairs) >= 3 and np.std(prev) * np.std(cur) > 0
            else float("nan")}


def decode_gap_tail(records: Sequence[RequestRecord], latency: FittedLatency, *, long_factor: float = 2.0
                    ) -> dict[str, float]:
    """Where a run's decode time goes beyond the fitted step: every token gap of the run
    (:func:`_run_step_gaps`) against the fitted step of its batch and context.

    Returns ``gaps``; ``median ratio`` (live ÷ fitted per engine step, what the quiet-step checks
    read); ``time ratio``, the live gaps' total over the fitted time of every step the requests
    took (what TPOT, a mean over output tokens − 1 steps, sees: a gap closed by a chunk of n tokens
    counts n fitted steps, and a request whose chunk sizes are unknown has its fitted gaps scaled
    by its steps ÷ its gaps); ``long share``, the share of gaps longer than ``long_factor`` times
    the fitted steps they span, and ``long excess share``, their share of the gaps' time beyond
    the fit (Σ (live − fitted)); ``stall s per request``, the wall-clock seconds in which some
    stream's gap ran past its fitted steps by ``long_factor`` (the union over streams: one stall
    seen by ten streams counts once) per request; and ``shared chunk tokens``, the share of output
    tokens that arrived in a chunk holding more than one (the API server fell behind and merged
    them; from the server's per-chunk counts where it sent them, else output tokens minus timed
    chunks).

    The time ratio split by the gaps' kind: ``quiet time ratio`` over the quiet gaps (no request
    waiting for its first token: pure decode, what the fit describes), ``waiting time ratio`` over
    the others, and ``waiting share``, their share of the gaps. On a colocated server a waiting
    gap may carry another request's prefill chunk, which a decode-only fit does not charge; on a
    pair's decode role it may carry a hand-off. NaN where the run has no gap of that kind."""
    recs = _streamed(records)
    rows = _run_step_gaps(recs)
    gaps_of = np.bincount([g.stream for g in rows], minlength=len(recs))
    hidden = [max(r.output_tokens - 1, n) / max(n, 1) for r, n in zip(recs, gaps_of, strict=True)]
    steps_per_gap = np.array([g.steps if g.steps is not None else hidden[g.stream] for g in rows])  # spread
    gap = np.array([g.gap_s for g in rows])
    quiet = np.array([g.quiet for g in rows], dtype=bool)
    steps = np.array([g.steps or 1 for g in rows])
    starts = np.array([g.mid_s - g.gap_s / 2 for g in rows])
    fit = np.array([latency.step_time_s(0, 0.0, g.batch, g.context) for g in rows])
    long = gap > long_factor * fit * steps
    excess = float(np.sum(gap - fit * steps))
    stall, end = 0.0, -np.inf
    for a, b in sorted(zip(starts[long] + (fit * steps)[long], starts[long] + gap[long], strict=True)):
        stall += max(0.0, b - max(a, end))
        end = max(end, b)
    out_tokens = sum(r.output_tokens for r in recs)
    merged = sum(int(np.sum(np.maximum(np.asarray(r.chunk_tokens) - 1, 0))) if _chunks(r)[2]
                 else max(0, r.output_tokens - len(r.token_times_s)) for r in recs)
    step_ratio = np.repeat(gap / steps / fit, steps)   # one per engine step, as :func:`_per_step` counts them

    def time_ratio(part: np.ndarray) -> float:
        return float(gap[part].sum() / np.sum((fit * steps_per_gap)[part])) if part.any() else float("nan")

    return {"gaps": len(gap), "median ratio": float(np.median(step_ratio)),
            "time ratio": time_ratio(np.ones_like(quiet)), "quiet time ratio": time_ratio(quiet),
            "waiting time ratio": time_ratio(~quiet), "waiting share": float(np.mean(~quiet)),
            "long share": float(long.mean()),
            "long excess share": float(np.sum((gap - fit * steps)[long]) / excess) if excess > 0 else float("nan"),
            "stall s per request": float(stall / len(recs)),
            "shared chunk tokens": merged / out_tokens}


def refit_decode_contention_on_run(latency: FittedLatency, records: Sequence[RequestRecord], *,
                                   min_gaps: int = 50) -> FittedLatency:
    """``latency`` with the decode row of its ``cpu_contention`` measured on a live run of a
    prefill/decode pair: the median live ÷ fitted step of the gaps while some request waits for
    its first token (a prefill or a hand-off under way) over that of the quiet gaps
    (:func:`_run_step_gaps`), minus 1, never below 0. The contention probe times decode while the
    prefill role runs prompts back to back, a busier prefill core than a workload's; the run
    measures what the decode role actually loses while prefill works. Stored in
    ``meta["cpu_contention"]["decode"]`` (the probe's value in ``meta["fit"]["contention_probe"]``);
    raises ValueError with fewer than ``min_gaps`` gaps of either kind."""
    rows = [(g.gap_s / latency.step_time_s(0, 0.0, g.batch, g.context), g.quiet)
            for g in _per_step(_run_step_gaps(records))]
    quiet = [x for x, q in rows if q]
    busy = [x for x, q in rows if not q]
    if min(len(quiet), len(busy)) < min_gaps:
        raise ValueError(f"need >= {min_gaps} quiet and busy gaps, the run has {len(quiet)} and {len(busy)}")
    c_d = max(0.0, float(np.median(busy) / np.median(quiet)) - 1.0)
    meta = dict(latency.meta)
    probe = dict(meta.get("cpu_contention") or {"prefill": 0.0, "decode": 0.0})
    meta["fit"] = {**meta.get("fit", {}), "contention_probe": probe.get("decode")}
    meta["cpu_contention"] = {**probe, "decode": c_d}
    return FittedLatency(latency.prefill, latency.decode, tp=latency.tp, pp=latency.pp, meta=meta)


def quiet_step_ratio(records: Sequence[RequestRecord], latency: FittedLatency) -> float:
    """One number for "does the decode model hold on this run": the median live ÷ fitted step time
    of each batch range's quiet steps (:func:`decode_steps_vs_model`), averaged with the ranges'
    numbers of quiet gaps as weights. 1.0 = the fit holds; NaN when the run has no quiet step."""
    rows = [r for r in decode_steps_vs_model(records, latency) if r["quiet gaps"] > 0]
    if not rows:
        return float("nan")
    return float(np.average([r["live / fitted, quiet"] for r in rows], weights=[r["quiet gaps"] for r in rows]))


def quiet_ttft_ratio(latency: FittedLatency, records: Sequence[RequestRecord], mode: str, **sim_kwargs: Any) -> float:
    """The prefill side's counterpart of :func:`quiet_step_ratio`: the median, over the run's
    requests that met no prefill queue (:func:`prefill_quiet_requests`), of live TTFT ÷ the TTFT
    the run's replay gives them (:func:`simulate_like_live`, ``mode`` and ``sim_kwargs``).
    1.0 = the fit holds for an unqueued request; NaN when the run has none."""
    try:
        pairs = _quiet_replay_pairs(latency, records, mode, 1, **sim_kwargs)
    except ValueError:   # no request met an empty queue
        return float("nan")
    ratios = [r.ttft_s / sim.ttft_s for r, sim in pairs if sim.ttft_s and sim.ttft_s > 0]
    return float(np.median(ratios)) if ratios else float("nan")


def prefill_quiet_requests(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The completed requests of a run that met no prefill queue: no other request was waiting for
    its first token at any moment between their arrival and their own first token."""
    ok = [r for r in records if r.ok and r.first_token_s is not None]
    return [r for r in ok if not any(o is not r and o.arrival_s < r.first_token_s and o.first_token_s > r.arrival_s
                                     for o in ok)]


def _quiet_replay_pairs(latency: FittedLatency, records: Sequence[RequestRecord], mode: str, min_requests: int,
                        **sim_kwargs: Any) -> list[tuple[RequestRecord, RequestRecord]]:
    """(live, replayed) pairs of a run's prefill-quiet requests (:func:`prefill_quiet_requests`),
    the whole run replayed with :func:`simulate_like_live` (``mode``, ``sim_kwargs``). Raises
    ValueError with fewer than ``min_requests`` quiet requests."""
    live = sorted((r for r in records if r.ok and r.first_token_s is not None), key=lambda r: r.arrival_s)
    quiet = {id(r) for r in prefill_quiet_requests(live)}
    if len(quiet) < min_requests:
        raise ValueError(f"need >= {min_requests} requests that met no prefill queue, the run has {len(quiet)}")
    sims = simulate_like_live(requests_from_records(live), mode, latency, **sim_kwargs)
    return [(r, sim) for r, sim in replay_pairs(live, sims) if id(r) in quiet]


def refit_front_end_on_run(latency: FittedLatency, records: Sequence[RequestRecord], mode: str, *,
                           min_requests: int = 3, **sim_kwargs: Any) -> FittedLatency:
    """``latency`` with a front-end delay fitted on a live run: the median, over the run's
    prefill-quiet requests (:func:`prefill_quiet_requests`), of live TTFT − the TTFT the run's
    replay (:func:`simulate_like_live`, ``mode`` and ``sim_kwargs``) gives them, stored as
    ``meta["front_end_s"]`` (never below 0). The prefill row stays the probe's: what a loaded
    server adds before a quiet request's first token is a fixed delay outside the engine (its
    front end serves the other requests' streams meanwhile), not slower prefill compute, so it
    delays that request alone and no other request's steps. ``meta["fit"]["front_end"]`` records
    the delay and how many requests set it. Raises ValueError with fewer than ``min_requests``
    quiet requests."""
    pairs = _quiet_replay_pairs(latency, records, mode, min_requests, front_end_s=0.0, **sim_kwargs)
    gaps = [r.ttft_s - sim.ttft_s for r, sim in pairs]
    if len(gaps) < min_requests:
        raise ValueError(f"need >= {min_requests} replayed quiet requests, got {len(gaps)}")
    delay = max(0.0, float(np.median(gaps)))
    meta = dict(latency.meta)
    meta["fit"] = {**meta.get("fit", {}), "front_end": {
        "delay_s": delay, "requests": len(gaps),
        "source": "live run, TTFT − replayed TTFT of requests that met no prefill queue"}}
    meta["front_end_s"] = delay
    return FittedLatency(latency.prefill, latency.decode, tp=latency.tp, pp=latency.pp, meta=meta)


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


def with_prefill_core_load(latency: FittedLatency, requests: Sequence[Request]) -> FittedLatency:
    """``latency`` with its prefill row stretched by ``1 / (1 − u)``: ``u`` = the share of the
    prefill role's core its co-runners (API servers, proxy, client) take while requests are in
    flight, ``latency.meta["prefill_core_base_cores"]`` + the requests' rate
    (:func:`arrival_rate_rps`) × ``latency.meta["prefill_core_cpu_s_per_request"]``
    (:func:`refit_prefill_core_load_on_run`). A prefill of ``T`` seconds of compute that shares the
    core with work arriving at ``u`` cores gets the rest of it, so it ends after ``T / (1 − u)``.
    Unchanged without those entries; ValueError when ``u`` >= 1 (the co-runners alone would need
    the whole core)."""
    base = float(latency.meta.get("prefill_core_base_cores", 0.0))
    cpu_s = float(latency.meta.get("prefill_core_cpu_s_per_request", 0.0))
    if base <= 0 and cpu_s <= 0:
        return latency
    u = base + arrival_rate_rps(requests) * cpu_s
    if u >= 1:
        raise ValueError(f"the prefill core's co-runners would need {u:.2f} cores at this rate "
                         f"({base:.2f} cores + {cpu_s * 1e3:.1f} ms of CPU per request): the model needs u < 1")
    meta = {**latency.meta, "prefill_core_share_taken": u}
    return FittedLatency(tuple(c / (1 - u) for c in latency.prefill), latency.decode, tp=latency.tp, pp=latency.pp,
                         meta=meta)


def split_co_runner_cpu(samples: Sequence[Sequence[Sequence[float]]], records: Sequence[RequestRecord], *,
                        window_s: float = 1.0) -> dict[str, float]:
    """Split the CPU the co-runners of a live run used (``samples``: one list per block of
    ``(perf_counter time, CPU seconds so far)``, :class:`pdlab.serve.cpucost.CPUSampler`) into a
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
    coef = _nnls(a, y, relative=False)
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


def refit_prefill_core_load_on_run(latency: FittedLatency, samples: Sequence[Sequence[Sequence[float]]],
                                   records: Sequence[RequestRecord], *, per_request_only: bool = False
                                   ) -> FittedLatency:
    """``latency`` (a prefill/decode pair's) with the load its prefill role's co-runners (API
    servers, proxy, benchmark client) put on that core during a live run, split by
    :func:`split_co_runner_cpu` (``samples`` of their CPU seconds, ``records`` of the run) into
    ``meta["prefill_core_base_cores"]`` (cores while requests are in flight) and
    ``meta["prefill_core_cpu_s_per_request"]``. :func:`simulate_like_live` then charges them at the
    replayed rate (:func:`with_prefill_core_load`), so a fit on one rate carries the front ends'
    load to another. With ``per_request_only`` the base is left out (where the prefill role's
    contention, ``cpu_contention["prefill"]``, already charges the front ends' work per decode step).
    ``meta["fit"]["prefill_core_load"]`` records the split."""
    split = split_co_runner_cpu(samples, records)
    meta = {**latency.meta, "prefill_core_cpu_s_per_request": split["cpu_s_per_request"],
            "prefill_core_base_cores": 0.0 if per_request_only else split["base_cores"]}
    meta["fit"] = {**meta.get("fit", {}), "prefill_core_load": {
        **split, "per_request_only": per_request_only,
        "source": "live run, CPU samples of the prefill core's co-runners against the requests in flight"}}
    return FittedLatency(latency.prefill, latency.decode, tp=latency.tp, pp=latency.pp, meta=meta)


def decode_busy_while_waiting(r: RequestRecord, records: Sequence[RequestRecord]) -> bool:
    """Whether another request of ``records`` streamed tokens (first token given, not finished)
    at some moment while ``r`` waited for its first token."""
    return any(o is not r and o.ok and o.first_token_s is not None and o.first_token_s < r.first_token_s
               and o.finish_s > r.arrival_s for o in records)


def streams_on_arrival(records: Sequence[RequestRecord]) -> dict[Any, int]:
    """Per request id: how many other requests of ``records`` were streaming (first token given,
    not finished) when it arrived. A request's front end and its prefill share the prefill core
    with the streaming of these (on the course's CPU pair, the decode API server, proxy and client).

    >>> from pdlab.metrics import RequestRecord
    >>> recs = [RequestRecord(0, 0.0, 8, 4, 0.1, 0.5), RequestRecord(1, 0.2, 8, 4, 0.3, 0.6),
    ...         RequestRecord(2, 0.4, 8, 4, 0.45, 0.7)]
    >>> streams_on_arrival(recs)
    {0: 0, 1: 1, 2: 2}
    """
    return {r.request_id: sum(1 for o in records if o is not r and o.first_token_s is not None
                              and o.first_token_s < r.arrival_s and (o.finish_s is None or o.finish_s > r.arrival_s))
            for r in records}


def ttft_sides(live: Sequence[RequestRecord], sims: Sequence[RequestRecord]) -> list[dict[str, float]]:
    """A pair's TTFT, live against its replay, split per request into two sides (seconds):

    - ``prefill_side_s``: the live prefill leg (``extra["prefill_leg_s"]``, the course proxy's
      ``X-Prefill-Seconds``: its POST to the prefill server until the answer) − the replay's
      arrival → start of the KV pull (``extra["kv_transfer_start_s"]``);
    - ``handoff_side_s``: live TTFT − that leg, minus the replay's KV pull → first token;

    with ``request_id`` and ``streams`` (:func:`streams_on_arrival`, live). One row per completed request that has
    both; an empty list when no live record carries the prefill leg (runs before 2026-12-05, or
    another front door than the course proxy). ``sims``: :func:`simulate_like_live` of ``live``."""
    met = streams_on_arrival(live)
    rows = []
    for r, s in replay_pairs(live, sims):
        leg, pull = r.extra.get("prefill_leg_s"), s.extra.get("kv_transfer_start_s")
        if leg is None or pull is None:
            continue
        sim_prefill = pull - s.arrival_s
        rows.append({"request_id": r.request_id, "streams": met[r.request_id], "prefill_side_s": leg - sim_prefill,
                     "handoff_side_s": (r.ttft_s - leg) - (s.ttft_s - sim_prefill)})
    return rows


def refit_handoff_on_run(latency: FittedLatency, records: Sequence[RequestRecord], *, min_requests: int = 3,
                         cap_at_probe: bool = True, prior_requests: float = 0.0, **sim_kwargs: Any) -> FittedLatency:
    """``latency`` (a prefill/decode pair's) with its hand-off level and its prefill role's
    contention measured on a live run. The run is replayed (:func:`simulate_like_live`) with no
    prefill contention; of its prefill-quiet requests (:func:`prefill_quiet_requests`):

    - those during whose wait no other request streamed (the decode role idle) set the
      hand-off's fixed latency: the probe's ``kv_link.latency_s`` plus the median of live −
      replayed TTFT (never below 0). The hand-off probe fits a few prompt lengths through the
      proxy; these requests see the same path under the workload;
    - those during whose wait another request streamed set ``cpu_contention["prefill"]``: the
      median of (live − replayed TTFT − that shift) ÷ the request's fitted prefill time (never
      below 0). The contention probe measures it with many streams decoding at once; the run,
      with the workload's own. With ``cap_at_probe`` the run's value is at most the probe's: the
      probe's streams are the heaviest decode load the fit knows, so a larger slowdown on the run
      is not the decode role's (at a high rate, the front ends' growing share of the prefill core)
      and, charged per decoding stream, would not transfer to other rates.

    A part with fewer than ``min_requests`` requests keeps the probe's value. With
    ``prior_requests`` n0 > 0 each part is shrunk toward the probe's value by the n requests that
    set it, (n·run + n0·probe) ÷ (n + n0): a rate with few such requests (a high rate has few
    prefill-quiet ones) leans on the probe; with ``math.inf`` both parts are the probe's, and the
    run's values are only recorded. ``meta["fit"]["handoff"]`` records both values, the probe's,
    the run's shift and contention before the cap and the shrinkage (None when too few requests
    set them), and how many requests set each.
    """
    if not prior_requests >= 0:   # NaN too
        raise ValueError(f"prior_requests must be >= 0, got {prior_requests}")

    def toward_probe(run: float, probe: float, n: int) -> float:
        """The run's value from ``n`` requests, shrunk toward the probe's by ``prior_requests``."""
        if math.isinf(prior_requests):
            return probe
        return (n * run + prior_requests * probe) / (n + prior_requests)

    cal = Calibration.from_latency(latency)
    link = cal.kv_link or LinkFit(0.0, 0.0)
    probe_cont = dict(latency.meta.get("cpu_contention") or {"prefill": 0.0, "decode": 0.0})
    no_cp = with_prefill_contention(latency, 0.0)
    pairs = _quiet_replay_pairs(no_cp, records, "disaggregated", 1, front_end_s=0.0, **sim_kwargs)
    ok = [r for r in records if r.ok and r.first_token_s is not None]
    idle = [(r, s) for r, s in pairs if not decode_busy_while_waiting(r, ok)]
    busy = [(r, s) for r, s in pairs if decode_busy_while_waiting(r, ok)]
    run_shift = float(np.median([r.ttft_s - s.ttft_s for r, s in idle])) if len(idle) >= min_requests else None
    shift = run_shift or 0.0
    c_p = probe_c_p = probe_cont.get("prefill", 0.0)
    run_c_p = None
    if len(busy) >= min_requests:
        loaded = with_prefill_core_load(latency, requests_from_records(records))   # the prefill the replay ran
        run_c_p = max(0.0, float(np.median([(r.ttft_s - s.ttft_s - shift) / loaded.prefill_time_s([server_prompt_tokens(r)])
                                            for r, s in busy])))
        c_p = toward_probe(min(run_c_p, probe_c_p) if cap_at_probe else run_c_p, probe_c_p, len(busy))
    if run_shift is not None:
        shift = toward_probe(run_shift, 0.0, len(idle))   # the probe's own shift is 0
    meta = dict(latency.meta)
    meta["kv_link"] = {**link.to_dict(), "latency_s": max(0.0, link.latency_s + shift)}
    meta["cpu_contention"] = {**probe_cont, "prefill": c_p}
    meta["fit"] = {**meta.get("fit", {}), "handoff": {
        "latency_s": meta["kv_link"]["latency_s"], "latency_probe_s": link.latency_s, "idle_requests": len(idle),
        "prefill_contention": c_p, "prefill_contention_probe": probe_c_p, "prefill_contention_run": run_c_p,
        "latency_shift_run_s": run_shift, "prior_requests": prior_requests, "busy_requests": len(busy),
        "source": "live run, TTFT − replayed TTFT of requests that met no prefill queue"}}
    return FittedLatency(latency.prefill, latency.decode, tp=latency.tp, pp=latency.pp, meta=meta)


def fit_on_run(latency: FittedLatency, records: Sequence[RequestRecord], mode: str, *,
               prefill_core_samples: Sequence[Sequence[Sequence[float]]] | None = None,
               prior_requests: float = math.inf, match_tpot: bool = True, **sim_kwargs: Any) -> FittedLatency:
    """Lab 05's observe-then-predict calibration: the probe's fit ``latency`` refitted on one live
    run (``records``) of the set-up ``mode``. The decode row is scaled to the run's quiet steps
    (:func:`scale_decode_on_run`); for a prefill/decode pair, the decode role's contention
    (:func:`refit_decode_contention_on_run`), the CPU the prefill core's co-runners spend per
    request when their CPU samples are given (``prefill_core_samples``, one list per block of
    :class:`~pdlab.serve.cpucost.CPUSampler` samples; :func:`refit_prefill_core_load_on_run`), and
    the hand-off's level and the prefill role's contention measured on the run, not capped at the
    probe's (:func:`refit_handoff_on_run`), each shrunk toward the probe's by the requests that set
    it with the probe weighing ``prior_requests`` requests: 0, the run's values as they are; by
    default ``math.inf``, the probe's values, the run's only recorded in ``meta["fit"]["handoff"]``
    (over lab 05's ci runs the run's values, fitted at one rate, did not transfer to the others:
    ``benchmarks/prefill_contention_transfer.py``), and, unless ``match_tpot`` is False, the decode
    row's level matched to the run's median TPOT (:func:`match_decode_to_tpot_on_run`); then the
    front-end delay (:func:`refit_front_end_on_run`).
    ``sim_kwargs`` go to every replay. The prefill row stays the probe's. Raises ValueError when
    the run has too few quiet steps or prefill-quiet requests to fit on."""
    fit = scale_decode_on_run(latency, records)
    if mode == "disaggregated":
        fit = refit_decode_contention_on_run(fit, records)
        if prefill_core_samples is not None:
            fit = refit_prefill_core_load_on_run(fit, prefill_core_samples, records, per_request_only=True)
        fit = refit_handoff_on_run(fit, records, cap_at_probe=False, prior_requests=prior_requests, **sim_kwargs)
        if match_tpot:
            fit = match_decode_to_tpot_on_run(fit, records, mode, **sim_kwargs)
    return refit_front_end_on_run(fit, records, mode, **sim_kwargs)


def match_prefill_contention_on_run(latency: FittedLatency, records: Sequence[RequestRecord], *,
                                    iterations: int = 12, max_contention: float = 8.0,
                                    **sim_kwargs: Any) -> FittedLatency:
    """``latency`` (a prefill/decode pair's run fit) with ``cpu_contention["prefill"]`` set so that
    the replay of its own run (:func:`simulate_like_live`, ``sim_kwargs``) has the run's median
    TTFT: bisection over [0, ``max_contention``] (the replay's median TTFT grows with it).

    :func:`refit_handoff_on_run` measures the contention on the few prefill-quiet requests that
    waited while others streamed, and the replay charges it to every prefill while decode works,
    queued ones included, so a noisy value is amplified by the queue. Matching the run's median
    makes the fit reproduce the run it was fitted on; held-out rates test whether it transfers.
    ``meta["fit"]["prefill_contention_match"]`` records the value before and after. Where the
    replay is already too slow at 0, the contention is 0; where it is still too fast at
    ``max_contention``, it is ``max_contention``."""
    reqs = requests_from_records(records)
    live = float(np.median(ttft_s(records)))
    before = float((latency.meta.get("cpu_contention") or {}).get("prefill", 0.0))

    def too_fast(c: float) -> bool:
        replay = simulate_like_live(reqs, "disaggregated", with_prefill_contention(latency, c), **sim_kwargs)
        return float(np.median(ttft_s(replay))) < live

    after = _bisect_to_match(too_fast, 0.0, max_contention, iterations)
    fitted = with_prefill_contention(latency, after)
    fitted.meta["fit"] = {**fitted.meta.get("fit", {}), "prefill_contention_match": {
        "before": before, "after": after, "live_ttft_p50_s": live,
        "source": "live run, the replay's median TTFT matched to the run's"}}
    return fitted


def with_prefill_contention(latency: FittedLatency, c_p: float) -> FittedLatency:
    """``latency`` with its prefill role's contention ``meta["cpu_contention"]["prefill"] = c_p``
    (the decode role's kept, 0 where unset)."""
    cont = {"decode": 0.0, **(latency.meta.get("cpu_contention") or {}), "prefill": float(c_p)}
    return FittedLatency(latency.prefill, latency.decode, tp=latency.tp, pp=latency.pp,
                         meta={**latency.meta, "cpu_contention": cont})


def refit_prefill_on_run(latency: FittedLatency, records: Sequence[RequestRecord], mode: str, *,
                         min_requests: int = 3, **sim_kwargs: Any) -> FittedLatency:
    """``latency`` with its prefill row scaled to a live run's own level: the median, over the run's
    prefill-quiet requests (:func:`prefill_quiet_requests`), of live TTFT ÷ the TTFT the run's
    replay (:func:`simulate_like_live`, ``mode`` and ``sim_kwargs``) gives them. The shape of the
    row (how prefill grows with the prompt) stays the probe's; the run sets its level, with
    whatever the workload adds to every prefill (front ends, proxy, the other role on the cores).
    ``meta["fit"]["prefill"]`` records the scale and how many requests set it, ``"prefill_probe"``
    the probe's fit. Raises ValueError with fewer than ``min_requests`` quiet requests."""
    pairs = _quiet_replay_pairs(latency, records, mode, min_requests, **sim_kwargs)
    ratios = [r.ttft_s / sim.ttft_s for r, sim in pairs if sim.ttft_s]
    if len(ratios) < min_requests:
        raise ValueError(f"need >= {min_requests} replayed quiet requests, got {len(ratios)}")
    scale = float(np.median(ratios))
    meta = dict(latency.meta)
    fit = dict(meta.get("fit", {}))
    fit["prefill_probe"] = fit.get("prefill")
    fit["prefill"] = {**(fit.get("prefill") or {}), "scale": scale, "requests": len(ratios),
                      "source": "live run, TTFT of requests that met no prefill queue"}
    meta["fit"] = fit
    return FittedLatency(tuple(scale * c for c in latency.prefill), latency.decode, meta=meta)
