"""Latency models: how long one iteration (one forward pass over a batch) takes on one instance.

Every model answers :meth:`LatencyModel.step_time_s` for a batch described by four numbers:

- ``prefill_tokens`` — prompt tokens computed in this iteration (Σ chunk lengths);
- ``prefill_sq_tokens`` — Σ c·(2p + c) over prefill chunks of c tokens after p earlier tokens of
  the same prompt. For an unchunked prompt of l tokens it is l², and the chunks of one prompt add
  up to l² (causal attention work does not depend on chunking);
- ``decode_batch`` — requests that generate one token in this iteration;
- ``decode_ctx_tokens`` — Σ of their context lengths (tokens whose KV is read).

The time is the full-depth latency of the iteration on the instance (all pipeline stages, TP
already applied); a pipeline-parallel instance admits a new micro-batch every ``step / pp``.

Models here:

- :class:`RooflineLatency` — from a catalog GPU and model: max(FLOPs / peak, bytes / HBM) plus
  TP all-reduces and a fixed overhead; any object with the same methods can replace it (see
  :func:`roofline_latency`).
- :class:`FittedLatency` — DistServe's fitted form (``simdistserve/estimators/time_estimator.py``
  in LLMServe/DistServe): prefill = a + b·Σl + c·Σl², decode = a + b·Σctx + c·batch, read from a
  profile file (:func:`load_profile`) or fitted to measured points (:func:`fit_latency`).
- :class:`ConstantLatency` — fixed prefill and decode times (the M/D/1 analysis).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.hardware import GPU, dtype_bytes, get_gpu
from pdlab.models import ModelConfig, get_model, kv_bytes_per_token, param_counts, weight_bytes
from pdlab.paths import read_json

__all__ = [
    "LatencyModel",
    "RooflineLatency",
    "FittedLatency",
    "ConstantLatency",
    "roofline_latency",
    "fit_latency",
    "nnls_fit",
    "sample_points",
    "load_profile",
    "save_profile",
    "kv_capacity_tokens",
    "PROFILE_FORMAT",
]

PROFILE_FORMAT = "pdlab-latency-profile/1"


class LatencyModel(ABC):
    """The interface the simulator calls. ``tp`` and ``pp`` describe the instance it models."""

    tp: int = 1
    pp: int = 1

    @abstractmethod
    def step_time_s(self, prefill_tokens: int, prefill_sq_tokens: float, decode_batch: int,
                    decode_ctx_tokens: int) -> float:
        """Seconds for one iteration (full depth, all pipeline stages)."""

    def decode_times_s(self, decode_batch: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        """Step times of consecutive pure-decode iterations (vectorised where a model can)."""
        return np.array([self.step_time_s(0, 0.0, decode_batch, int(c)) for c in decode_ctx_tokens])

    def decode_affine(self, decode_batch: int) -> tuple[float, float, float, float, float] | None:
        """Pure-decode step time as ``max(a1 + b1·ctx, a2 + b2·ctx) + c`` (seconds; ctx = Σ context
        tokens), or None when the model has no such form.

        With it the simulator sums a run of decode steps in closed form (ctx grows by
        ``decode_batch`` per step, so each line is an arithmetic series) instead of building arrays;
        the results equal step-by-step sums up to rounding (~1e-15 relative).
        """
        return None

    def prefill_time_s(self, lengths: Sequence[int]) -> float:
        """One unchunked prefill batch of prompts with these lengths."""
        lengths = [int(x) for x in lengths]
        return self.step_time_s(sum(lengths), float(sum(x * x for x in lengths)), 0, 0)

    def decode_time_s(self, context_lengths: Sequence[int]) -> float:
        """One decode iteration over requests with these context lengths."""
        return self.step_time_s(0, 0.0, len(context_lengths), int(sum(context_lengths)))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description (kind and parameters)."""
        return {"kind": type(self).__name__, "tp": self.tp, "pp": self.pp}


@dataclass
class RooflineLatency(LatencyModel):
    """Roofline step time for ``model`` on ``tp × pp`` GPUs of type ``gpu``.

    time = max(FLOPs / (tp · peak · compute_efficiency), bytes per GPU / (HBM · memory_efficiency))
    + TP all-reduce time + ``overhead_s``, where

    - FLOPs = 2 · matmul parameters · tokens (prefill + decode tokens; the input embedding is a
      lookup) + attention: 2 · L · d · Σ c(2p + c) for prefill, 4 · L · d · Σctx for decode
      (d = heads × head_dim, QKᵀ and AV);
    - bytes per GPU = weights / tp (each stage reads its share; stages run one after another) +
      KV read by decode (Σctx · KV bytes per token / tp) + KV written by prefill;
    - all-reduce: 2 per layer of tokens × hidden × 2 B, ring cost 2(tp−1)/tp · size / NVLink
      bandwidth + ``allreduce_latency_s`` each.
    """

    gpu: GPU
    model: ModelConfig
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    overhead_s: float = 0.001
    allreduce_latency_s: float = 5e-6
    _c: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1:
            raise ValueError(f"tp and pp must be >= 1, got tp={self.tp}, pp={self.pp}")
        m = self.model
        counts = param_counts(m)
        matmul_params = counts["active"] - m.vocab_size * m.hidden_size  # input embedding is a lookup
        d_attn = m.num_heads * m.head_dim if not m.is_mla else m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        peak = self.gpu.peak_flops(self.dtype if self.dtype in ("bf16", "fp16", "fp8") else "bf16")
        act_bytes = 2.0
        nvlink = self.gpu.nvlink_bytes_per_s or 32e9  # PCIe Gen4 when the GPU has no NVLink
        self._c = {
            "flops_per_token": 2.0 * matmul_params,
            "attn_prefill": 2.0 * m.num_layers * d_attn,
            "attn_decode": 4.0 * m.num_layers * d_attn,
            "flops_rate": self.tp * peak * self.compute_efficiency,
            "weight_bytes": weight_bytes(m, self.dtype) / self.tp,
            "kv_per_token": kv_bytes_per_token(m, self.dtype) / self.tp,
            "mem_rate": self.gpu.hbm_bytes_per_s * self.memory_efficiency,
            "ar_per_token": 0.0 if self.tp == 1 else
            2 * m.num_layers * (2 * (self.tp - 1) / self.tp) * m.hidden_size * act_bytes / nvlink,
            "ar_fixed": 0.0 if self.tp == 1 else 2 * m.num_layers * self.allreduce_latency_s,
        }
        _ = dtype_bytes(self.dtype)  # validate
        self._step_constants = tuple(self._c[k] for k in (
            "flops_per_token", "attn_prefill", "attn_decode", "flops_rate", "weight_bytes", "kv_per_token",
            "mem_rate", "ar_per_token", "ar_fixed"))

    def step_time_s(self, prefill_tokens: int, prefill_sq_tokens: float, decode_batch: int,
                    decode_ctx_tokens: int) -> float:
        tokens = prefill_tokens + decode_batch
        if tokens <= 0:
            return 0.0
        # the constants of self._c as one tuple (read on every simulated iteration)
        per_token, attn_prefill, attn_decode, flops_rate, weights, kv_per_token, mem_rate, ar_per_token, \
            ar_fixed = self._step_constants
        flops = per_token * tokens + attn_prefill * prefill_sq_tokens + attn_decode * decode_ctx_tokens
        mem = weights + kv_per_token * (decode_ctx_tokens + prefill_tokens)
        t = flops / flops_rate
        m = mem / mem_rate
        return (m if m > t else t) + ar_per_token * tokens + ar_fixed + self.overhead_s    # max(t, m), inlined

    def decode_times_s(self, decode_batch: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        c = self._c
        ctx = np.asarray(decode_ctx_tokens, dtype=float)
        flops = c["flops_per_token"] * decode_batch + c["attn_decode"] * ctx
        mem = c["weight_bytes"] + c["kv_per_token"] * ctx
        return np.maximum(flops / c["flops_rate"], mem / c["mem_rate"]) + c["ar_per_token"] * decode_batch \
            + c["ar_fixed"] + self.overhead_s

    def decode_affine(self, decode_batch: int) -> tuple[float, float, float, float, float]:
        per_token, _, attn_decode, fr, weights, kv_per_token, mr, ar_per_token, ar_fixed = self._step_constants
        return (per_token * decode_batch / fr, attn_decode / fr, weights / mr, kv_per_token / mr,
                ar_per_token * decode_batch + ar_fixed + self.overhead_s)

    def describe(self) -> dict[str, Any]:
        return {"kind": "roofline", "gpu": self.gpu.key, "model": self.model.name, "tp": self.tp,
                "pp": self.pp, "dtype": self.dtype, "compute_efficiency": self.compute_efficiency,
                "memory_efficiency": self.memory_efficiency, "overhead_s": self.overhead_s}


def roofline_latency(gpu: str | GPU, model: str | ModelConfig, tp: int = 1, pp: int = 1, **kwargs: Any
                     ) -> RooflineLatency:
    """A :class:`RooflineLatency` from catalog names (``"h100-sxm"``, ``"llama-3-70b"``)."""
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    m = get_model(model) if isinstance(model, str) else model
    return RooflineLatency(g, m, tp=tp, pp=pp, **kwargs)


@dataclass
class FittedLatency(LatencyModel):
    """DistServe's fitted form, coefficients in seconds (s, s/token, s/token², s/sequence).

    prefill = a_p + b_p · Σl + c_p · Σl²  (Σl = prefill tokens, Σl² = ``prefill_sq_tokens``)
    decode  = a_d + b_d · Σctx + c_d · batch

    A mixed (chunked) iteration costs prefill + decode − min(a_p, a_d): the fixed cost is paid once.
    """

    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]
    tp: int = 1
    pp: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prefill = tuple(float(x) for x in self.prefill)  # type: ignore[assignment]
        self.decode = tuple(float(x) for x in self.decode)  # type: ignore[assignment]
        if len(self.prefill) != 3 or len(self.decode) != 3:
            raise ValueError("prefill and decode need three coefficients each (a, b, c)")

    def step_time_s(self, prefill_tokens: int, prefill_sq_tokens: float, decode_batch: int,
                    decode_ctx_tokens: int) -> float:
        t = 0.0
        ap, bp, cp = self.prefill
        ad, bd, cd = self.decode
        if prefill_tokens > 0:
            t += ap + bp * prefill_tokens + cp * prefill_sq_tokens
        if decode_batch > 0:
            t += ad + bd * decode_ctx_tokens + cd * decode_batch
            if prefill_tokens > 0:
                t -= min(ap, ad)
        return t

    def derive(self, *, prefill_scale: float = 1.0, decode_scale: float = 1.0, **changes: Any) -> FittedLatency:
        """A copy with ``changes`` (any field: ``prefill``, ``decode``, ``meta``, ...; tp and pp kept
        unless given) and then each row multiplied by its scale (dimensionless)."""
        new = replace(self, **{"meta": dict(self.meta), **changes})
        if prefill_scale != 1.0 or decode_scale != 1.0:
            new = replace(new, prefill=tuple(prefill_scale * c for c in new.prefill),
                          decode=tuple(decode_scale * c for c in new.decode))
        return new

    def decode_times_s(self, decode_batch: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        ad, bd, cd = self.decode
        return ad + bd * np.asarray(decode_ctx_tokens, dtype=float) + cd * decode_batch

    def decode_affine(self, decode_batch: int) -> tuple[float, float, float, float, float]:
        ad, bd, cd = self.decode
        a = ad + cd * decode_batch
        return (a, bd, a, bd, 0.0)

    def describe(self) -> dict[str, Any]:
        return {"kind": "fitted", "prefill": list(self.prefill), "decode": list(self.decode),
                "tp": self.tp, "pp": self.pp, **self.meta}


@dataclass
class ConstantLatency(LatencyModel):
    """Fixed times: every prefill iteration takes ``prefill_s``, every decode iteration ``decode_s``
    (a mixed one the larger). The M/D/1 model of DistServe §3.1 (no batching, service time D)."""

    prefill_s: float
    decode_s: float = 0.0
    tp: int = 1
    pp: int = 1

    def step_time_s(self, prefill_tokens: int, prefill_sq_tokens: float, decode_batch: int,
                    decode_ctx_tokens: int) -> float:
        return max(self.prefill_s if prefill_tokens else 0.0, self.decode_s if decode_batch else 0.0)

    def decode_times_s(self, decode_batch: int, decode_ctx_tokens: np.ndarray) -> np.ndarray:
        return np.full(len(decode_ctx_tokens), self.decode_s)

    def decode_affine(self, decode_batch: int) -> tuple[float, float, float, float, float]:
        return (self.decode_s, 0.0, self.decode_s, 0.0, 0.0)


# ----------------------------------------------------------------------------------------------
# Fitting and profiles


def sample_points(model: LatencyModel, *, prefill_lengths: Iterable[int] = (64, 128, 256, 512, 1024, 2048),
                  prefill_batches: Iterable[int] = (1, 2, 4),
                  decode_batches: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128),
                  decode_contexts: Iterable[int] = (128, 512, 1024, 2048), noise: float = 0.0,
                  seed: int = 0) -> list[dict[str, float]]:
    """Timing points from a latency model (or, with ``noise``, "measurements" around it).

    Each point: ``prefill_tokens``, ``prefill_sq_tokens``, ``decode_batch``, ``decode_ctx_tokens``,
    ``time_s``. Prefill points have no decodes and decode points no prefill, as in a profiler.
    """
    rng = np.random.default_rng(seed)
    pts: list[dict[str, float]] = []
    for length in prefill_lengths:
        for b in prefill_batches:
            t = model.step_time_s(length * b, float(length * length * b), 0, 0)
            pts.append({"prefill_tokens": length * b, "prefill_sq_tokens": float(length * length * b),
                        "decode_batch": 0, "decode_ctx_tokens": 0,
                        "time_s": t * (1 + noise * rng.standard_normal())})
    for b in decode_batches:
        for ctx in decode_contexts:
            t = model.step_time_s(0, 0.0, b, b * ctx)
            pts.append({"prefill_tokens": 0, "prefill_sq_tokens": 0.0, "decode_batch": b,
                        "decode_ctx_tokens": b * ctx, "time_s": t * (1 + noise * rng.standard_normal())})
    return pts


def nnls_fit(a: Sequence[Sequence[float]] | np.ndarray, y: Sequence[float] | np.ndarray, *,
             relative: bool = False) -> np.ndarray:
    """Non-negative least squares of ``a @ coef ≈ y`` with the columns scaled to 1 (coefficients in
    seconds per token and per token² differ by orders of magnitude): the one fitting core of the
    package (:func:`fit_latency`, :mod:`pdlab.simreal` fits, the GPU step fit).

    With ``relative`` the residuals are relative, ``(a @ coef − y) / y`` (every point counts the
    same, short and long; ``y`` must then be > 0). Uses scipy's NNLS, or where scipy is missing (a
    bare GPU image) the exact solution over every active set (numpy only; for a few unknowns).
    Returns the coefficients in the units of ``y`` per unit of each column.
    """
    a = np.asarray(a, dtype=float)
    y = np.asarray(y, dtype=float)
    if a.ndim != 2 or a.shape[0] != y.shape[0]:
        raise ValueError(f"nnls_fit needs a (points × unknowns) matrix and one value per point, got {a.shape} and {y.shape}")
    if relative and np.any(y <= 0):
        raise ValueError("relative residuals need every measured value > 0")
    w = 1.0 / y if relative else np.ones_like(y)
    aw = a * w[:, None]
    scale = np.abs(aw).max(axis=0)
    scale[scale == 0] = 1.0
    aw, yw = aw / scale, y * w
    try:
        from scipy.optimize import nnls
    except ImportError:
        return _nnls_active_sets(aw, yw) / scale
    coef, _ = nnls(aw, yw)
    return coef / scale


def _nnls_active_sets(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact NNLS by least squares on every subset of columns (2^n − 1 solves; n is 3 or 4 here)."""
    import itertools

    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(y ** 2))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.all(sol >= 0):
                x = np.zeros(n)
                x[list(cols)] = sol
                res = float(np.sum((a @ x - y) ** 2))
                if res < best_res:
                    best, best_res = x, res
    return best


def fit_latency(points: Iterable[Mapping[str, float]], *, tp: int = 1, pp: int = 1,
                meta: dict[str, Any] | None = None) -> FittedLatency:
    """Fit :class:`FittedLatency` to timing points by non-negative least squares (:func:`nnls_fit`).

    ``points`` are mappings (dicts, DataFrame ``records``) with ``prefill_tokens``,
    ``prefill_sq_tokens`` (Σl²), ``decode_batch``, ``decode_ctx_tokens`` and ``time_s``. Points
    without decodes fit the prefill row, points without prefill fit the decode row; each needs at
    least three points.
    """
    pts = list(points)
    pre = [p for p in pts if p["prefill_tokens"] > 0 and p["decode_batch"] == 0]
    dec = [p for p in pts if p["decode_batch"] > 0 and p["prefill_tokens"] == 0]
    if len(pre) < 3 or len(dec) < 3:
        raise ValueError(f"need >= 3 prefill-only and >= 3 decode-only points, got {len(pre)} and {len(dec)}")
    prefill = nnls_fit([[1.0, p["prefill_tokens"], p["prefill_sq_tokens"]] for p in pre], [p["time_s"] for p in pre])
    decode = nnls_fit([[1.0, p["decode_ctx_tokens"], p["decode_batch"]] for p in dec], [p["time_s"] for p in dec])
    return FittedLatency(tuple(float(x) for x in prefill), tuple(float(x) for x in decode), tp=tp, pp=pp,
                         meta=dict(meta or {}))


def save_profile(model: FittedLatency, path: str | Path) -> Path:
    """Write a fitted model as a profile JSON file (see :func:`load_profile` for the format)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": PROFILE_FORMAT, "tp": model.tp, "pp": model.pp, "prefill": list(model.prefill),
               "decode": list(model.decode), **{k: v for k, v in model.meta.items() if k not in ("tp", "pp")}}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def load_profile(path: str | Path, *, tp: int | None = None, pp: int | None = None) -> FittedLatency:
    """Read a profile JSON file into a :class:`FittedLatency`.

    Format (``"format": "pdlab-latency-profile/1"``): ``{"tp": 1, "pp": 1, "prefill": [a, b, c],
    "decode": [a, b, c], ...}`` with coefficients in seconds (prefill: s, s/token, s/token²;
    decode: s, s/context token, s/sequence), or ``{"profiles": [...]}`` holding several such
    entries, from which ``tp``/``pp`` select one. Extra keys (``model``, ``gpu``, ``source``) are
    kept in ``meta``.
    """
    path = Path(path)
    data = read_json(path, "latency profile")
    entries = data.get("profiles", [data]) if isinstance(data, dict) else None
    if not entries:
        raise ValueError(f"{path}: expected an object with prefill/decode coefficients or a 'profiles' list")
    chosen = [e for e in entries if (tp is None or e.get("tp", 1) == tp) and (pp is None or e.get("pp", 1) == pp)]
    if not chosen:
        have = sorted({(e.get('tp', 1), e.get('pp', 1)) for e in entries})
        raise ValueError(f"{path}: no profile for tp={tp}, pp={pp}; have (tp, pp) in {have}")
    e = chosen[0]
    for key in ("prefill", "decode"):
        coef = e.get(key)
        if not isinstance(coef, list) or len(coef) != 3 or not all(isinstance(x, int | float) and math.isfinite(x)
                                                                   for x in coef):
            raise ValueError(f"{path}: {key!r} must be a list of three numbers (a, b, c), got {coef!r}")
    meta = {k: v for k, v in e.items() if k not in ("prefill", "decode", "tp", "pp", "format")}
    return FittedLatency(tuple(e["prefill"]), tuple(e["decode"]), tp=int(e.get("tp", 1)), pp=int(e.get("pp", 1)),
                         meta=meta)


def kv_capacity_tokens(gpu: str | GPU, model: str | ModelConfig, tp: int = 1, pp: int = 1, *,
                       dtype: str = "bf16", memory_utilization: float = 0.9) -> int:
    """KV-cache tokens an instance holds: (tp·pp·memory·utilisation − weights) / KV bytes per token.

    Raises ValueError when the weights alone do not fit.
    """
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    m = get_model(model) if isinstance(model, str) else model
    free = tp * pp * g.memory_bytes * memory_utilization - weight_bytes(m, dtype)
    if free <= 0:
        raise ValueError(f"{m.name} ({weight_bytes(m, dtype) / 1e9:.0f} GB in {dtype}) does not fit on "
                         f"{tp * pp}× {g.name} at {memory_utilization:.0%} memory use; raise tp or pp")
    return int(free // kv_bytes_per_token(m, dtype))
