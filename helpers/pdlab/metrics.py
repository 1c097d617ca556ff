"""Serving metrics from per-request records: TTFT, TPOT, ITL, E2E, SLO attainment and goodput.

One record type, :class:`RequestRecord`, is produced by the simulator (``pdlab.sim``) and by the
live benchmark client (filled from streamed tokens), so both are analysed by the same code.

Definitions (the same as ``vllm bench serve``, ``vllm/benchmarks/serve.py::calculate_metrics``):

- **TTFT** = time of the first output token − time the request was sent (seconds).
- **TPOT** = (E2E − TTFT) / (output tokens − 1), only for requests with more than one output
  token ("time per output token, excluding the first"). vLLM counts TPOT = 0 for one-token
  outputs when it checks a TPOT SLO; :func:`meets_slo` does the same.
- **ITL** = the gaps between successive output tokens of a request (one value per gap, pooled
  over requests; needs ``token_times_s``).
- **E2E** (vLLM's ``e2el``) = finish time − send time.
- **Goodput** (vLLM ``--goodput ttft:MS tpot:MS e2el:MS``) = requests that completed *and* met
  every given SLO, divided by the benchmark duration (first send → last finish), in requests/s.
- **SLO attainment** = the fraction of *all* requests (failed ones count as misses) that met every
  SLO. DistServe (OSDI'24, arXiv 2401.09670v3 §2) sets an attainment goal, e.g. 90%, and calls
  the highest request rate that reaches it the goodput; divided by the number of GPUs it is the
  *per-GPU goodput*. That rate search lives in ``pdlab.sched.placement``; here
  :func:`per_gpu_goodput_rps` divides a measured goodput by the GPU count.

Times are seconds, on any clock, as long as one record's times share it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RequestRecord",
    "SLO",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "itl_s",
    "percentiles",
    "block_medians",
    "meets_slo",
    "slo_attainment",
    "goodput_rps",
    "per_gpu_goodput_rps",
    "attainment_curve",
    "summarize",
    "records_to_frame",
    "write_records",
    "read_records",
    "json_default",
    "DEFAULT_PERCENTILES",
]

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are absolute seconds on one clock.

    ``token_times_s`` holds the time of every output token (the first included) when known; the
    simulator fills it unless told not to, the live client fills it from streamed chunks. ``prompt_tokens``
    is the client's count, ``server_prompt_tokens`` the server's (live runs; None when unknown). A
    request that failed has ``ok=False`` and an ``error`` message; its latency fields may be None.

    >>> r = RequestRecord(0, arrival_s=1.0, prompt_tokens=100, output_tokens=5, first_token_s=1.5, finish_s=3.5)
    >>> r.ttft_s, r.e2e_s, r.tpot_s      # TPOT = (3.5 − 1.5) / (5 − 1)
    (0.5, 2.5, 0.5)
    """

    request_id: int | str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times_s: Sequence[float] | None = None
    ok: bool = True
    error: str = ""
    instance: str = ""
    preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: The prompt's length as the server counted it (``usage.prompt_tokens``, tokens); None when the
    #: server did not say (simulated runs, or a response without ``usage``).
    server_prompt_tokens: int | None = None
    #: Output tokens each streamed chunk held, aligned with ``token_times_s`` (live runs whose server
    #: sent continuous usage stats); None when unknown, as in simulated runs (one time per token).
    chunk_tokens: Sequence[int] | None = None

    @property
    def ttft_s(self) -> float | None:
        """First token − arrival (None when no token came)."""
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        """Finish − arrival (None when unfinished)."""
        if self.finish_s is None:
            return None
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(E2E − TTFT) / (output tokens − 1); None for ≤ 1 output token or an unfinished request."""
        if self.output_tokens <= 1 or self.finish_s is None or self.first_token_s is None:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def counted_prompt_tokens(self) -> int:
        """The prompt's length as the server counted it (``server_prompt_tokens``), else as the client
        asked (``prompt_tokens``), in tokens."""
        return int(self.server_prompt_tokens if self.server_prompt_tokens is not None else self.prompt_tokens)

    def as_dict(self, with_token_times: bool = False) -> dict[str, Any]:
        """JSON-ready dict, with derived ``ttft_s``, ``tpot_s``, ``e2e_s`` (token times and chunk
        token counts only ``with_token_times``)."""
        d = asdict(self)
        for key in ("token_times_s", "chunk_tokens"):
            value = getattr(self, key)
            d[key] = list(value) if with_token_times and value is not None else None
            if not with_token_times:
                d.pop(key)
        d.update(ttft_s=self.ttft_s, tpot_s=self.tpot_s, e2e_s=self.e2e_s)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        """The record :meth:`as_dict` wrote (derived keys such as ``ttft_s`` are ignored).

        >>> r = RequestRecord(3, arrival_s=1.0, prompt_tokens=8, output_tokens=2, first_token_s=1.5,
        ...                   finish_s=2.0, token_times_s=[1.5, 2.0])
        >>> RequestRecord.from_dict(r.as_dict(with_token_times=True)) == r
        True
        """
        names = {f.name for f in fields(cls)}
        missing = [k for k in ("request_id", "arrival_s", "prompt_tokens", "output_tokens") if k not in d]
        if missing:
            raise ValueError(f"a request record needs {', '.join(missing)}; got keys {sorted(d)}")
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class SLO:
    """Latency objectives in seconds; None means "no objective" for that metric.

    Raises ValueError for a non-positive or non-finite value, or when every field is None.
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        values = {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s}
        for name, value in values.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"SLO {name} must be a positive number of seconds, got {value!r}")
        if all(v is None for v in values.values()):
            raise ValueError("an SLO needs at least one of ttft_s, tpot_s, e2e_s")


def _ok(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.finish_s is not None]


def ttft_s(records: Iterable[RequestRecord]) -> np.ndarray:
    """TTFT of every completed request, seconds."""
    return np.array([r.ttft_s for r in _ok(records)], dtype=float)


def tpot_s(records: Iterable[RequestRecord]) -> np.ndarray:
    """TPOT of every completed request with more than one output token, seconds."""
    return np.array([t for r in _ok(records) if (t := r.tpot_s) is not None], dtype=float)


def e2e_s(records: Iterable[RequestRecord]) -> np.ndarray:
    """End-to-end latency of every completed request, seconds."""
    return np.array([r.e2e_s for r in _ok(records)], dtype=float)


def itl_s(records: Iterable[RequestRecord]) -> np.ndarray:
    """Inter-token latencies pooled over completed requests (needs ``token_times_s``), seconds."""
    gaps = [np.diff(np.asarray(r.token_times_s, dtype=float)) for r in _ok(records)
            if r.token_times_s is not None and len(r.token_times_s) > 1]
    return np.concatenate(gaps) if gaps else np.array([], dtype=float)


def percentiles(values: Sequence[float] | np.ndarray, pcts: Sequence[float] = DEFAULT_PERCENTILES
                ) -> dict[str, float]:
    """``{"p50": ..., "p99": ...}`` (numpy's linear interpolation, like vLLM); NaN when empty.

    >>> percentiles([0.1, 0.2, 0.3, 0.4, 0.5], (50, 90))   # p90 at index 0.9·4 = 3.6
    {'p50': 0.3, 'p90': 0.46}
    """
    arr = np.asarray(values, dtype=float)
    out = {}
    for p in pcts:
        key = f"p{p:g}"
        out[key] = float(np.percentile(arr, p)) if arr.size else float("nan")
    return out


def block_medians(records: Sequence[RequestRecord], blocks: int, metric: str = "tpot") -> list[float]:
    """Median ``metric`` ("ttft" or "tpot", seconds) of each of ``blocks`` consecutive slices of
    ``records`` in arrival order, equal in count up to one: how steady one run's level was.
    NaN for a slice with no value. ValueError for fewer records than blocks or an unknown metric."""
    fn = {"ttft": ttft_s, "tpot": tpot_s}.get(metric)
    if fn is None:
        raise ValueError(f"metric must be ttft or tpot, got {metric!r}")
    if blocks < 1 or len(records) < blocks:
        raise ValueError(f"need at least {max(blocks, 1)} records for {blocks} blocks, got {len(records)}")
    ordered = sorted(records, key=lambda r: r.arrival_s)
    cuts = np.linspace(0, len(ordered), blocks + 1).round().astype(int)
    out = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        values = fn(ordered[lo:hi])
        out.append(float(np.median(values)) if values.size else float("nan"))
    return out


def meets_slo(record: RequestRecord, slo: SLO) -> bool:
    """True when the request completed and met every objective of ``slo``.

    As in vLLM's goodput check, a request with one output token has TPOT 0 (it passes a TPOT SLO).

    >>> r = RequestRecord(0, 0.0, 100, 5, first_token_s=0.3, finish_s=0.7)   # TTFT 0.3 s, TPOT 0.1 s
    >>> meets_slo(r, SLO(ttft_s=0.5, tpot_s=0.1)), meets_slo(r, SLO(ttft_s=0.2))
    (True, False)
    """
    if not record.ok or record.finish_s is None:
        return False
    if slo.ttft_s is not None and (record.ttft_s is None or record.ttft_s > slo.ttft_s):
        return False
    if slo.tpot_s is not None and (record.tpot_s or 0.0) > slo.tpot_s:
        return False
    if slo.e2e_s is not None and record.e2e_s > slo.e2e_s:
        return False
    return True


def slo_attainment(records: Sequence[RequestRecord], slo: SLO) -> float:
    """Fraction of all requests (failed ones count as misses) meeting every SLO; NaN when empty.

    >>> ok = RequestRecord(0, 0.0, 100, 1, first_token_s=0.2, finish_s=0.2)
    >>> failed = RequestRecord(1, 0.0, 100, 1, ok=False, error="HTTP 500")
    >>> slo_attainment([ok, failed], SLO(ttft_s=1.0))
    0.5
    """
    if not records:
        return float("nan")
    return sum(meets_slo(r, slo) for r in records) / len(records)


def _duration_s(records: Sequence[RequestRecord]) -> float:
    done = _ok(records)
    if not done:
        return float("nan")
    start = min(r.arrival_s for r in records)
    end = max(r.finish_s for r in done)
    return end - start


def goodput_rps(records: Sequence[RequestRecord], slo: SLO, duration_s: float | None = None) -> float:
    """Requests/s that completed and met every SLO (vLLM's ``request_goodput``).

    ``duration_s`` defaults to first arrival → last finish, as vLLM's benchmark duration.

    >>> recs = [RequestRecord(i, float(i), 100, 1, first_token_s=i + 0.1, finish_s=i + 0.1) for i in range(4)]
    >>> round(goodput_rps(recs, SLO(ttft_s=0.5)), 4)          # 4 requests from t = 0 to t = 3.1
    1.2903
    >>> goodput_rps(recs, SLO(ttft_s=0.5), duration_s=8.0)    # or over a given duration
    0.5
    """
    duration = _duration_s(records) if duration_s is None else duration_s
    if not duration or not math.isfinite(duration) or duration <= 0:
        return float("nan")
    return sum(meets_slo(r, slo) for r in records) / duration


def per_gpu_goodput_rps(goodput: float, num_gpus: int) -> float:
    """Goodput divided by the number of GPUs serving it (DistServe's per-GPU goodput).

    >>> per_gpu_goodput_rps(6.0, 4)
    1.5
    """
    if num_gpus <= 0:
        raise ValueError(f"num_gpus must be positive, got {num_gpus}")
    return goodput / num_gpus


def attainment_curve(records: Sequence[RequestRecord], metric: str, slos_s: Sequence[float]) -> np.ndarray:
    """Attainment of a single-metric SLO (``"ttft"``, ``"tpot"`` or ``"e2e"``) at each SLO value.

    Useful for "SLO scale" plots: how attainment grows as the objective is relaxed.
    """
    if metric not in ("ttft", "tpot", "e2e"):
        raise ValueError(f"metric must be ttft, tpot or e2e, got {metric!r}")
    return np.array([slo_attainment(records, SLO(**{f"{metric}_s": s})) for s in slos_s])


def summarize(records: Sequence[RequestRecord], slo: SLO | None = None, *, num_gpus: int | None = None,
              pcts: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """One flat dict: counts, throughput, mean and percentiles of TTFT/TPOT/ITL/E2E, attainment, goodput.

    Keys are like ``ttft_p50_s``, ``tpot_mean_s``, ``itl_p99_s``; ``goodput_rps`` and
    ``slo_attainment`` only with an ``slo``; ``per_gpu_goodput_rps`` with ``num_gpus`` as well.
    """
    done = _ok(records)
    duration = _duration_s(records)
    out: dict[str, Any] = {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration,
        "request_throughput_rps": len(done) / duration if done and duration > 0 else float("nan"),
        "output_token_throughput_tps": sum(r.output_tokens for r in done) / duration
        if done and duration > 0 else float("nan"),
    }
    for name, values in (("ttft", ttft_s(done)), ("tpot", tpot_s(done)), ("itl", itl_s(done)),
                         ("e2e", e2e_s(done))):
        out[f"{name}_mean_s"] = float(values.mean()) if values.size else float("nan")
        for key, v in percentiles(values, pcts).items():
            out[f"{name}_{key}_s"] = v
    if slo is not None:
        out["slo_attainment"] = slo_attainment(records, slo)
        out["goodput_rps"] = goodput_rps(records, slo, duration)
        if num_gpus is not None:
            out["per_gpu_goodput_rps"] = per_gpu_goodput_rps(out["goodput_rps"], num_gpus)
    return out


def records_to_frame(records: Sequence[RequestRecord]):
    """A pandas DataFrame, one row per request, with ``ttft_s``, ``tpot_s``, ``e2e_s`` columns."""
    import pandas as pd

    return pd.DataFrame([r.as_dict() for r in records])


def write_records(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """Write ``records`` as JSON lines, token times included (:meth:`RequestRecord.as_dict`);
    creates the parent folder. Read them back with :func:`read_records`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for r in records:
            fh.write(json.dumps(r.as_dict(with_token_times=True), default=json_default) + "\n")
    return path


def read_records(path: str | Path) -> list[RequestRecord]:
    """The records :func:`write_records` (or ``BenchResult.save``) wrote. Raises ValueError naming
    the file and line of a line that is not a record."""
    out = []
    with open(path) as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                out.append(RequestRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: not a request record ({exc})") from None
    return out


def json_default(obj: Any) -> Any:
    """``json.dumps(..., default=json_default)``: numpy scalars as Python numbers, anything else as its str."""
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)
