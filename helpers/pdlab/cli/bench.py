"""``pdlab bench``: stream a workload to an OpenAI-compatible server; TTFT/TPOT/ITL/E2E and goodput."""

from __future__ import annotations

import argparse
import math

from pdlab.cli import CLIError, Subcommands, add_slo_arguments, emit, slo_from_args

__all__ = ["register", "run"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("bench", help="benchmark a live server (async streaming client)", description=__doc__)
    p.add_argument("--url", required=True, help="server or proxy base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--workload", default="fixed-256-64",
                   help="interference | fixed-P-O | sharegpt | sharegpt-stratified | mooncake-conversation | mooncake-synthetic")
    p.add_argument("--rate", type=float, required=True, help="mean request rate, requests/s")
    p.add_argument("--duration", type=float, help="seconds of arrivals (requests = rate × duration)")
    p.add_argument("--num-requests", type=int, help="number of requests (instead of --duration)")
    p.add_argument("--arrival", default="poisson", choices=["poisson", "gamma"])
    p.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of gaps (gamma; >1 = bursty)")
    p.add_argument("--trace-schedule", action="store_true", help="mooncake-*: keep the trace's own timestamps")
    p.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    p.add_argument("--model", help="model name to send (default: the server's)")
    p.add_argument("--tokenizer", help="model folder whose tokenizer builds the prompts (default: the server's)")
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--max-prompt-tokens", type=int, default=3072, help="clip prompts (default 3072)")
    p.add_argument("--max-output-tokens", type=int, default=512)
    add_slo_arguments(p, e2e=True)
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--max-retries", type=int, default=0,
                   help="send a request refused with 503 + Retry-After again after that time, up to N times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="bench", help="file prefix under build/bench/")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pdlab.serve.client.bench import ClientOptions, build_workload, format_summary, run_bench

    if args.rate <= 0:
        raise CLIError(f"--rate must be positive, got {args.rate}")
    if args.duration is None and args.num_requests is None:
        raise CLIError("give --duration SECONDS or --num-requests N")
    slo = slo_from_args(args)
    requests = build_workload(args.workload, rate_rps=args.rate, n=args.num_requests, duration_s=args.duration,
                              arrival=args.arrival, cv=args.cv, seed=args.seed,
                              max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens,
                              use_trace_schedule=args.trace_schedule)
    try:
        client = ClientOptions(endpoint=args.endpoint, model=args.model, tokenizer=args.tokenizer,
                               request_timeout_s=args.timeout, max_retries=args.max_retries)
        result = run_bench(args.url, requests, slo=slo, client=client, max_concurrency=args.max_concurrency,
                           progress=not args.no_progress and not args.json, seed=args.seed, save=args.name)
    except OSError as exc:  # server not reachable for /v1/models, tokenizer missing ...
        raise CLIError(f"cannot benchmark {args.url}: {exc}") from exc
    summary = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.summary.items()}
    emit({"config": result.config, "summary": summary, "files": result.paths}, args.json,
         format_summary(result.summary, f"{args.workload} at {args.rate:g} req/s") +
         f"\nrecords: {result.paths['records']}\nsummary: {result.paths['summary']}")
    return 0
