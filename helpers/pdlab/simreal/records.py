"""What a calibration measured, as typed records with one home.

The live probes (:mod:`pdlab.serve.probes`) return these; the pure fits and replays
(:mod:`pdlab.simreal.calibrate`) read them. In a profile JSON (``pdlab-latency-profile/1``, read by
:func:`pdlab.sim.latency.load_profile`) each record is one key of the profile, written by its
``to_dict`` and read back by its ``from_dict``: ``kv_link`` (:class:`LinkFit`), ``cpu_contention``
(:class:`Contention`), ``admission`` (:class:`Admission`), beside ``points``, ``handoff_points`` and
``calibration_s`` (:class:`Calibration`). A profile without one of those keys has none of that
measurement; a hand-written entry may leave fields out: a missing time reads as NaN, a missing
count as 0, a missing factor, latency or per-token time as 0 (no effect in the simulator).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from pdlab.sim.latency import FittedLatency

__all__ = ["LinkFit", "Contention", "Admission", "Calibration"]

_NAN = float("nan")


def _read(cls: type, data: Mapping[str, Any], defaults: Mapping[str, Any]) -> Any:
    """An instance of the record ``cls`` from ``data``: every field, missing ones from ``defaults``;
    a field with no default must be there (KeyError naming it). Unknown keys are ignored."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}")
    kwargs = {}
    for f in fields(cls):
        if f.name in data and data[f.name] is not None:
            kind = int if f.type == "int" else float
            kwargs[f.name] = kind(data[f.name])
        elif f.name in defaults:
            kwargs[f.name] = defaults[f.name]
        else:
            raise KeyError(f"{cls.__name__} needs {f.name!r}")
    return cls(**kwargs)


@dataclass(frozen=True)
class LinkFit:
    """The KV hand-off fitted on TTFTs through the disaggregation proxy
    (:func:`pdlab.simreal.calibrate.fit_handoff`): a hand-off of l tokens takes ``latency_s + l·s_per_token``.

    ``latency_s``: fixed time per hand-off (s; proxy, transfer set-up, decode-side work).
    ``s_per_token``: time per prompt token moved (s/token).
    ``mae_s``: the fit's mean absolute error (s).
    ``points``: prompt lengths the fit used (count).
    """

    latency_s: float
    s_per_token: float
    mae_s: float = _NAN
    points: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The profile's ``kv_link`` entry."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LinkFit:
        """From a profile's ``kv_link`` entry (missing latency or per-token time: 0 s)."""
        return _read(cls, data, {"latency_s": 0.0, "s_per_token": 0.0, "mae_s": _NAN, "points": 0})


@dataclass(frozen=True)
class Contention:
    """Each role's slowdown while the other works, two servers on one host
    (:func:`pdlab.serve.probes.probe_contention`).

    ``prompt_tokens``: prompt length of the prefill probe (tokens).
    ``decode_streams``: concurrent streams of the decode probe (count).
    ``prefill_alone_s`` / ``prefill_busy_s``: median TTFT of one prompt alone / while decode streams run (s).
    ``decode_alone_s`` / ``decode_busy_s``: mean decode step alone / while prompts are prefilled (s).
    ``prefill`` / ``decode``: max(0, busy/alone − 1) of each role (dimensionless): the simulator's
    ``InstanceSpec.cpu_contention`` (an iteration takes ``1 + c`` times as long while the other works).
    """

    prompt_tokens: int
    decode_streams: int
    prefill_alone_s: float
    prefill_busy_s: float
    decode_alone_s: float
    decode_busy_s: float
    prefill: float
    decode: float

    def to_dict(self) -> dict[str, Any]:
        """The profile's ``cpu_contention`` entry."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contention:
        """From a profile's ``cpu_contention`` entry; ``{"prefill": c_p, "decode": c_d}`` alone is
        enough (the measured times then read as NaN, a missing factor as 0)."""
        return _read(cls, data, {"prompt_tokens": 0, "decode_streams": 0, "prefill_alone_s": _NAN,
                                 "prefill_busy_s": _NAN, "decode_alone_s": _NAN, "decode_busy_s": _NAN,
                                 "prefill": 0.0, "decode": 0.0})


@dataclass(frozen=True)
class Admission:
    """What each request handed off through the proxy costs the streams already decoding
    (:func:`pdlab.serve.probes.probe_admission`).

    ``streams``: concurrent decode streams (count); ``stream_prompt``: their prompt (tokens).
    ``side_prompt``: prompt of each handed-off side request (tokens); ``side_requests``: how many (count).
    ``period_s``: time between side requests (s).
    ``itl_alone_s`` / ``itl_busy_s``: mean token gap of the streams alone / during the side traffic (s).
    ``gaps_busy``: token gaps measured during the side traffic (count).
    ``raw_overhead_s``: F = T·(1 − m0/m1), seconds each admission adds to one decode step (s; may be < 0).
    ``overhead_s``: max(0, F) (s): the simulator's ``InstanceSpec.admit_overhead_s``.
    """

    streams: int
    stream_prompt: int
    side_prompt: int
    side_requests: int
    period_s: float
    itl_alone_s: float
    itl_busy_s: float
    gaps_busy: int
    raw_overhead_s: float
    overhead_s: float

    def to_dict(self) -> dict[str, Any]:
        """The profile's ``admission`` entry."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Admission:
        """From a profile's ``admission`` entry (missing times NaN, counts 0; a missing raw F is the
        stored ``overhead_s``)."""
        raw = data.get("raw_overhead_s", data.get("overhead_s", _NAN)) if isinstance(data, Mapping) else _NAN
        overhead = max(0.0, raw) if math.isfinite(raw) else _NAN
        return _read(cls, data, {"streams": 0, "stream_prompt": 0, "side_prompt": 0, "side_requests": 0,
                                 "period_s": _NAN, "itl_alone_s": _NAN, "itl_busy_s": _NAN, "gaps_busy": 0,
                                 "raw_overhead_s": raw, "overhead_s": overhead})


def _typed(meta: Mapping[str, Any], key: str, cls: type) -> Any:
    value = meta.get(key)
    return cls.from_dict(value) if value else None


@dataclass(frozen=True)
class Calibration:
    """A calibrated latency model with what was measured to get it (:func:`pdlab.serve.probes.calibrate`).

    ``latency``: the fitted step times (:class:`FittedLatency`, coefficients in seconds); its
    ``meta`` mirrors the typed fields below in their profile form (``kv_link``, ``cpu_contention``,
    ``admission``, ``points``, ``handoff_points``, ``calibration_s``), kept in step on construction,
    so ``latency`` alone — or a profile file read back — carries them.
    ``prefill_points`` / ``decode_points``: the timing points of the fit (``time_s`` in s, token counts).
    ``handoff_points``: TTFTs through the proxy, ``{"tokens", "ttft_s", "samples"}`` (tokens, s, count).
    ``kv_link``: the fitted hand-off, or None when no proxy was probed.
    ``contention``: each role's slowdown while the other works, or None (one server).
    ``admission``: per-hand-off cost to running decode streams, or None.
    ``seconds``: wall time the probes and the fit took (s).
    """

    latency: FittedLatency
    prefill_points: Sequence[Mapping[str, Any]] = ()
    decode_points: Sequence[Mapping[str, Any]] = ()
    handoff_points: Sequence[Mapping[str, Any]] = ()
    kv_link: LinkFit | None = None
    contention: Contention | None = None
    admission: Admission | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_points", tuple(self.prefill_points))
        object.__setattr__(self, "decode_points", tuple(self.decode_points))
        object.__setattr__(self, "handoff_points", tuple(self.handoff_points))
        meta = {k: v for k, v in self.latency.meta.items()
                if k not in ("kv_link", "cpu_contention", "admission", "points", "handoff_points", "calibration_s")}
        points = list(self.prefill_points) + list(self.decode_points)
        for key, value in (("points", points), ("handoff_points", list(self.handoff_points))):
            if value:
                meta[key] = value
        for key, record in (("kv_link", self.kv_link), ("cpu_contention", self.contention),
                            ("admission", self.admission)):
            if record is not None:
                meta[key] = record.to_dict()
        meta["calibration_s"] = float(self.seconds)
        lat = self.latency
        object.__setattr__(self, "latency", FittedLatency(lat.prefill, lat.decode, tp=lat.tp, pp=lat.pp, meta=meta))

    @classmethod
    def from_latency(cls, latency: FittedLatency) -> Calibration:
        """The record a fitted model's ``meta`` holds (its profile keys parsed once, here)."""
        meta = latency.meta
        points = list(meta.get("points") or [])
        pre = [p for p in points if float(p.get("prefill_tokens", 0)) > 0]
        dec = [p for p in points if float(p.get("decode_batch", 0)) > 0]
        return cls(latency, pre, dec, list(meta.get("handoff_points") or []), _typed(meta, "kv_link", LinkFit),
                   _typed(meta, "cpu_contention", Contention), _typed(meta, "admission", Admission),
                   float(meta.get("calibration_s", 0.0)))

    def to_dict(self) -> dict[str, Any]:
        """The profile JSON (``pdlab-latency-profile/1``, as :func:`pdlab.sim.latency.save_profile` writes)."""
        from pdlab.sim.latency import PROFILE_FORMAT

        lat = self.latency
        return {"format": PROFILE_FORMAT, "tp": lat.tp, "pp": lat.pp, "prefill": list(lat.prefill),
                "decode": list(lat.decode), **{k: v for k, v in lat.meta.items() if k not in ("tp", "pp")}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """From a profile JSON object (one entry: ``prefill``, ``decode``, the rest is ``meta``)."""
        meta = {k: v for k, v in data.items() if k not in ("format", "tp", "pp", "prefill", "decode")}
        lat = FittedLatency(tuple(data["prefill"]), tuple(data["decode"]), tp=int(data.get("tp", 1)),
                            pp=int(data.get("pp", 1)), meta=meta)
        return cls.from_latency(lat)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (``pdlab sim calibrate --json``): coefficients, fit quality and the
        typed measurements in their profile form."""
        return {"prefill": list(self.latency.prefill), "decode": list(self.latency.decode),
                "fit": self.latency.meta.get("fit"), "kv_link": self.kv_link and self.kv_link.to_dict(),
                "seconds": self.seconds, "cpu_contention": self.contention and self.contention.to_dict(),
                "admission": self.admission and self.admission.to_dict()}
