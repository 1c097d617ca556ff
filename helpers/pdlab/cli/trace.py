"""``pdlab trace stats``: request count, average lengths, duration and prefix-cache hit ratio of a trace."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from pdlab.cli import CLIError, emit
from pdlab.kvcache import BLOCK_TOKENS, cache_hit_ratio


@dataclass(frozen=True)
class _Req:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int]


def _load(path: Path, skip_bad: bool) -> tuple[list[_Req], int]:
    """Temporary reader until pdlab.workloads lands (errors name file and line)."""
    out: list[_Req] = []
    bad = 0
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                req = _Req(float(d["timestamp"]), int(d["input_length"]), int(d["output_length"]),
                           [int(h) for h in d["hash_ids"]])
                if req.input_length < 0 or req.output_length < 0:
                    raise ValueError("negative length")
            except (ValueError, KeyError, TypeError) as exc:
                if skip_bad:
                    bad += 1
                    continue
                raise CLIError(f"{path}:{lineno}: malformed trace line ({exc})") from None
            out.append(req)
    return out, bad


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="statistics of a Mooncake-format request trace", description=__doc__)
    tsub = p.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    s = tsub.add_parser("stats", help="requests, average lengths, duration, prefix-cache hit ratio")
    s.add_argument("path", help="JSONL trace (timestamp ms, input_length, output_length, hash_ids)")
    s.add_argument("--cache-blocks", type=int, default=None,
                   help="LRU cache capacity in blocks (default: unlimited)")
    s.add_argument("--block-tokens", type=int, default=BLOCK_TOKENS, help="tokens per hash block (512)")
    s.add_argument("--skip-bad", action="store_true", help="skip malformed lines and report how many")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=run_stats)


def trace_stats(requests, *, cache_blocks: int | None = None, block_tokens: int = BLOCK_TOKENS) -> dict:
    """The statistics ``pdlab trace stats`` prints, from loaded requests."""
    n = len(requests)
    if n == 0:
        raise CLIError("the trace holds no requests")
    ts = [r.timestamp_ms for r in requests]
    stats = cache_hit_ratio(requests, cache_blocks, block_tokens)
    return {
        "requests": n,
        "avg_input_tokens": round(sum(r.input_length for r in requests) / n, 1),
        "avg_output_tokens": round(sum(r.output_length for r in requests) / n, 1),
        "duration_s": round((max(ts) - min(ts)) / 1000.0, 3),
        "prefix_cache_hit_ratio": round(stats.ratio, 3),
        "cache_blocks": cache_blocks,
        "block_tokens": block_tokens,
    }


def run_stats(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        raise CLIError(f"no such trace file: {path}")
    if args.cache_blocks is not None and args.cache_blocks < 0:
        raise CLIError(f"--cache-blocks must be >= 0, got {args.cache_blocks}")
    if args.block_tokens <= 0:
        raise CLIError(f"--block-tokens must be > 0, got {args.block_tokens}")
    requests, skipped = _load(path, args.skip_bad)
    d = trace_stats(requests, cache_blocks=args.cache_blocks, block_tokens=args.block_tokens)
    d["path"] = str(path)
    d["skipped_lines"] = skipped
    cache = "unlimited" if args.cache_blocks is None else f"{args.cache_blocks:,} blocks"
    text = (f"{path.name}: {d['requests']:,} requests over {d['duration_s']:,.1f} s; "
            f"avg input {d['avg_input_tokens']:,} / output {d['avg_output_tokens']:,} tokens; "
            f"prefix-cache hit ratio {d['prefix_cache_hit_ratio']:.3f} ({cache} cache of "
            f"{args.block_tokens}-token blocks)")
    if skipped:
        text += f"; skipped {skipped} malformed line(s)"
    emit(d, args.json, text)
    return 0
