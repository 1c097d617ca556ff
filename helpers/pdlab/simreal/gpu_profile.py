"""One prepared profile of a GPU box (or, in CI, of this CPU): roofline, KV hand-off, step times.

:func:`run_gpu_profile` (``pdlab gpu-profile``, ``scripts/gpu_profile.sh``) measures, with torch
and this package only:

1. **roofline** — :func:`pdlab.roofline.measure.measure_device`: peak matmul FLOP/s per dtype
   (bf16, fp16, fp32, fp8 on a GPU), memory copy/read bandwidth, and a Llama-shaped layer at
   prefill and decode shapes under the measured roof; beside it the catalog's datasheet figures
   when the GPU is in the catalog.
2. **handoff** — the KV hand-off paths inside one node, each verified: device→device, host→device
   and device→host from pinned and pageable memory (:func:`pdlab.transfer.cuda.cuda_copy_benchmark`,
   byte-for-byte compare), a copy between two processes through CUDA IPC
   (:func:`pdlab.transfer.cuda.cuda_ipc_benchmark`, CRC-32), and as host baselines one memcpy
   and shared memory between two processes (``shm`` of :mod:`pdlab.transfer.bench`, CRC-32). On a
   CPU the CUDA paths are listed under ``skipped`` with the reason, and shared memory is the
   analogue of the IPC path. Sizes are notebook 03's (:func:`pdlab.transfer.sizes.sizes_for_profile`).
3. **steps** — whole-model forward steps (:mod:`pdlab.simreal.steps`; Llama-3-8B shape with
   random weights in bf16 on a GPU, a tiny Llama-shaped model in fp32 for the CPU smoke size) at
   several batches and lengths, fitted to the simulator's latency profile
   (:func:`pdlab.sim.latency.fit_latency`, written with :func:`pdlab.sim.latency.save_profile`),
   with the analytic model's prediction of each point (:func:`pdlab.roofline.analytic.analyze`, on
   the measured roof and on the datasheet). ``pdlab gpu-profile`` adds AIConfigurator's prediction
   where it is installed and has the GPU's database (:func:`pdlab.peers.aic_compare.add_aiconfigurator`,
   passed as ``annotate``; it runs on a CPU, so ``pdlab gpu-profile --annotate FILE`` adds it later
   to a profile measured on a bare GPU image).

Files written to ``out_dir`` (``<name>`` is the catalog GPU key, e.g. ``h200``, or ``cpu``):

- ``<name>-gpu-profile.json`` — everything above (``"format": "pdlab-gpu-profile/1"``); the date,
  device, torch version and the command that made it. Read with :func:`load_gpu_profile`;
  committed GPU profiles are found by :func:`find_gpu_profiles` as
  ``data/profiles/*-gpu-profile.json`` (notebooks 01 and 03 show them).
- ``<name>-latency.json`` — the fitted latency profile: ``pdlab simulate --profile FILE``.
- ``<name>-roofline.json`` — the roofline alone (:func:`pdlab.roofline.measure.load_device_profile`).

Reading, writing and the notebooks' tables are in :mod:`pdlab.simreal.gpu_profile_files` (re-exported
here).

Sizes: ``full`` (a GPU: under 8 minutes on one H200) and ``smoke`` (seconds; on a 2-core CPU well
under a minute, run by the test suite so the code path cannot rot).
"""

from __future__ import annotations

import datetime as _dt
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pdlab.simreal.gpu_profile_files import (
    FORMAT,
    GpuProfile,
    find_gpu_profiles,
    handoff_rows,
    load_gpu_profile,
    roofline_rows,
    save_gpu_profile,
    step_rows,
)

__all__ = [
    "FORMAT",
    "PARTS",
    "GpuProfile",
    "run_gpu_profile",
    "profile_plan",
    "save_gpu_profile",
    "load_gpu_profile",
    "find_gpu_profiles",
    "gpu_profile_command",
    "roofline_rows",
    "handoff_rows",
    "step_rows",
]

PARTS = ("roofline", "handoff", "steps")
#: How to make a GPU profile (printed by the notebooks when none is committed).
GPU_PROFILE_COMMAND = "scripts/gpu_profile.sh --size full --out data/profiles"


def gpu_profile_command() -> str:
    """The shell command that measures a GPU profile into ``data/profiles/``."""
    return GPU_PROFILE_COMMAND


def _tiny_model():
    from pdlab.models import ModelConfig

    return ModelConfig(name="tiny-llama-shaped", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=64, intermediate_size=768, vocab_size=2048, source="random weights (CPU smoke)")


def _small_model():
    from pdlab.models import ModelConfig

    return ModelConfig(name="small-llama-shaped", hidden_size=1024, num_layers=4, num_heads=8, num_kv_heads=2,
                       head_dim=128, intermediate_size=2816, vocab_size=8192, source="random weights (CPU full)")


def _llama8(layers: int | None = None):
    from pdlab.models import get_model

    m = get_model("llama-3-8b")
    return replace(m, num_layers=layers, name=f"{m.name} ({layers} layers)") if layers else m


def profile_plan(device: str, size: str) -> dict[str, Any]:
    """What ``size`` measures on ``device`` (``"cpu"`` or ``"cuda"``): model, dtype, points, sizes."""
    from pdlab.transfer.sizes import sizes_for_profile

    plans: dict[str, dict[str, dict[str, Any]]] = {
        "cpu": {
            "smoke": dict(roofline="smoke", model=_tiny_model, dtype="fp32", repeats=3, min_seconds=0.15,
                          prefill=[(1, 16), (1, 32), (1, 64), (2, 64)],
                          decode=[(1, 32), (4, 32), (1, 128), (4, 128), (8, 128)],
                          handoff_sizes=sizes_for_profile("smoke"), handoff_repeats=3),
            "full": dict(roofline="ci", model=_small_model, dtype="fp32", repeats=3, min_seconds=0.5,
                         prefill=[(1, 64), (1, 128), (1, 256), (2, 256), (1, 512)],
                         decode=[(1, 256), (4, 256), (8, 256), (1, 1024), (4, 1024), (8, 1024)],
                         handoff_sizes=sizes_for_profile("ci"), handoff_repeats=3),
        },
        "cuda": {
            "smoke": dict(roofline="smoke", model=lambda: _llama8(4), dtype="bf16", repeats=5,
                          prefill=[(1, 128), (1, 512), (1, 2048), (2, 1024)],
                          decode=[(1, 512), (16, 512), (64, 512), (16, 2048)],
                          handoff_sizes=sizes_for_profile("smoke"), handoff_repeats=3),
            "full": dict(roofline="full", model=_llama8, dtype="bf16", repeats=10,
                         prefill=[(1, 128), (1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 8192), (2, 2048),
                                  (4, 1024), (8, 512)],
                         decode=[(1, 512), (1, 2048), (1, 8192), (8, 512), (8, 2048), (8, 8192), (32, 512),
                                 (32, 2048), (32, 8192), (64, 512), (64, 2048), (128, 512), (128, 2048),
                                 (256, 512), (256, 1024)],
                         handoff_sizes=sizes_for_profile("full"), handoff_repeats=5),
        },
    }
    if device not in plans:
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if size not in plans[device]:
        raise ValueError(f"size must be one of {', '.join(plans[device])}, got {size!r}")
    plan = dict(plans[device][size])
    plan["model"] = plan["model"]()
    return plan


# ----------------------------------------------------------------------------------------------
# Measuring


#: Hand-off path kind → the label printed in the profile.
_HANDOFF_LABELS = {"cuda-d2d": "device → device", "cuda-h2d-pinned": "host (pinned) → device",
                   "cuda-h2d-pageable": "host (pageable) → device", "cuda-d2h-pinned": "device → host (pinned)",
                   "cuda-d2h-pageable": "device → host (pageable)", "cuda-p2p": "GPU → GPU (peer)",
                   "cuda-ipc": "process → process on one GPU (CUDA IPC)", "host-memcpy": "host memcpy (one process)",
                   "shm": "process → process in host memory (shared memory)"}

_CUDA_HANDOFF_KINDS = ["cuda-d2d", "cuda-h2d-pinned", "cuda-h2d-pageable", "cuda-d2h-pinned", "cuda-d2h-pageable",
                       "cuda-ipc", "cuda-p2p"]


class _HandoffRows:
    """The rows and skipped paths of one hand-off measurement, and how a failing path is handled."""

    def __init__(self, say: Callable[[str], None], keep_going: bool, errors: dict[str, str] | None):
        self.say = say
        self.keep_going = keep_going
        self.errors = errors
        self.rows: list[dict[str, Any]] = []
        self.skipped: dict[str, str] = {}

    def add(self, measurements: Iterable[Any], verified_by: str) -> None:
        for m in measurements:
            self.rows.append({"path": _HANDOFF_LABELS.get(m.transport, m.transport), "kind": m.transport,
                              **m.as_dict(), "verified_by": verified_by})

    def guarded(self, kinds: list[str], fn: Callable[[], Any]) -> None:
        """Run ``fn``; with ``keep_going`` a failure skips ``kinds`` (and is noted in ``errors``)."""
        try:
            fn()
        except Exception as exc:
            if not self.keep_going:
                raise
            why = f"failed: {type(exc).__name__}: {exc}"
            for kind in kinds:
                self.skipped[kind] = why
            if self.errors is not None:
                self.errors[f"handoff {'/'.join(kinds)}"] = why
            self.say(f"hand-off {'/'.join(kinds)} FAILED: {why}")

    def result(self, sizes: list[int], repeats: int) -> dict[str, Any]:
        return {"sizes": sizes, "repeats": repeats, "results": self.rows, "skipped": self.skipped,
                "labels": dict(_HANDOFF_LABELS)}


def _host_memcpy_row(size: int, repeats: int) -> dict[str, Any]:
    """Host memcpy in one process at ``size`` bytes (:func:`pdlab.transfer.kvbuffer.memcpy_bandwidth`,
    median of at least 3), CRC-verified."""
    from pdlab.transfer.kvbuffer import memcpy_bandwidth

    (m,) = memcpy_bandwidth([size], repeats=max(3, repeats), verify=True)
    return {"path": _HANDOFF_LABELS["host-memcpy"], "kind": "host-memcpy", "transport": "host-memcpy", **m,
            "bandwidth_min_bytes_per_s": size / m["latency_max_s"],
            "bandwidth_max_bytes_per_s": size / m["latency_min_s"], "verified_by": "crc32"}


def _handoff_cuda(out: _HandoffRows, device: str, sizes: list[int], repeats: int) -> None:
    """The CUDA paths (copies, IPC; peer needs two GPUs), or all of them skipped off CUDA."""
    import torch

    if device != "cuda":
        why = "no CUDA GPU here" if not torch.cuda.is_available() else "profile run with --device cpu"
        for kind in _CUDA_HANDOFF_KINDS:
            analogue = "; shared memory between two processes is its CPU analogue" if kind == "cuda-ipc" else ""
            out.skipped[kind] = f"needs a CUDA GPU ({why}, torch {torch.__version__}){analogue}"
        return
    from pdlab.transfer.cuda import cuda_copy_benchmark, cuda_ipc_benchmark

    out.say("hand-off: CUDA copies (d2d, h2d/d2h pinned and pageable) ...")
    out.guarded(_CUDA_HANDOFF_KINDS[:5], lambda: out.add(cuda_copy_benchmark(sizes, repeats),
                                                         "byte compare with the source"))
    if torch.cuda.device_count() < 2:
        out.skipped["cuda-p2p"] = f"one GPU visible ({torch.cuda.device_count()}); peer copies need two"
    out.say("hand-off: CUDA IPC between two processes ...")
    out.guarded(["cuda-ipc"], lambda: out.add(cuda_ipc_benchmark(sizes, repeats), "crc32"))


def _handoff(device: str, sizes: list[int], repeats: int, say: Callable[[str], None],
             keep_going: bool = False, errors: dict[str, str] | None = None) -> dict[str, Any]:
    """Every hand-off path that exists here, verified; the others under ``skipped`` with the reason.

    With ``keep_going`` a path that fails is listed under ``skipped`` (and in ``errors``) and the
    next one is measured; otherwise the failure raises.
    """
    from pdlab.transfer.sizes import format_size
    from pdlab.transfer.transports import transport_status

    out = _HandoffRows(say, keep_going, errors)
    # host memcpy, one process: the reference every other path is read against
    say("hand-off: host memcpy ...")
    for size in sizes:
        row = _host_memcpy_row(size, repeats)
        out.rows.append(row)
        if not row["verified"]:
            raise RuntimeError(f"host memcpy: CRC mismatch at {format_size(size)}")
    # two processes through shared memory (the CPU analogue of CUDA IPC)
    shm_ok, shm_why = transport_status("shm")
    if shm_ok:
        from pdlab.transfer.bench import measure_transport

        say("hand-off: shared memory between two processes ...")
        out.guarded(["shm"], lambda: out.add(measure_transport("shm", sizes, repeats), "crc32"))
    else:
        out.skipped["shm"] = shm_why
    _handoff_cuda(out, device, sizes, repeats)
    return out.result(sizes, repeats)


def _spec(catalog_gpu: str | None) -> dict[str, Any] | None:
    if not catalog_gpu:
        return None
    from pdlab.hardware import get_gpu

    g = get_gpu(catalog_gpu)
    flops = {}
    for dt in ("bf16", "fp16", "fp8", "fp32"):
        try:
            flops[dt] = g.peak_flops(dt)
        except (KeyError, ValueError):
            continue
    return {"gpu": catalog_gpu, "name": g.name, "matmul_flops_per_s": flops, "memory_bytes_per_s": g.hbm_bytes_per_s}


def _predict(points: list[dict[str, Any]], model: Any, dtype: str, roof: Any, catalog_gpu: str | None,
             fitted: Any) -> None:
    """Fill in the analytic (measured roof, datasheet) and fitted predictions of each step point."""
    from pdlab.roofline.analytic import analyze

    for p in points:
        kw = dict(batch=p["batch"], tokens=p["tokens"], context=p["context"], dtype=dtype)
        p["analytic_measured_roof_s"] = None
        if roof is not None and dtype in roof.matmul_flops_per_s:
            p["analytic_measured_roof_s"] = analyze(model, roof, p["phase"], **kw).time_s
        p["analytic_spec_s"] = analyze(model, catalog_gpu, p["phase"], **kw).time_s if catalog_gpu else None
        if fitted is not None:
            b = p["batch"]
            p["fitted_s"] = (fitted.prefill_time_s([p["tokens"]] * b) if p["phase"] == "prefill"
                             else fitted.decode_time_s([p["context"]] * b))
        p.setdefault("aiconfigurator_s", None)


def _measure(size: str, device: str, parts: Iterable[str], name: str | None, command: str | None,
             keep_going: bool, progress: Callable[[str], None] | None,
             annotate: Callable[[GpuProfile], Any] | None) -> tuple[dict[str, Any], Any, Any]:
    import torch

    from pdlab.hardware import cpu_flags, detect_device
    from pdlab.roofline.measure import match_catalog_gpu, measure_device
    from pdlab.simreal.steps import fit_step_profile, measure_steps

    t0 = time.perf_counter()
    say = progress or (lambda msg: None)
    parts = [p for p in PARTS if p in set(parts)]
    if not parts:
        raise ValueError(f"parts must name some of {', '.join(PARTS)}")
    plan = profile_plan(device, size)
    info = detect_device()
    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else str(info["name"])
    catalog_gpu = match_catalog_gpu(dev_name) if device == "cuda" else None
    data: dict[str, Any] = {
        "format": FORMAT, "name": name or catalog_gpu or device, "size": size, "parts": parts,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command or f"pdlab gpu-profile --size {size}",
        "device": {"kind": device, "name": dev_name, "catalog_gpu": catalog_gpu,
                   "count": torch.cuda.device_count() if device == "cuda" else int(info.get("count") or 1),
                   "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                   "cpu_native_bf16": bool({"avx512_bf16", "amx_bf16"} & cpu_flags())},
        "spec": _spec(catalog_gpu), "roofline": None, "handoff": None, "steps": None,
        "aiconfigurator": {"available": False, "reason": "not run"}, "errors": {}, "files": {},
    }

    def attempt(part: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            if not keep_going:
                raise
            data["errors"][part] = f"{type(exc).__name__}: {exc}"
            say(f"{part} FAILED: {data['errors'][part]}")
            return None

    roof = None
    if "roofline" in parts:
        say(f"roofline ({plan['roofline']} sizes) on {dev_name} ...")
        roof = attempt("roofline", lambda: measure_device(device, plan["roofline"], progress=say))
        data["roofline"] = roof.as_dict() if roof is not None else None
    if "handoff" in parts:
        data["handoff"] = attempt("handoff", lambda: _handoff(device, plan["handoff_sizes"], plan["handoff_repeats"],
                                                              say, keep_going, data["errors"]))
    fitted = None
    if "steps" in parts:
        model, dtype = plan["model"], plan["dtype"]
        say(f"steps: {model.name} ({model.num_layers} layers, {dtype}, random weights) ...")
        points = attempt("steps", lambda: measure_steps(model, device, prefill=plan["prefill"],
                                                        decode=plan["decode"], dtype=dtype,
                                                        repeats=plan["repeats"],
                                                        min_seconds=plan.get("min_seconds", 0.0), progress=say))
        if points is not None:
            rows = [p.as_dict() for p in points]
            meta = {"source": f"measured by pdlab gpu-profile ({size}) on {dev_name}, {data['date']}",
                    "model": model.name, "gpu": catalog_gpu or dev_name, "dtype": dtype}
            fitted = attempt("fit", lambda: fit_step_profile(points, meta=meta))
            attempt("predictions", lambda: _predict(rows, model, dtype, roof, catalog_gpu, fitted))
            data["steps"] = {"model": asdict(model), "dtype": dtype, "points": rows,
                             "fit": None if fitted is None else {"prefill": list(fitted.prefill),
                                                                 "decode": list(fitted.decode), **meta}}
    if data["steps"] is not None and annotate is not None:
        attempt("aiconfigurator", lambda: annotate(GpuProfile(data)))
    data["seconds"] = time.perf_counter() - t0
    return data, fitted, roof


def run_gpu_profile(size: str = "smoke", out_dir: str | Path | None = None, *, device: str = "auto",
                    parts: Iterable[str] = PARTS, name: str | None = None, command: str | None = None,
                    keep_going: bool = False, cpu_threads: int | None = 1,
                    progress: Callable[[str], None] | None = None,
                    annotate: Callable[[GpuProfile], Any] | None = None) -> GpuProfile:
    """Measure the parts of a GPU profile on ``device``; write the files to ``out_dir`` when given.

    ``keep_going=True`` records a failing part under ``errors`` and goes on with the next (what a
    one-off GPU run wants); otherwise the first failure raises. On the CPU torch runs on
    ``cpu_threads`` threads (default 1; None keeps torch's setting): on cores shared with other
    jobs, a two-thread operator waits for its slower thread, and tiny steps then vary tenfold.
    ``annotate`` is called with the profile once step times are measured (``pdlab gpu-profile`` passes
    :func:`pdlab.peers.aic_compare.add_aiconfigurator`); without it ``aiconfigurator`` says "not run".
    """
    import torch

    from pdlab.roofline.measure import resolve_device

    device = resolve_device(device)
    threads = torch.get_num_threads()
    if device == "cpu" and cpu_threads:
        torch.set_num_threads(cpu_threads)
    try:
        data, fitted, roof = _measure(size, device, parts, name, command, keep_going, progress, annotate)
    finally:
        torch.set_num_threads(threads)
    data["device"]["torch_threads"] = cpu_threads if device == "cpu" and cpu_threads else threads
    profile = GpuProfile(data)
    if out_dir is not None:
        save_gpu_profile(profile, out_dir, fitted=fitted, roofline=roof)
    return profile
