"""``pdlab router``: the request router between colocated and disaggregated serving.

``pdlab router policies`` lists the routing policies and predictors; ``pdlab router serve`` runs
the router (aiohttp, 127.0.0.1) in front of colocated vLLM servers and a P/D proxy.
"""

from __future__ import annotations

import argparse

from pdlab.cli import CLIError, Subcommands, add_actions, add_slo_arguments, emit, slo_from_args

__all__ = ["register", "run_policies", "run_serve"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("router", help="route requests to colocated or disaggregated serving", description=__doc__)
    rsub = add_actions(p, "router")
    ls = rsub.add_parser("policies", help="list routing policies and output-length predictors")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=run_policies)
    s = rsub.add_parser("serve", help="run the router (until Ctrl-C)")
    s.add_argument("--port", type=int, default=8500, help="port on 127.0.0.1 (default 8500)")
    s.add_argument("--colocated", nargs="*", default=[], help="colocated server URLs")
    s.add_argument("--disaggregated", help="URL of the P/D proxy (python -m pdlab.serve.proxy)")
    s.add_argument("--policy", default="threshold", help="all-colocated, all-disaggregated, threshold, slo-aware")
    s.add_argument("--prompt-threshold", type=int, default=2048, help="threshold: prompt tokens (default 2048)")
    s.add_argument("--predictor", default="history", choices=["constant", "history"])
    s.add_argument("--constant-output", type=float, default=182.0, help="constant predictor: tokens (default 182)")
    s.add_argument("--tokenizer", help="model folder whose tokenizer counts prompt tokens")
    add_slo_arguments(s, what="slo-aware: ")
    s.add_argument("--latency-profile", help="slo-aware: latency profile JSON (pdlab.sim.load_profile) of the servers")
    s.add_argument("--json", action="store_true", help="print the configuration as JSON before serving")
    s.set_defaults(func=run_serve)


def run_policies(args: argparse.Namespace) -> int:
    from pdlab.router.policies import ROUTING_POLICIES

    rows = [{"policy": name, "about": (cls.__doc__ or "").strip().splitlines()[0]} for name, cls in ROUTING_POLICIES.items()]
    rows += [{"predictor": "constant", "about": "a fixed output length"},
             {"predictor": "history", "about": "mean output of recent similar requests (learned)"}]
    emit(rows, args.json, "\n".join(f"{r.get('policy') or r.get('predictor'):<18} {r['about']}" for r in rows))
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from pdlab.router.policies import LoadEstimator, make_policy, make_predictor
    from pdlab.router.server import RouterConfig, make_router_app, prompt_counter

    if not args.colocated and not args.disaggregated:
        raise CLIError("give --colocated URL(s) and/or --disaggregated URL")
    kwargs: dict = {}
    estimator = None
    if args.policy == "threshold":
        kwargs["prompt_threshold"] = args.prompt_threshold
    elif args.policy == "slo-aware":
        slo = slo_from_args(args)
        if slo is None:
            raise CLIError("slo-aware needs --slo-ttft and/or --slo-tpot")
        if not args.latency_profile:
            raise CLIError("slo-aware needs --latency-profile (a fitted latency profile of the servers)")
        from pdlab.sim.latency import load_profile

        lm = load_profile(args.latency_profile)
        estimator = LoadEstimator(lm, lm, lm)
        kwargs["slo"] = slo
    policy = make_policy(args.policy, **kwargs)
    predictor = make_predictor("constant", tokens=args.constant_output) if args.predictor == "constant" \
        else make_predictor("history", default=args.constant_output)
    config = RouterConfig([u.rstrip("/") for u in args.colocated],
                          args.disaggregated.rstrip("/") if args.disaggregated else None, policy, predictor,
                          estimator=estimator, count_prompt=prompt_counter(args.tokenizer))
    emit({"port": args.port, "policy": policy.describe(), "predictor": predictor.name,
          "colocated": config.colocated_urls, "disaggregated": config.disaggregated_url}, args.json,
         f"router on http://127.0.0.1:{args.port}: {policy!r}, predictor {predictor.name}")
    web.run_app(make_router_app(config), host="127.0.0.1", port=args.port, access_log=None, print=None)
    return 0
