"""The files and tables of a GPU profile (:mod:`pdlab.simreal.gpu_profile` measures one).

``<name>-gpu-profile.json`` (``"format": "pdlab-gpu-profile/1"``) is written by
:func:`save_gpu_profile` together with the fitted latency profile (``<name>-latency.json``, written
by :func:`pdlab.sim.latency.save_profile`) and the roofline (``<name>-roofline.json``, written by
:func:`pdlab.roofline.measure.save_device_profile`); :func:`load_gpu_profile` reads it back and
:func:`find_gpu_profiles` lists the committed ones. ``*_rows`` turn a profile into the notebooks'
tables (lists of dicts, one per row).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdlab.paths import read_json

__all__ = [
    "FORMAT",
    "GpuProfile",
    "save_gpu_profile",
    "load_gpu_profile",
    "find_gpu_profiles",
    "roofline_rows",
    "handoff_rows",
    "step_rows",
]

FORMAT = "pdlab-gpu-profile/1"


def _safe(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "device"


def save_gpu_profile(profile: GpuProfile, out_dir: str | Path, *, fitted: Any = None, roofline: Any = None
                     ) -> dict[str, Path]:
    """Write ``<name>-gpu-profile.json`` (and the latency and roofline files when given) to ``out_dir``."""
    from pdlab.roofline.measure import save_device_profile as save_roofline
    from pdlab.sim.latency import save_profile as save_latency

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = _safe(profile.data["name"])
    files: dict[str, Path] = {}
    if fitted is not None:
        files["latency"] = save_latency(fitted, out / f"{stem}-latency.json")
    if roofline is not None:
        files["roofline"] = save_roofline(roofline, out / f"{stem}-roofline.json")
    files["gpu_profile"] = out / f"{stem}-gpu-profile.json"
    profile.data["files"] = {k: v.name for k, v in files.items()}
    files["gpu_profile"].write_text(json.dumps(profile.data, indent=2, default=_json_default) + "\n")
    profile.path = files["gpu_profile"]
    return files


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


@dataclass
class GpuProfile:
    """A GPU profile as written by :func:`pdlab.simreal.gpu_profile.run_gpu_profile` (the JSON in ``data``)."""

    data: dict[str, Any]
    path: Path | None = None
    _roof: Any = field(default=None, init=False, repr=False)

    @property
    def device(self) -> dict[str, Any]:
        return self.data["device"]

    @property
    def is_gpu(self) -> bool:
        return self.device.get("kind") == "cuda"

    @property
    def label(self) -> str:
        """``"NVIDIA H200 (cuda), 2026-11-30T12:00:00Z, size full"``."""
        return f"{self.device['name']} ({self.device['kind']}), {self.data['date']}, size {self.data['size']}"

    @property
    def roofline(self):
        """The measured roofline as a :class:`pdlab.roofline.measure.DeviceProfile` (None if not measured)."""
        from pdlab.roofline.measure import DeviceProfile

        if self._roof is None and self.data.get("roofline"):
            self._roof = DeviceProfile.from_dict(self.data["roofline"])
        return self._roof

    def latency(self):
        """The fitted step-time model (:class:`pdlab.sim.latency.FittedLatency`), or None."""
        from pdlab.sim.latency import FittedLatency

        fit = (self.data.get("steps") or {}).get("fit")
        if not fit:
            return None
        return FittedLatency(tuple(fit["prefill"]), tuple(fit["decode"]),
                             meta={k: v for k, v in fit.items() if k not in ("prefill", "decode")})

    def latency_file(self) -> Path | None:
        """The ``<name>-latency.json`` beside this profile (for ``pdlab simulate --profile``), if present."""
        name = self.data.get("files", {}).get("latency")
        if not name or self.path is None:
            return None
        path = self.path.parent / name
        return path if path.exists() else None


def load_gpu_profile(path: str | Path) -> GpuProfile:
    """Read a ``*-gpu-profile.json`` written by :func:`pdlab.simreal.gpu_profile.run_gpu_profile`; ValueError names what is wrong."""
    path = Path(path)
    data = read_json(path, "GPU profile")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: not a GPU profile (format {got!r}, expected {FORMAT!r})")
    missing = [k for k in ("date", "size", "device", "command") if k not in data]
    if missing:
        raise ValueError(f"{path}: GPU profile lacks {', '.join(missing)}")
    return GpuProfile(data, path)


def find_gpu_profiles(directory: str | Path | None = None, *, gpu_only: bool = True) -> list[GpuProfile]:
    """The GPU profiles committed under ``data/profiles/`` (``*-gpu-profile.json``), newest first.

    ``gpu_only`` (default) leaves out profiles measured on a CPU. Files that do not load are skipped.
    """
    from pdlab.roofline.measure import profiles_dir

    directory = Path(directory) if directory else profiles_dir()
    found = []
    for path in sorted(directory.glob("*-gpu-profile.json")) if directory.is_dir() else []:
        try:
            p = load_gpu_profile(path)
        except ValueError:
            continue
        if p.is_gpu or not gpu_only:
            found.append(p)
    return sorted(found, key=lambda p: p.data["date"], reverse=True)


# ----------------------------------------------------------------------------------------------
# Tables for the notebooks (lists of dicts, one per row)


def roofline_rows(profile: GpuProfile) -> list[dict[str, Any]]:
    """Measured matmul TFLOP/s per dtype and memory TB/s, beside the datasheet where there is one."""
    roof = profile.roofline
    if roof is None:
        return []
    spec = profile.data.get("spec") or {}
    rows = []
    for dt, rate in roof.matmul_flops_per_s.items():
        s = (spec.get("matmul_flops_per_s") or {}).get(dt)
        rows.append({"quantity": f"matmul {dt} (TFLOP/s)", "measured": rate / 1e12,
                     "datasheet": s / 1e12 if s else None, "measured / datasheet": rate / s if s else None})
    s = spec.get("memory_bytes_per_s")
    rows.append({"quantity": "memory bandwidth (TB/s)", "measured": roof.memory_bytes_per_s / 1e12,
                 "datasheet": s / 1e12 if s else None,
                 "measured / datasheet": roof.memory_bytes_per_s / s if s else None})
    return rows


def handoff_rows(profile: GpuProfile) -> list[dict[str, Any]]:
    """Best bandwidth of each hand-off path (and at which size), then the skipped paths and why."""
    from pdlab.transfer.sizes import format_size

    h = profile.data.get("handoff")
    if not h:
        return []
    rows = []
    for kind in dict.fromkeys(r["kind"] for r in h["results"]):
        mine = [r for r in h["results"] if r["kind"] == kind]
        top = max(mine, key=lambda r: r["bandwidth_bytes_per_s"])
        rows.append({"path": top["path"], "kind": kind, "best GB/s": top["bandwidth_bytes_per_s"] / 1e9,
                     "at size": format_size(top["size_bytes"]),
                     "latency at smallest size (µs)": min(mine, key=lambda r: r["size_bytes"])["latency_s"] * 1e6,
                     "verified": all(r["verified"] for r in mine), "verified by": top.get("verified_by", ""),
                     "skipped because": ""})
    for kind, why in h.get("skipped", {}).items():
        rows.append({"path": h.get("labels", {}).get(kind, kind), "kind": kind, "best GB/s": None, "at size": "",
                     "latency at smallest size (µs)": None, "verified": None, "verified by": "",
                     "skipped because": why})
    return rows


def step_rows(profile: GpuProfile) -> list[dict[str, Any]]:
    """Each measured step (ms) beside the fitted profile and the analytic model (measured roof, datasheet)."""
    st = profile.data.get("steps")
    if not st:
        return []

    def ms(v: Any) -> float | None:
        return v * 1e3 if isinstance(v, int | float) else None

    rows = []
    for p in st["points"]:
        row = {"phase": p["phase"], "batch": p["batch"], "tokens": p["tokens"], "context": p["context"],
               "measured (ms)": ms(p["time_s"]), "fitted profile (ms)": ms(p.get("fitted_s")),
               "analytic, measured roof (ms)": ms(p.get("analytic_measured_roof_s")),
               "analytic, datasheet (ms)": ms(p.get("analytic_spec_s")),
               "AIConfigurator (ms)": ms(p.get("aiconfigurator_s"))}
        a = p.get("analytic_measured_roof_s")
        row["measured / analytic (measured roof)"] = p["time_s"] / a if a else None
        rows.append(row)
    return rows
