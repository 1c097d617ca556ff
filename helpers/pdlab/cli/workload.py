"""``pdlab workload agentic``: generate a multi-turn agentic tool-calling trace (Mooncake JSONL).

Defaults are calibrated to Mooncake's tool & agent trace (≈ 8.6k input / 182 output tokens,
≈ 59 % cache ratio; see ``pdlab.workloads.agentic``). ``--text`` adds real chat messages to every line
(token counts measured with ``--tokenizer`` when given); the file stays a valid Mooncake trace,
so ``pdlab trace stats FILE`` works on it either way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdlab.cli import CLIError, Subcommands, add_actions, emit

__all__ = ["register", "run_agentic"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("workload", help="generate synthetic workloads (agentic sessions)", description=__doc__)
    wsub = add_actions(p, "workload", metavar="KIND")
    a = wsub.add_parser("agentic", help="multi-turn tool-calling sessions with shared, growing prefixes")
    a.add_argument("--sessions", type=int, default=256, help="number of sessions (default 256)")
    a.add_argument("--turns", type=float, help="mean turns per session (default 2.5, geometric)")
    a.add_argument("--max-turns", type=int, help="turns cap per session (default 12)")
    a.add_argument("--session-rate", type=float, help="new sessions per second (default 6.56/2.5)")
    a.add_argument("--scale", type=float, default=1.0,
                   help="multiply every token length (e.g. 0.125 for a tiny CPU model); default 1")
    a.add_argument("--max-context", type=int, help="context cap in tokens (default 32768 × scale)")
    a.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    a.add_argument("--out", type=Path, required=True, help="output JSONL path")
    a.add_argument("--text", action="store_true", help="add chat messages with real text to every line")
    a.add_argument("--tokenizer", help="model folder whose tokenizer counts and renders the text (with --text)")
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=run_agentic)


def run_agentic(args: argparse.Namespace) -> int:
    from pdlab.workloads.agentic import AgenticConfig, TextRenderer, generate_agentic, text_requests

    if args.sessions < 1:
        raise CLIError(f"--sessions must be >= 1, got {args.sessions}")
    if args.scale <= 0:
        raise CLIError(f"--scale must be positive, got {args.scale}")
    if args.tokenizer and not args.text:
        raise CLIError("--tokenizer only makes sense with --text")
    if args.tokenizer and not Path(args.tokenizer).exists():
        raise CLIError(f"no tokenizer folder at {args.tokenizer}")
    if args.out.suffix != ".jsonl":
        raise CLIError(f"--out must end in .jsonl, got {args.out}")
    config = AgenticConfig()
    if args.scale != 1.0:
        config = config.scaled(args.scale, max_context_tokens=args.max_context)
    over = {"sessions": args.sessions}
    for field_name, value in (("turns_mean", args.turns), ("max_turns", args.max_turns),
                              ("session_rate_per_s", args.session_rate)):
        if value is not None:
            over[field_name] = value
    if args.max_context is not None and args.scale == 1.0:
        over["max_context_tokens"] = args.max_context
    if "turns_mean" in over and "max_turns" not in over and over["turns_mean"] > config.max_turns:
        over["max_turns"] = int(over["turns_mean"]) * 4
    workload = generate_agentic(config, seed=args.seed, **over)
    if args.text:
        rows = text_requests(workload, TextRenderer(args.tokenizer))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as fh:
            for r in sorted(rows, key=lambda r: (r["arrival_s"], r["session_id"], r["turn"])):
                fh.write(json.dumps({"timestamp": int(round(r["arrival_s"] * 1000)),
                                     "input_length": r["prompt_tokens"], "output_length": r["max_tokens"],
                                     "hash_ids": list(r["hash_ids"]), "session_id": r["session_id"],
                                     "turn": r["turn"], "think_time_s": round(r["think_time_s"], 3),
                                     "messages": r["messages"]}) + "\n")
    else:
        workload.to_mooncake_jsonl(args.out)
    from pdlab.cli.trace import trace_stats
    from pdlab.workloads import read_mooncake_jsonl

    d = trace_stats(read_mooncake_jsonl(args.out))
    d.update(path=str(args.out), sessions=workload.num_sessions, seed=args.seed, text=args.text,
             tokenizer=args.tokenizer)
    text = (f"wrote {args.out}: {d['requests']:,} requests in {d['sessions']:,} sessions over {d['duration_s']:,.1f} s; "
            f"avg input {d['avg_input_tokens']:,} / output {d['avg_output_tokens']:,} tokens; "
            f"prefix-cache hit ratio {d['prefix_cache_hit_ratio']:.3f}")
    emit(d, args.json, text)
    return 0
