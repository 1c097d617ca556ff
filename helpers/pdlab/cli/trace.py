"""``pdlab trace stats``: request count, average lengths, duration and prefix-cache hit ratio of a trace."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from pdlab.cli import CLIError, Subcommands, add_actions, emit
from pdlab.kvcache import BLOCK_TOKENS, cache_hit_ratio
from pdlab.workloads import Request, TraceFormatError, read_mooncake_jsonl

__all__ = ["load_trace", "register", "trace_stats", "run_stats"]


def load_trace(path: Path, skip_bad: bool = False) -> tuple[list[Request], list[int]]:
    """Requests of a Mooncake JSONL trace via :func:`pdlab.workloads.read_mooncake_jsonl`.

    Without ``skip_bad`` the first malformed line raises :class:`TraceFormatError` (file:line).
    With it, malformed lines are skipped and their 1-based numbers returned: the shared reader is
    re-run on the rest of the file after each bad line (cheap for a handful of bad lines).
    """
    if not skip_bad:
        return read_mooncake_jsonl(path), []
    lines = path.read_text().splitlines(keepends=True)
    good: list[Request] = []
    bad: list[int] = []
    start = 0
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / path.name

        def read(chunk: list[str]) -> list[Request]:
            if not any(line.strip() for line in chunk):
                return []
            part.write_text("".join(chunk))
            return read_mooncake_jsonl(part)

        while start < len(lines):
            try:
                good += read(lines[start:])
                break
            except TraceFormatError as exc:
                if exc.line < 1:
                    break
                good += read(lines[start:start + exc.line - 1])
                bad.append(start + exc.line)
                start += exc.line
    return [replace(r, request_id=i) for i, r in enumerate(good)], bad


def register(sub: Subcommands) -> None:
    p = sub.add_parser("trace", help="statistics of a Mooncake-format request trace", description=__doc__)
    tsub = add_actions(p, "trace")
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
    ts = [r.arrival_s for r in requests]
    stats = cache_hit_ratio(requests, cache_blocks, block_tokens)
    return {
        "requests": n,
        "avg_input_tokens": round(sum(r.prompt_tokens for r in requests) / n, 1),
        "avg_output_tokens": round(sum(r.output_tokens for r in requests) / n, 1),
        "duration_s": round(max(ts) - min(ts), 3),
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
    requests, bad_lines = load_trace(path, args.skip_bad)
    if not requests:
        raise CLIError(f"{path}: no valid requests ({len(bad_lines)} malformed line(s) skipped)")
    skipped = len(bad_lines)
    d = trace_stats(requests, cache_blocks=args.cache_blocks, block_tokens=args.block_tokens)
    d["path"] = str(path)
    d["skipped_lines"] = skipped
    d["skipped_line_numbers"] = bad_lines[:100]
    cache = "unlimited" if args.cache_blocks is None else f"{args.cache_blocks:,} blocks"
    text = (f"{path.name}: {d['requests']:,} requests over {d['duration_s']:,.1f} s; "
            f"avg input {d['avg_input_tokens']:,} / output {d['avg_output_tokens']:,} tokens; "
            f"prefix-cache hit ratio {d['prefix_cache_hit_ratio']:.3f} ({cache} cache of "
            f"{args.block_tokens}-token blocks)")
    if skipped:
        text += f"; skipped {skipped} malformed line(s)"
    emit(d, args.json, text)
    return 0
