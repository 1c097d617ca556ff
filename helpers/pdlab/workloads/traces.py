"""Request traces: the :class:`Request` record, Mooncake JSONL (read and write), ShareGPT lengths.

Every reader returns a list of :class:`Request` (arrival time in seconds, prompt and output token
counts, optional prefix-block hashes), sorted by arrival. Readers validate their input: a
malformed line raises :class:`TraceFormatError` naming the file and the line number.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdlab.paths import data_dir

__all__ = [
    "Request",
    "TraceFormatError",
    "read_mooncake_jsonl",
    "write_mooncake_jsonl",
    "read_sharegpt_lengths",
    "mooncake_trace_path",
    "sharegpt_lengths_path",
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


def write_mooncake_jsonl(requests: Sequence[Request], path: str | Path) -> Path:
    """Write requests as Mooncake JSONL (one object per line, timestamps in integer ms, sorted)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for r in sorted(requests, key=lambda r: (r.arrival_s, r.request_id)):
            fh.write(json.dumps({"timestamp": int(round(r.arrival_s * 1000)), "input_length": r.prompt_tokens,
                                 "output_length": r.output_tokens, "hash_ids": list(r.hash_ids)}) + "\n")
    return path
