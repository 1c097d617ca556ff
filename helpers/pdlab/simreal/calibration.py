"""Stage 2 of sim-to-real: the calibration, one typed record the replay applies, and its file.

The live probes (:mod:`pdlab.serve.probes`) and the fits (:mod:`pdlab.simreal.fit`,
:mod:`pdlab.simreal.runfit`) produce these records; the replay (:mod:`pdlab.simreal.replay`, used
by lab 05 and by ``pdlab simulate --profile``) reads only them. In a profile JSON
(``pdlab-latency-profile/1``, :func:`save_calibration` / :func:`load_calibration`; its coefficients
are read by :func:`pdlab.sim.latency.load_profile` too) each record is one key, written by its
``to_dict`` and read back by its ``from_dict``: ``kv_link`` (:class:`LinkFit`), ``cpu_contention``
(:class:`Contention`), ``admission`` (:class:`Admission`), ``prefill_stall`` (:class:`PrefillStall`),
``run_fit`` (:class:`RunFit`), ``front_end_core`` (:class:`CoreShare`), ``points`` (a list of
:class:`StepPoint`), beside ``handoff_points`` and ``calibration_s``.

Each term belongs to what it describes, so it carries to any deployment built from the same
engines (:mod:`pdlab.simreal.replay`, :func:`~pdlab.simreal.replay.carry`): an engine on its core
(the step-time rows, the prefill stall, the cost of a front end, a client or a second engine
sharing its core: ``front_end_core``, ``run_fit``'s prefill core load, ``cpu_contention``) or the
link between a prefill and a decode engine (``kv_link``). A profile without one of those keys has none of that measurement; a
hand-written entry may leave fields out: a missing time reads as NaN, a missing count as 0, a
missing factor, latency or per-token time as 0 (no effect in the simulator).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Self

from pdlab.sim.latency import PROFILE_FORMAT, FittedLatency, load_profile

__all__ = ["StepPoint", "step_points", "LinkFit", "Contention", "Admission", "PrefillStall", "RunFit", "CoreShare",
           "Calibration", "TERM_KEYS", "INFO_KEYS", "save_calibration", "load_calibration"]

_NAN = float("nan")


def _read(cls: type, data: Mapping[str, Any], defaults: Mapping[str, Any]) -> Any:
    """An instance of the record ``cls`` from ``data``: every field, missing ones from ``defaults``;
    a field with no default must be there (KeyError naming it). Unknown keys are ignored."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}")
    kwargs = {}
    for f in fields(cls):
        if f.name in data and data[f.name] is not None:
            kind = {"int": int, "str": str}.get(f.type, float)
            kwargs[f.name] = kind(data[f.name])
        elif f.name in defaults:
            kwargs[f.name] = defaults[f.name]
        else:
            raise KeyError(f"{cls.__name__} needs {f.name!r}")
    return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class StepPoint:
    """One timed engine step of one kind: a row of the step-time fit
    (:func:`pdlab.simreal.fit.fit_row`), from a live probe or a live run.

    ``prefill_tokens``: prompt tokens the step prefilled, Σl (tokens); ``prefill_sq_tokens``: Σl²
    (tokens²). ``decode_batch``: sequences the step decoded (count); ``decode_ctx_tokens``: the
    context they read, Σ(prompt + tokens so far) (tokens). A point is prefill-only (decode fields 0)
    or decode-only (prefill fields 0).
    ``time_s``: the step time (s): a median TTFT (prefill) or a mean or median token gap (decode).
    ``samples``: timings behind ``time_s`` (count). ``kind``: ``"prefill"`` or ``"decode"``.
    ``prompt_tokens``: decode probes only, each stream's prompt (tokens); None otherwise.
    ``times_s``: prefill probes, every sample's TTFT (s); () otherwise.
    ``passes`` / ``pass_medians_s``: prefill points merged over probe passes
    (:func:`pdlab.simreal.fit.merge_prefill_points`): how many passes, each one's median (s).

    In a profile (``points``) a point is written by :meth:`to_dict` with these names as keys;
    ``prompt_tokens``, ``times_s`` and ``passes``/``pass_medians_s`` only when set.
    """

    prefill_tokens: int = 0
    prefill_sq_tokens: float = 0.0
    decode_batch: int = 0
    decode_ctx_tokens: float = 0.0
    time_s: float
    samples: int = 1
    kind: str = ""
    prompt_tokens: int | None = None
    times_s: tuple[float, ...] = ()
    passes: int = 1
    pass_medians_s: tuple[float, ...] = ()

    @classmethod
    def prefill(cls, tokens: int, time_s: float, **fields: Any) -> StepPoint:
        """A prefill point of one ``tokens``-token prompt taking ``time_s`` seconds."""
        return cls(prefill_tokens=int(tokens), prefill_sq_tokens=float(tokens) ** 2, time_s=float(time_s),
                   kind="prefill", **fields)

    @classmethod
    def decode(cls, batch: int, ctx_tokens: float, time_s: float, **fields: Any) -> StepPoint:
        """A decode point: ``batch`` sequences reading ``ctx_tokens`` tokens in all, one step of ``time_s`` s."""
        return cls(decode_batch=int(batch), decode_ctx_tokens=float(ctx_tokens), time_s=float(time_s),
                   kind="decode", **fields)

    def to_dict(self) -> dict[str, Any]:
        """The point as one entry of a profile's ``points`` (JSON-ready)."""
        out: dict[str, Any] = {"prefill_tokens": self.prefill_tokens, "prefill_sq_tokens": self.prefill_sq_tokens,
                               "decode_batch": self.decode_batch, "decode_ctx_tokens": self.decode_ctx_tokens,
                               "time_s": self.time_s, "samples": self.samples, "kind": self.kind}
        if self.prompt_tokens is not None:
            out["prompt_tokens"] = self.prompt_tokens
        if self.times_s:
            out["times_s"] = list(self.times_s)
        if self.pass_medians_s:
            out["passes"], out["pass_medians_s"] = self.passes, list(self.pass_medians_s)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepPoint:
        """From one entry of a profile's ``points`` (or :func:`pdlab.sim.latency.sample_points`):
        ``time_s`` must be there; missing token counts read as 0, ``samples`` as 1, a missing
        ``kind`` from which fields are set. Unknown keys are ignored."""
        if not isinstance(data, Mapping):
            raise TypeError(f"StepPoint.from_dict needs a mapping, got {type(data).__name__}")
        if "time_s" not in data:
            raise KeyError("StepPoint needs 'time_s'")
        pre, dec = int(data.get("prefill_tokens", 0)), int(data.get("decode_batch", 0))
        kind = data.get("kind") or ("prefill" if pre > 0 else "decode" if dec > 0 else "")
        prompt = data.get("prompt_tokens")
        return cls(prefill_tokens=pre, prefill_sq_tokens=float(data.get("prefill_sq_tokens", 0.0)),
                   decode_batch=dec, decode_ctx_tokens=float(data.get("decode_ctx_tokens", 0.0)),
                   time_s=float(data["time_s"]), samples=int(data.get("samples", 1)), kind=str(kind),
                   prompt_tokens=None if prompt is None else int(prompt),
                   times_s=tuple(float(t) for t in data.get("times_s") or ()), passes=int(data.get("passes", 1)),
                   pass_medians_s=tuple(float(t) for t in data.get("pass_medians_s") or ()))


def step_points(points: Sequence[StepPoint | Mapping[str, Any]]) -> tuple[StepPoint, ...]:
    """``points`` as StepPoints (mappings read by :meth:`StepPoint.from_dict`)."""
    return tuple(p if isinstance(p, StepPoint) else StepPoint.from_dict(p) for p in points)


class _ProfileEntry:
    """A record stored as one entry of a profile: :meth:`to_dict` writes its fields by name,
    :meth:`from_dict` reads them back, a field the entry leaves out from ``_MISSING`` (a hand-written
    or older entry); a field without one there must be given."""

    _MISSING: ClassVar[Mapping[str, Any]] = {}

    def to_dict(self) -> dict[str, Any]:
        """The record's profile entry (JSON-ready)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """From the record's profile entry (missing fields as the class says)."""
        return _read(cls, data, cls._missing(data))

    @classmethod
    def _missing(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        return cls._MISSING


@dataclass(frozen=True)
class LinkFit(_ProfileEntry):
    """The KV hand-off fitted on TTFTs through the disaggregation proxy
    (:func:`pdlab.simreal.fit.fit_handoff`): a hand-off of l tokens takes ``latency_s + l·s_per_token``.

    ``latency_s``: fixed time per hand-off (s; proxy, transfer set-up, decode-side work).
    ``s_per_token``: time per prompt token moved (s/token).
    ``mae_s``: the fit's mean absolute error (s).
    ``points``: prompt lengths the fit used (count).

    The profile's ``kv_link`` entry; a missing latency or per-token time reads as 0 s.
    """

    _MISSING: ClassVar[Mapping[str, Any]] = {"latency_s": 0.0, "s_per_token": 0.0, "mae_s": _NAN, "points": 0}

    latency_s: float
    s_per_token: float
    mae_s: float = _NAN
    points: int = 0


@dataclass(frozen=True)
class Contention(_ProfileEntry):
    """Each role's slowdown while the other works, two servers on one host
    (:func:`pdlab.serve.pair_probes.probe_contention`).

    ``prompt_tokens``: prompt length of the prefill probe (tokens).
    ``decode_streams``: concurrent streams of the decode probe (count).
    ``prefill_alone_s`` / ``prefill_busy_s``: median TTFT of one prompt alone / while decode streams run (s).
    ``prefill_background``: what ran on the decode role meanwhile (``"16 streams decoding"``, or with
    a proxy ``"1 renewed stream through the proxy"``: the times are then the proxy's prefill legs).
    ``decode_alone_s`` / ``decode_busy_s``: mean decode step alone / while prompts are prefilled (s).
    ``prefill`` / ``decode``: max(0, busy/alone − 1) of each role (dimensionless): the simulator's
    ``InstanceSpec.cpu_contention`` (an iteration takes ``1 + c`` times as long while the other works).

    The profile's ``cpu_contention`` entry; ``{"prefill": c_p, "decode": c_d}`` alone is enough (the
    measured times then read as NaN, a missing factor as 0).
    """

    _MISSING: ClassVar[Mapping[str, Any]] = {"prompt_tokens": 0, "decode_streams": 0, "prefill_alone_s": _NAN,
                                             "prefill_busy_s": _NAN, "decode_alone_s": _NAN, "decode_busy_s": _NAN,
                                             "prefill": 0.0, "decode": 0.0, "prefill_background": ""}

    prompt_tokens: int
    decode_streams: int
    prefill_alone_s: float
    prefill_busy_s: float
    decode_alone_s: float
    decode_busy_s: float
    prefill: float
    decode: float
    prefill_background: str = ""


@dataclass(frozen=True)
class Admission(_ProfileEntry):
    """What each request handed off through the proxy costs the streams already decoding
    (:func:`pdlab.serve.pair_probes.probe_admission`).

    ``streams``: concurrent decode streams (count); ``stream_prompt``: their prompt (tokens).
    ``side_prompt``: prompt of each handed-off side request (tokens); ``side_requests``: how many (count).
    ``period_s``: time between side requests (s).
    ``itl_alone_s`` / ``itl_busy_s``: mean token gap of the streams alone / during the side traffic (s).
    ``gaps_busy``: token gaps measured during the side traffic (count).
    ``raw_overhead_s``: F = T·(1 − m0/m1), seconds each admission adds to one decode step (s; may be < 0).
    ``overhead_s``: max(0, F) (s): the simulator's ``InstanceSpec.admit_overhead_s``.

    The profile's ``admission`` entry; missing times read as NaN, counts as 0, a missing raw F as the
    stored ``overhead_s``.
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

    @classmethod
    def _missing(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        raw = data.get("raw_overhead_s", data.get("overhead_s", _NAN)) if isinstance(data, Mapping) else _NAN
        overhead = max(0.0, raw) if math.isfinite(raw) else _NAN
        return {"streams": 0, "stream_prompt": 0, "side_prompt": 0, "side_requests": 0, "period_s": _NAN,
                "itl_alone_s": _NAN, "itl_busy_s": _NAN, "gaps_busy": 0, "raw_overhead_s": raw, "overhead_s": overhead}


@dataclass(frozen=True)
class PrefillStall(_ProfileEntry):
    """How long a prefill holds up the streams one server is decoding, against its lone TTFT
    (:func:`pdlab.serve.probes.probe_prefill_stall`, fitted by
    :func:`pdlab.simreal.fit.fit_prefill_stall`).

    ``streams``: concurrent decode streams (count); ``stream_prompt``: their prompt (tokens).
    ``injections``: prefills timed among them (count); ``median_prompt``: their median prompt (tokens).
    ``raw_fixed_s``: the median, over the prefills, of the streams' stall − the prefill row's
    per-token terms (b_p·P + c_p·P²) (s; may be < 0).
    ``fixed_s``: what a step that admits a prefill costs over the decode step beyond those terms,
    ``raw_fixed_s`` kept within [0, a_p − a_d] (s): the simulator's engine charges a prefill
    ``a_d + fixed_s`` instead of the ``a_p`` of the lone TTFT.
    ``off_engine_s``: a_p − a_d − ``fixed_s`` (s): the rest of a lone prompt's fixed TTFT, spent
    outside the engine loop (HTTP, tokenisation, the first token's trip back through the API
    server); it delays that request alone.

    The profile's ``prefill_stall`` entry; a missing time reads as NaN, a count as 0, a missing
    ``fixed_s`` as NaN (no split: the simulator then charges ``a_p`` in every step, as without one).
    """

    _MISSING: ClassVar[Mapping[str, Any]] = {"streams": 0, "stream_prompt": 0, "injections": 0, "median_prompt": 0,
                                             "raw_fixed_s": _NAN, "fixed_s": _NAN, "off_engine_s": _NAN}

    streams: int
    stream_prompt: int
    injections: int
    median_prompt: int
    raw_fixed_s: float
    fixed_s: float
    off_engine_s: float


@dataclass(frozen=True)
class RunFit(_ProfileEntry):
    """What a live run adds to the probe's fit beyond the coefficients and the contention
    (:func:`pdlab.simreal.runfit.fit_on_run`); the replay applies every field.

    ``front_end_s``: seconds each request spends before it reaches the engine, which the engine
    does not spend (HTTP, tokenisation, a front end busy streaming other requests' tokens); the
    request reaches the simulated engine that much after it was sent.
    ``prefill_core_base_cores`` / ``prefill_core_cpu_s_per_request``: a prefill/decode pair's prefill
    core shared with its co-runners (API servers, proxy, client): cores they take while requests
    are in flight, and CPU seconds per request (:func:`pdlab.simreal.runfit.split_co_runner_cpu`);
    the replay stretches the prefill row by ``1 / (1 − u)`` with ``u`` = base + rate × per request.

    The profile's ``run_fit`` entry (older profiles hold the same three keys at the top level);
    missing fields read as 0 (no effect).
    """

    _MISSING: ClassVar[Mapping[str, Any]] = {"front_end_s": 0.0, "prefill_core_base_cores": 0.0,
                                             "prefill_core_cpu_s_per_request": 0.0}

    front_end_s: float = 0.0
    prefill_core_base_cores: float = 0.0
    prefill_core_cpu_s_per_request: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"RunFit.{f.name} must be a finite number >= 0, got {v!r}")

    @property
    def has_prefill_core_load(self) -> bool:
        """Whether the run fit charges a prefill core's co-runners."""
        return self.prefill_core_base_cores > 0 or self.prefill_core_cpu_s_per_request > 0


@dataclass(frozen=True)
class CoreShare(_ProfileEntry):
    """A front end (the engine's API server: HTTP, tokenisation, streaming tokens back) measured as
    the CPU it takes (:func:`pdlab.simreal.probes.frontend.probe_front_end_core`), for deployments
    that run it on its engine's core, as two replicas on a two-core host do.

    ``base_cores``: cores it takes while requests are in flight through its engine (cores).
    ``cpu_s_per_request``: CPU seconds per request through its engine (s).
    ``requests`` / ``windows``: requests and CPU sample windows behind the fit (count); ``r2``: the
    fit's R² (:func:`pdlab.simreal.runfit.split_co_runner_cpu`). ``rate_rps``: the probe's rate (req/s).

    The simulator applies it per engine whose front end shares its core
    (:class:`pdlab.simreal.replay.Deployment`, ``front_end_shares_core``): the engine's step times
    are stretched by ``1 / (1 − u)``, ``u`` = ``base_cores`` + (the rate through that engine) ×
    ``cpu_s_per_request``; an engine whose front end runs on another core is not slowed by it.

    The profile's ``front_end_core`` entry; missing fields read as 0 (R² and the rate as NaN).
    """

    _MISSING: ClassVar[Mapping[str, Any]] = {"base_cores": 0.0, "cpu_s_per_request": 0.0, "requests": 0,
                                             "windows": 0, "r2": _NAN, "rate_rps": _NAN}

    base_cores: float = 0.0
    cpu_s_per_request: float = 0.0
    requests: int = 0
    windows: int = 0
    r2: float = _NAN
    rate_rps: float = _NAN

    def __post_init__(self) -> None:
        for name in ("base_cores", "cpu_s_per_request"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"CoreShare.{name} must be a finite number >= 0, got {v!r}")

    def share(self, rate_rps: float) -> float:
        """The share of its core the front end takes at ``rate_rps`` requests/s through its engine (cores)."""
        return self.base_cores + rate_rps * self.cpu_s_per_request


#: Profile keys of the terms the replay applies (each a record of this module).
TERM_KEYS = ("kv_link", "cpu_contention", "prefill_stall", "run_fit", "admission", "front_end_core")

#: Profile keys that describe a calibration and change nothing the simulator does.
INFO_KEYS = ("format", "tp", "pp", "prefill", "decode", "fit", "points", "handoff_points", "calibration_s", "source",
             "model", "gpu", "url", "decode_url", "proxy_url", "probe_plan", "note", "device", "dtype", "setup")

#: Parts of the run fit that :meth:`Calibration.without` drops one at a time.
DROPPABLE_PARTS = ("run_fit.front_end_s", "run_fit.prefill_core")

#: Calibration fields of the profile keys in :data:`TERM_KEYS`.
_TERM_FIELDS = {"kv_link": "kv_link", "cpu_contention": "contention", "prefill_stall": "prefill_stall",
                "run_fit": "run_fit", "admission": "admission", "front_end_core": "front_end_core"}

#: Top-level keys of older profiles that now live in ``run_fit``.
_LEGACY_RUN_KEYS = ("front_end_s", "prefill_core_base_cores", "prefill_core_cpu_s_per_request")


def _typed(meta: Mapping[str, Any], key: str, cls: type) -> Any:
    value = meta.get(key)
    return cls.from_dict(value) if value else None


@dataclass(frozen=True)
class Calibration:
    """A calibrated latency model with what was measured to get it (:func:`pdlab.simreal.probes.calibrate`,
    refitted on a live run by :func:`pdlab.simreal.runfit.fit_on_run`): the one record the replay
    (:func:`pdlab.simreal.replay.replay`) applies.

    ``latency``: the fitted step times (:class:`FittedLatency`, coefficients in seconds); its
    ``meta`` mirrors the typed fields below in their profile form, kept in step on construction,
    so ``latency`` alone — or a profile file read back — carries them.
    ``prefill_points`` / ``decode_points``: the timing points of the fit (:class:`StepPoint`; mappings
    in its profile form are read on construction).
    ``handoff_points``: TTFTs through the proxy, ``{"tokens", "ttft_s", "samples"}`` (tokens, s, count).
    ``kv_link``: the fitted hand-off, or None when no proxy was probed.
    ``contention``: each role's slowdown while the other works, or None (one server).
    ``admission``: per-hand-off cost to running decode streams, or None (recorded; the replay
    charges it only when asked, ``admit_overhead_s``).
    ``prefill_stall``: what a prefill costs the streams one server decodes, or None (not probed).
    ``run_fit``: what a live run added (front-end delay, prefill core load), or None (probe only).
    ``seconds``: wall time the probes and the fit took (s).
    ``front_end_core``: the CPU a front end takes on its engine's core, or None (not probed).
    """

    latency: FittedLatency
    prefill_points: Sequence[StepPoint] = ()
    decode_points: Sequence[StepPoint] = ()
    handoff_points: Sequence[Mapping[str, Any]] = ()
    kv_link: LinkFit | None = None
    contention: Contention | None = None
    admission: Admission | None = None
    seconds: float = 0.0
    prefill_stall: PrefillStall | None = None
    run_fit: RunFit | None = None
    front_end_core: CoreShare | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_points", step_points(self.prefill_points))
        object.__setattr__(self, "decode_points", step_points(self.decode_points))
        object.__setattr__(self, "handoff_points", tuple(self.handoff_points))
        meta = {k: v for k, v in self.latency.meta.items()
                if k not in TERM_KEYS + _LEGACY_RUN_KEYS + ("points", "handoff_points", "calibration_s")}
        points = [p.to_dict() for p in self.prefill_points + self.decode_points]
        for key, value in (("points", points), ("handoff_points", list(self.handoff_points))):
            if value:
                meta[key] = value
        for key, record in (("kv_link", self.kv_link), ("cpu_contention", self.contention),
                            ("admission", self.admission), ("prefill_stall", self.prefill_stall),
                            ("run_fit", self.run_fit), ("front_end_core", self.front_end_core)):
            if record is not None:
                meta[key] = record.to_dict()
        meta["calibration_s"] = float(self.seconds)
        object.__setattr__(self, "latency", self.latency.derive(meta=meta))

    @classmethod
    def from_latency(cls, latency: FittedLatency) -> Calibration:
        """The record a fitted model's ``meta`` holds (its profile keys parsed once, here; an older
        profile's top-level ``front_end_s`` and ``prefill_core_*`` keys become :class:`RunFit`)."""
        meta = latency.meta
        points = step_points(meta.get("points") or ())
        pre = [p for p in points if p.prefill_tokens > 0]
        dec = [p for p in points if p.decode_batch > 0]
        run = _typed(meta, "run_fit", RunFit)
        if run is None and any(meta.get(k) for k in _LEGACY_RUN_KEYS):
            run = RunFit.from_dict({k: meta[k] for k in _LEGACY_RUN_KEYS if k in meta})
        return cls(latency, pre, dec, list(meta.get("handoff_points") or []), _typed(meta, "kv_link", LinkFit),
                   _typed(meta, "cpu_contention", Contention), _typed(meta, "admission", Admission),
                   float(meta.get("calibration_s", 0.0)), _typed(meta, "prefill_stall", PrefillStall), run,
                   _typed(meta, "front_end_core", CoreShare))

    def terms(self) -> list[str]:
        """Profile keys of the terms the replay applies that this calibration holds (a contention
        or run fit of all zeros counts as none; the admission only when charged)."""
        out = []
        if self.kv_link is not None:
            out.append("kv_link")
        if self.contention is not None and (self.contention.prefill or self.contention.decode):
            out.append("cpu_contention")
        if self.prefill_stall is not None and math.isfinite(self.prefill_stall.fixed_s):
            out.append("prefill_stall")
        if self.run_fit is not None and (self.run_fit.front_end_s or self.run_fit.has_prefill_core_load):
            out.append("run_fit")
        if self.front_end_core is not None and (self.front_end_core.base_cores or self.front_end_core.cpu_s_per_request):
            out.append("front_end_core")
        return out

    def without(self, *terms: str) -> Calibration:
        """This calibration less ``terms``: profile keys (:data:`TERM_KEYS`), or one part of the run
        fit, ``run_fit.front_end_s`` or ``run_fit.prefill_core``. What a user drops on purpose where
        a term cannot carry to the deployment asked for (:func:`pdlab.simreal.replay.carry`).
        ValueError naming an unknown term."""
        unknown = sorted(set(terms) - set(TERM_KEYS) - set(DROPPABLE_PARTS))
        if unknown:
            raise ValueError(f"unknown term(s) {', '.join(unknown)}; known: {', '.join(TERM_KEYS + DROPPABLE_PARTS)}")
        changes: dict[str, Any] = {field: None for key, field in _TERM_FIELDS.items()
                                   if key in terms and key != "run_fit"}
        run = None if "run_fit" in terms else self.run_fit
        if run is not None and "run_fit.front_end_s" in terms:
            run = replace(run, front_end_s=0.0)
        if run is not None and "run_fit.prefill_core" in terms:
            run = replace(run, prefill_core_base_cores=0.0, prefill_core_cpu_s_per_request=0.0)
        return replace(self, **changes, run_fit=run)

    @property
    def device(self) -> str | None:
        """The device the calibrated engine ran on, ``"cpu"`` or ``"cuda"``: the profile's ``device``
        (a name, or a GPU profile's ``{"kind": ...}``);
        else ``"cuda"`` where it names a ``gpu``; else, for a server probed on this machine
        (``url`` on 127.0.0.1 or localhost), this machine's (:func:`pdlab.hardware.resolve_device`);
        else None (unknown)."""
        meta = self.latency.meta
        device = meta.get("device")
        if isinstance(device, Mapping):       # a GPU profile's {"kind": ..., "name": ...}
            device = device.get("kind")
        if device:
            return "cpu" if str(device).lower() == "cpu" else "cuda"
        if meta.get("gpu"):
            return "cuda"
        if any(host in str(meta.get("url", "")) for host in ("//127.0.0.1", "//localhost")):
            from pdlab.hardware import resolve_device

            return resolve_device("auto")
        return None

    def to_dict(self) -> dict[str, Any]:
        """The profile JSON (``pdlab-latency-profile/1``, as :func:`pdlab.sim.latency.save_profile` writes)."""
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
                "admission": self.admission and self.admission.to_dict(),
                "prefill_stall": self.prefill_stall and self.prefill_stall.to_dict(),
                "run_fit": self.run_fit and self.run_fit.to_dict(),
                "front_end_core": self.front_end_core and self.front_end_core.to_dict()}


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
    """Read a calibrated profile: the model (checked by ``load_profile``) and its typed terms.

    Raises ValueError for an unknown format, or naming every key that is neither a term the replay
    applies (:data:`TERM_KEYS`, older profiles' run keys included) nor a description
    (:data:`INFO_KEYS`): a term the simulator cannot apply must not be dropped silently."""
    lat = load_profile(path)
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and "profiles" in data:
        raise ValueError(f"{path}: a file of several profiles; load_calibration reads one calibration")
    fmt = data.get("format")
    if fmt not in (None, PROFILE_FORMAT):
        raise ValueError(f"{path}: unknown profile format {fmt!r}; expected {PROFILE_FORMAT}")
    unknown = sorted(k for k in data if k not in TERM_KEYS + INFO_KEYS + _LEGACY_RUN_KEYS)
    if unknown:
        raise ValueError(f"{path}: terms the simulator cannot apply: {', '.join(unknown)} "
                         f"(it applies {', '.join(TERM_KEYS)}; described only: {', '.join(INFO_KEYS)})")
    return Calibration.from_latency(lat)
