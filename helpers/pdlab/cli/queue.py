"""``pdlab queue``: DistServe §3.1 M/D/1 average TTFT — one GPU, 2-way inter-op, 2-way intra-op."""

from __future__ import annotations

import argparse

from pdlab.cli import CLIError, Subcommands, emit

__all__ = ["register", "run"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("queue", help="M/D/1 average TTFT of a prefill instance (DistServe §3.1)",
                       description=__doc__)
    p.add_argument("--rate", type=float, required=True, help="arrival rate R, requests/s (Poisson)")
    p.add_argument("--service-time", type=float, required=True, help="prefill execution time D on one GPU, s")
    p.add_argument("--speedup", type=float, default=1.5, help="intra-op (TP=2) speedup K, 1 < K < 2 (default 1.5)")
    p.add_argument("--simulate", action="store_true", help="also measure the averages with pdlab.sim")
    p.add_argument("--requests", type=int, default=100_000, help="simulated requests (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated arrivals")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pdlab.sched.queueing import avg_ttft_all, simulate_all

    if args.rate <= 0 or args.service_time <= 0:
        raise CLIError("--rate and --service-time must be positive")
    if args.speedup <= 0:
        raise CLIError("--speedup must be positive")
    if args.requests < 1:
        raise CLIError("--requests must be >= 1")
    closed = avg_ttft_all(args.rate, args.service_time, args.speedup)
    payload: dict = {"rate_rps": args.rate, "service_time_s": args.service_time, "speedup": args.speedup,
                     "utilisation": args.rate * args.service_time,
                     "avg_ttft_s": {k: (None if v == float("inf") else v) for k, v in closed.items()}}
    lines = [f"R={args.rate:g} req/s, D={args.service_time:g} s, K={args.speedup:g} (R·D = {args.rate * args.service_time:.3f})"]
    for k, v in closed.items():
        lines.append(f"  {k:<9} avg TTFT {v:.3f} s" if v != float("inf") else f"  {k:<9} unstable (queue grows)")
    if args.simulate:
        unstable = [k for k, v in closed.items() if v == float("inf")]
        if unstable:
            raise CLIError(f"cannot simulate an unstable queue ({', '.join(unstable)}): lower --rate")
        sim = simulate_all(args.rate, args.service_time, args.speedup, requests=args.requests, seed=args.seed)
        payload["simulated_avg_ttft_s"] = sim
        payload["simulated_requests"] = args.requests
        lines.append(f"simulated ({args.requests:,} requests, seed {args.seed}):")
        for k, v in sim.items():
            lines.append(f"  {k:<9} avg TTFT {v:.3f} s ({(v / closed[k] - 1) * 100:+.1f}% vs closed form)")
    emit(payload, args.json, "\n".join(lines))
    return 0
