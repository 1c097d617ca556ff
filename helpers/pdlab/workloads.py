"""Workloads: request traces (Mooncake JSONL, ShareGPT lengths) and synthetic arrival processes.

Every loader and generator returns a list of :class:`Request` (arrival time in seconds, prompt
and output token counts, optional prefix-block hashes), sorted by arrival. Readers validate their
input: a malformed line raises :class:`TraceFormatError` naming the file and the line number.

Modules built on top of this one add generators (for example multi-turn agentic sessions);
keep each generator a plain function ``(... , seed) -> list[Request]``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pdlab.paths import data_dir

__all__ = [
    "Request",
    "TraceFormatError",
    "read_mooncake_jsonl",
    "read_sharegpt_lengths",
    "mooncake_trace_path",
    "sharegpt_lengths_path",
    "poisson_arrivals",
    "gamma_arrivals",
    "make_requests",
    "synthetic_requests",
    "scale_rate",
    "with_rate",
    "named_workload",
    "WORKLOADS",
]


@dataclass(frozen=True, slots=True)
class Request:
    """One request to serve: arrival (seconds from the start), token counts, prefix-block hashes."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


class TraceFormatError(ValueError):
    """A trace file has a malformed line; the message names the file and the 1-based line number."""

    def __init__(self, path: str | Path, line: int, problem: str):
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}:{line}: {problem}")


def mooncake_trace_path(name: str = "conversation") -> Path:
    """Path of a bundled Mooncake FAST'25 trace: ``conversation`` or ``synthetic``."""
    path = data_dir() / "traces" / "mooncake" / f"{name}_trace.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no Mooncake trace {name!r} at {path}")
    return path


def sharegpt_lengths_path() -> Path:
    """Path of the bundled ShareGPT prompt/output lengths (Llama-2 tokenizer, ≤ 2048 tokens)."""
    return data_dir() / "traces" / "sharegpt_lengths" / "sharegpt_lengths_llama2.csv"


def _int_field(obj: dict, key: str, path: Path, lineno: int, minimum: int) -> int:
    if key not in obj:
        raise TraceFormatError(path, lineno, f"missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value != int(value):
        raise TraceFormatError(path, lineno, f"field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceFormatError(path, lineno, f"field {key!r} must be >= {minimum}, got {value!r}")
    return int(value)


def read_mooncake_jsonl(path: str | Path, *, limit: int | None = None) -> list[Request]:
    """Read a Mooncake trace: one JSON object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and ``hash_ids`` (list of ints). Blank lines are skipped.

    Arrivals are returned in seconds from the trace start. Raises :class:`TraceFormatError`
    (file and line) for invalid JSON, a missing or non-integer field, a negative length, a zero
    output length, or a timestamp earlier than the previous line's.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no trace file at {path}")
    out: list[Request] = []
    last_ts = -math.inf
    with open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, lineno, f"invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(path, lineno, "expected a JSON object")
            ts = obj.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
                raise TraceFormatError(path, lineno, f"field 'timestamp' must be a number >= 0 (ms), got {ts!r}")
            if ts < last_ts:
                raise TraceFormatError(path, lineno, f"timestamp {ts} is earlier than the previous line's {last_ts}")
            last_ts = ts
            prompt = _int_field(obj, "input_length", path, lineno, 1)
            output = _int_field(obj, "output_length", path, lineno, 1)
            hashes = obj.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                       for h in hashes):
                raise TraceFormatError(path, lineno, "field 'hash_ids' must be a list of integers")
            out.append(Request(len(out), ts / 1000.0, prompt, output, tuple(hashes)))
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise TraceFormatError(path, 0, "the trace holds no requests")
    return out


def read_sharegpt_lengths(path: str | Path | None = None) -> np.ndarray:
    """ShareGPT prompt/output token counts as an ``(n, 2)`` int array from a CSV with the header
    ``num_prefill_tokens,num_decode_tokens``. Malformed rows raise :class:`TraceFormatError`."""
    path = Path(path) if path is not None else sharegpt_lengths_path()
    if not path.exists():
        raise FileNotFoundError(f"no lengths file at {path}")
    rows: list[tuple[int, int]] = []
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["num_prefill_tokens", "num_decode_tokens"]:
            raise TraceFormatError(path, 1, "expected header 'num_prefill_tokens,num_decode_tokens'")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                p, o = int(row[0]), int(row[1])
            except (ValueError, IndexError):
                raise TraceFormatError(path, lineno, f"expected two integers, got {row!r}") from None
            if p < 1 or o < 1:
                raise TraceFormatError(path, lineno, f"token counts must be >= 1, got {p}, {o}")
            rows.append((p, o))
    if not rows:
        raise TraceFormatError(path, 0, "the file holds no rows")
    return np.array(rows, dtype=np.int64)


def _check_rate(rate_rps: float) -> None:
    if not (isinstance(rate_rps, int | float) and math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate_rps!r}")


def poisson_arrivals(rate_rps: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s) of a Poisson process: exponential gaps with mean 1/rate; first at the first gap."""
    return gamma_arrivals(rate_rps, n, cv=1.0, seed=seed)


def gamma_arrivals(rate_rps: float, n: int, *, cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s) with gamma-distributed gaps of mean 1/rate and coefficient of variation ``cv``.

    ``cv = 1`` is Poisson; ``cv > 1`` is burstier. Shape k = 1/cv², scale = 1/(rate·k) (the
    ``--burstiness`` of ``vllm bench serve`` is k).
    """
    _check_rate(rate_rps)
    if cv <= 0:
        raise ValueError(f"cv must be positive, got {cv}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    return np.cumsum(gaps)


def make_requests(arrivals_s: Sequence[float], prompt_tokens: Sequence[int] | int,
                  output_tokens: Sequence[int] | int) -> list[Request]:
    """Zip arrival times with token counts (scalars are broadcast) into :class:`Request` objects."""
    n = len(arrivals_s)
    p = np.broadcast_to(np.asarray(prompt_tokens, dtype=np.int64), (n,))
    o = np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,))
    if n and (p.min() < 1 or o.min() < 1):
        raise ValueError("prompt and output token counts must be >= 1")
    return [Request(i, float(a), int(pi), int(oi)) for i, (a, pi, oi) in enumerate(zip(arrivals_s, p, o, strict=False))]


def synthetic_requests(n: int, rate_rps: float, *, prompt_tokens: int | Sequence[int] | None = None,
                       output_tokens: int | Sequence[int] | None = None, lengths: str | None = None,
                       arrival: str = "poisson", cv: float = 1.0, seed: int = 0) -> list[Request]:
    """``n`` requests at ``rate_rps`` with Poisson (``arrival="poisson"``) or gamma arrivals.

    Lengths: fixed (``prompt_tokens=512, output_tokens=64``), given per request, or sampled with
    replacement from ``lengths="sharegpt"`` (DistServe's chatbot workload).
    """
    if arrival not in ("poisson", "gamma"):
        raise ValueError(f"arrival must be poisson or gamma, got {arrival!r}")
    arrivals = gamma_arrivals(rate_rps, n, cv=cv if arrival == "gamma" else 1.0, seed=seed)
    if lengths is not None:
        if lengths != "sharegpt":
            raise ValueError(f"unknown lengths source {lengths!r}; known: sharegpt")
        table = read_sharegpt_lengths()
        idx = np.random.default_rng(seed + 1).integers(0, len(table), size=n)
        prompt_tokens, output_tokens = table[idx, 0], table[idx, 1]
    if prompt_tokens is None or output_tokens is None:
        raise ValueError("give prompt_tokens and output_tokens, or lengths='sharegpt'")
    return make_requests(arrivals, prompt_tokens, output_tokens)


def scale_rate(requests: Sequence[Request], factor: float) -> list[Request]:
    """Compress time by ``factor`` (2 → twice the request rate): arrival times divided by ``factor``."""
    if not factor > 0:
        raise ValueError(f"rate scale must be positive, got {factor}")
    return [replace(r, arrival_s=r.arrival_s / factor) for r in requests]


def with_rate(requests: Sequence[Request], rate_rps: float, *, seed: int = 0, arrival: str = "poisson",
              cv: float = 1.0) -> list[Request]:
    """Keep the token counts of ``requests`` but redraw arrivals at ``rate_rps`` (Poisson or gamma)."""
    _check_rate(rate_rps)
    arrivals = gamma_arrivals(rate_rps, len(requests), cv=cv if arrival == "gamma" else 1.0, seed=seed)
    return [replace(r, request_id=i, arrival_s=float(a)) for i, (r, a) in enumerate(zip(requests, arrivals, strict=False))]


def _sharegpt(n: int, rate: float, seed: int) -> list[Request]:
    return synthetic_requests(n, rate, lengths="sharegpt", seed=seed)


def _fixed(prompt: int, output: int) -> Callable[[int, float, int], list[Request]]:
    def gen(n: int, rate: float, seed: int) -> list[Request]:
        return synthetic_requests(n, rate, prompt_tokens=prompt, output_tokens=output, seed=seed)
    return gen


def _mooncake(name: str) -> Callable[[int, float, int], list[Request]]:
    def gen(n: int, rate: float, seed: int) -> list[Request]:
        reqs = read_mooncake_jsonl(mooncake_trace_path(name))
        idx = np.random.default_rng(seed + 1).integers(0, len(reqs), size=n)
        return with_rate([reqs[i] for i in idx], rate, seed=seed)
    return gen


#: Named workloads for ``pdlab place --workload``: ``f(n, rate_rps, seed) -> list[Request]``
#: (lengths from the source, Poisson arrivals at the rate).
WORKLOADS: dict[str, Callable[[int, float, int], list[Request]]] = {
    "sharegpt": _sharegpt,
    "fixed-512-64": _fixed(512, 64),
    "mooncake-conversation": _mooncake("conversation"),
    "mooncake-synthetic": _mooncake("synthetic"),
}


def named_workload(name: str, n: int, rate_rps: float, seed: int = 0) -> list[Request]:
    """``n`` requests of a named workload (see :data:`WORKLOADS`) at ``rate_rps``.

    A name ``fixed-P-O`` (e.g. ``fixed-2048-128``) gives fixed lengths P in / O out.
    """
    if name in WORKLOADS:
        return WORKLOADS[name](n, rate_rps, seed)
    parts = name.split("-")
    if len(parts) == 3 and parts[0] == "fixed" and parts[1].isdigit() and parts[2].isdigit():
        return _fixed(int(parts[1]), int(parts[2]))(n, rate_rps, seed)
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}, fixed-P-O")
