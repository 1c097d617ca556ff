"""Cross-check of pdlab's analytic latency model against NVIDIA AIConfigurator.

AIConfigurator (``pip install aiconfigurator==0.12.0``, the course's optional extra ``aic``) predicts
TTFT and TPOT of a serving configuration offline, on a CPU, by summing per-operator latencies looked
up in NVIDIA's database of kernels *measured* on each GPU (GEMMs, attention, NCCL collectives) for a
given framework (here vLLM). pdlab's model (:class:`pdlab.sim.latency.RooflineLatency`, the
simulator's default) is a roofline with fixed efficiencies (70 % of peak FLOP/s, 80 % of HBM
bandwidth), ring all-reduces at NVLink bandwidth and a fixed 1 ms per step; the ideal roofline of
:func:`pdlab.roofline.analytic.analyze` (sum over operators, no efficiency factors) is shown beside it.

Definitions, as AIConfigurator's static mode (``cli_estimate(mode="static")``): ``batch`` requests of
``isl`` prompt tokens are prefilled in one step (TTFT = that step), then decoded together for ``osl``
tokens (TPOT = mean decode step, context growing from ``isl`` + 1). Times in milliseconds.

Where they differ and why (see the table's ``*_err_pct`` columns, ``(pdlab − AIC) / AIC``):

- **kernel efficiency** — measured GEMM/attention kernels reach different fractions of peak at
  different shapes (small batches, tile quantisation), where pdlab assumes one constant;
- **communication** — with TP the measured all-reduce of small decode messages is latency-bound
  (tens of µs each, 2 per layer), more than the ring-bandwidth formula plus 5 µs that pdlab uses;
- **scheduler / framework overhead** — pdlab charges a flat 1 ms per step; AIConfigurator's vLLM
  database carries the framework's own per-step costs.

Everything here skips cleanly when AIConfigurator is not installed (:func:`aic_available`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pdlab.simreal.gpu_profile_files import GpuProfile

__all__ = [
    "AIC_MODELS",
    "AIC_SYSTEMS",
    "GRIDS",
    "REFERENCE_POINTS",
    "aic_available",
    "aic_estimate",
    "pdlab_estimate",
    "aic_comparison",
    "add_aiconfigurator",
]

#: pdlab catalog model → (AIConfigurator model path, bundled config), TP sizes go with each row.
AIC_MODELS = {"llama-3-8b": "meta-llama/Meta-Llama-3.1-8B", "llama-3-70b": "meta-llama/Meta-Llama-3.1-70B"}
#: pdlab catalog GPU → AIConfigurator system name.
AIC_SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm"}

#: Grids for :func:`aic_comparison` by notebook profile: batch sizes and (isl, osl) pairs. Every
#: AIConfigurator estimate takes ~2–6 s on 2 CPU cores (its first on a GPU loads that database).
GRIDS: dict[str, dict[str, Any]] = {
    "smoke": {"batches": (1,), "lengths": ((2048, 256),)},
    "ci": {"batches": (1, 16), "lengths": ((2048, 256),)},
    "full": {"batches": (1, 8, 32), "lengths": ((512, 128), (2048, 256), (8192, 256))},
}

#: AIConfigurator 0.12.0 figures measured before (vLLM backend, static mode, batch 1, 2048 in /
#: 256 out): (model, gpu, tp) → (TTFT ms, TPOT ms). Used by the tests.
REFERENCE_POINTS = {
    ("llama-3-8b", "h200", 1): (43.4, 4.91),
    ("llama-3-8b", "h100-sxm", 1): (43.5, 6.24),
    ("llama-3-70b", "h100-sxm", 4): (130.2, 14.98),
    ("llama-3-70b", "h200", 4): (127.8, 12.38),
}

_TP = {"llama-3-8b": 1, "llama-3-70b": 4}


def aic_available() -> bool:
    """True when ``aiconfigurator`` imports (the ``aic`` extra is installed)."""
    try:
        import aiconfigurator.cli.api  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence AIConfigurator's per-database warnings ("Loading low-fidelity fallback rows ...")."""
    names = ("aiconfigurator", "aiconfigurator_core")
    old = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for n, lvl in zip(names, old, strict=True):
            logging.getLogger(n).setLevel(lvl)


@functools.cache
def aic_estimate(model: str, gpu: str, *, batch: int = 1, isl: int = 2048, osl: int = 256, tp: int | None = None,
                 backend: str = "vllm") -> dict[str, Any]:
    """AIConfigurator's static-mode (TTFT ms, TPOT ms) for a pdlab catalog ``model`` and ``gpu``.

    Raises ImportError when AIConfigurator is not installed, KeyError for a model or GPU it is not
    mapped to (:data:`AIC_MODELS`, :data:`AIC_SYSTEMS`).
    """
    from aiconfigurator.cli.api import cli_estimate

    tp = tp or _TP.get(model, 1)
    with _quiet():
        r = cli_estimate(AIC_MODELS[model], AIC_SYSTEMS[gpu], mode="static", backend_name=backend, isl=isl,
                         osl=osl, batch_size=batch, tp_size=tp)
    return {"ttft_ms": float(r.ttft), "tpot_ms": float(r.tpot), "backend_version": str(r.backend_version)}


def pdlab_estimate(model: str, gpu: str, *, batch: int = 1, isl: int = 2048, osl: int = 256,
                   tp: int | None = None, dtype: str = "bf16") -> dict[str, float]:
    """pdlab's TTFT and TPOT (ms) in the same static set-up: the simulator's roofline model, and the
    ideal per-operator roofline (:func:`pdlab.roofline.analytic.analyze`)."""
    from pdlab.roofline.analytic import analyze
    from pdlab.sim.latency import roofline_latency

    tp = tp or _TP.get(model, 1)
    lat = roofline_latency(gpu, model, tp=tp, dtype=dtype)
    ttft = lat.step_time_s(batch * isl, float(batch * isl * isl), 0, 0)
    ctx = isl + 1 + np.arange(max(1, osl - 1))       # context of every decode step after the first token
    tpot = float(np.mean(lat.decode_times_s(batch, batch * ctx)))
    ideal_ttft = analyze(model, gpu, "prefill", batch=batch, tokens=isl, tp=tp, dtype=dtype).time_s
    mid = int(isl + osl // 2)
    ideal_tpot = analyze(model, gpu, "decode", batch=batch, context=mid, tp=tp, dtype=dtype).time_s
    return {"ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * tpot, "ideal_ttft_ms": 1e3 * ideal_ttft,
            "ideal_tpot_ms": 1e3 * ideal_tpot}


def aic_comparison(profile: str = "ci", *, models: Sequence[str] = ("llama-3-8b", "llama-3-70b"),
                   gpus: Sequence[str] = ("h100-sxm", "h200"), batches: Sequence[int] | None = None,
                   lengths: Sequence[tuple[int, int]] | None = None, backend: str = "vllm"):
    """A pandas DataFrame: pdlab against AIConfigurator for every model × GPU × batch × (isl, osl).

    Columns: model, gpu, tp, batch, isl, osl, ``ttft_pdlab_ms``, ``ttft_aic_ms``, ``ttft_err_pct``
    (``(pdlab − AIC) / AIC``), the same for TPOT, and the ideal roofline's ``ttft_ideal_ms`` /
    ``tpot_ideal_ms``. ``profile`` picks :data:`GRIDS` unless ``batches``/``lengths`` are given.
    Raises ImportError when AIConfigurator is not installed (check :func:`aic_available` first).
    """
    import pandas as pd

    if not aic_available():
        raise ImportError("aiconfigurator is not installed: pip install -e '.[aic]'")
    grid = GRIDS[profile]
    batches = tuple(batches or grid["batches"])
    lengths = tuple(lengths or grid["lengths"])
    rows = []
    for model in models:
        for gpu in gpus:
            for isl, osl in lengths:
                for b in batches:
                    ours = pdlab_estimate(model, gpu, batch=b, isl=isl, osl=osl)
                    theirs = aic_estimate(model, gpu, batch=b, isl=isl, osl=osl, backend=backend)
                    rows.append({
                        "model": model, "gpu": gpu, "tp": _TP.get(model, 1), "batch": b, "isl": isl, "osl": osl,
                        "ttft_pdlab_ms": ours["ttft_ms"], "ttft_aic_ms": theirs["ttft_ms"],
                        "ttft_err_pct": 100 * (ours["ttft_ms"] - theirs["ttft_ms"]) / theirs["ttft_ms"],
                        "tpot_pdlab_ms": ours["tpot_ms"], "tpot_aic_ms": theirs["tpot_ms"],
                        "tpot_err_pct": 100 * (ours["tpot_ms"] - theirs["tpot_ms"]) / theirs["tpot_ms"],
                        "ttft_ideal_ms": ours["ideal_ttft_ms"], "tpot_ideal_ms": ours["ideal_tpot_ms"],
                        "aic_backend": f"{backend} {theirs['backend_version']}",
                    })
    return pd.DataFrame(rows)


def _aic_installed() -> bool:
    try:
        return importlib.util.find_spec("aiconfigurator") is not None
    except (ImportError, ValueError):
        return False


def add_aiconfigurator(profile: GpuProfile, *, backend: str = "vllm",
                       progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fill in AIConfigurator's prediction of every step point (``aiconfigurator_s``) where it can.

    Uses :func:`aic_estimate` (static mode, NVIDIA's database of kernels measured
    on that GPU): a prefill point ``(B, S)`` is the TTFT of ``B`` prompts of ``S`` tokens; a decode
    point ``(B, C)`` the TPOT of ``B`` requests with ``C − 1`` prompt tokens and 2 output tokens (one
    decode step at context ``C``). Only for the full Llama-3-8B on a GPU that AIConfigurator maps
    (:data:`AIC_SYSTEMS`); otherwise, or without the optional ``aic`` extra, the
    reason is recorded. Runs on a CPU (about 5 s a point), so a profile measured on a bare GPU
    image can be annotated later: ``pdlab gpu-profile --annotate FILE``. Returns ``data["aiconfigurator"]``.
    """
    say = progress or (lambda msg: None)
    data = profile.data
    steps = data.get("steps") or {}
    model = (steps.get("model") or {})
    gpu = data["device"].get("catalog_gpu")

    def skip(reason: str) -> dict[str, Any]:
        data["aiconfigurator"] = {"available": False, "reason": reason}
        return data["aiconfigurator"]

    if not _aic_installed():
        return skip("aiconfigurator is not installed (optional extra: pip install -e '.[aic]')")
    if not steps.get("points"):
        return skip("no step points to predict")
    from pdlab.models import get_model

    full = get_model("llama-3-8b")
    if model.get("name") != full.name or model.get("num_layers") != full.num_layers or "llama-3-8b" not in AIC_MODELS:
        return skip(f"AIConfigurator models whole catalog models; this profile timed {model.get('name')!r}")
    if gpu not in AIC_SYSTEMS:
        return skip(f"AIConfigurator has no database for {data['device'].get('name')!r} (maps {', '.join(AIC_SYSTEMS)})")
    if not aic_available():
        return skip("aiconfigurator is installed but does not import")
    version = None
    for p in steps["points"]:
        if p["phase"] == "prefill":
            r = aic_estimate("llama-3-8b", gpu, batch=p["batch"], isl=p["tokens"], osl=2, tp=1, backend=backend)
            p["aiconfigurator_s"] = r["ttft_ms"] / 1e3
        else:
            r = aic_estimate("llama-3-8b", gpu, batch=p["batch"], isl=max(1, p["context"] - 1), osl=2, tp=1,
                             backend=backend)
            p["aiconfigurator_s"] = r["tpot_ms"] / 1e3
        version = r.get("backend_version")
        say(f"  AIConfigurator {p['phase']} B={p['batch']} C={p['context']}: {p['aiconfigurator_s'] * 1e3:.3f} ms")
    data["aiconfigurator"] = {"available": True, "backend": f"{backend} {version}", "system": AIC_SYSTEMS[gpu],
                              "mode": "static (prefill: TTFT; decode: TPOT with osl 2)"}
    return data["aiconfigurator"]
