"""``pdlab place``: DistServe's placement search (Alg. 1 high / Alg. 2 low node affinity) for a model,
or, with ``--calibration``, the search over deployments of a calibrated engine (replicas and xPyD)."""

from __future__ import annotations

import argparse

from pdlab.cli import CLIError, Subcommands, add_slo_arguments, emit, slo_from_args
from pdlab.sched.deploy_export import EXPORT_TARGETS, ROUTER_MODES

__all__ = ["register", "run", "run_calibrated"]


class _ExportAction(argparse.Action):
    """``--export TARGET DIR``, repeatable; an unknown TARGET is a usage error (exit 2) listing the targets."""

    def __call__(self, parser, namespace, values, option_string=None):
        target, directory = values
        if target not in EXPORT_TARGETS:
            parser.error(f"argument --export: invalid choice: {target!r} (choose from {', '.join(EXPORT_TARGETS)})")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), (target, directory)])


def register(sub: Subcommands) -> None:
    p = sub.add_parser("place", help="choose prefill/decode TP, PP and replicas for per-GPU goodput (DistServe)",
                       description=__doc__)
    p.add_argument("--model", help="catalog model, e.g. opt-66b (needed without --calibration)")
    p.add_argument("--gpu", help="catalog GPU, e.g. a100-80gb (needed without --calibration)")
    p.add_argument("--nodes", type=int, help="number of nodes N (needed without --calibration)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node M (needed without --calibration)")
    cal = p.add_argument_group("a calibrated engine (pdlab.sched.placement.place_calibrated)")
    cal.add_argument("--calibration", metavar="PROFILE",
                     help="calibrated profile JSON (`pdlab sim calibrate`, lab 05): search deployments of that "
                     "engine, 1..N colocated replicas and every xPyD with x + y <= N, each simulated with the "
                     "calibration's terms that carry to it")
    cal.add_argument("--engines", type=int, help="--calibration: the most engines a deployment may run (one per "
                     "core on a CPU, one per GPU)")
    cal.add_argument("--dispatch", choices=["round_robin", "shortest_queue", "least_loaded"],
                     help="--calibration: dispatch of arrivals (default: round_robin, shortest_queue when disaggregated)")
    cal.add_argument("--front-end-shares-core", action="store_true",
                     help="--calibration: each engine's front end runs on the engine's core (front_end_core term)")
    cal.add_argument("--without", default="", help="--calibration: comma-separated terms to leave out on purpose")
    cal.add_argument("--kv-capacity-tokens", type=int, default=131072,
                     help="--calibration: KV tokens each engine holds (default 131072)")
    cal.add_argument("--token-budget", type=int, default=2048,
                     help="--calibration: the engine's --max-num-batched-tokens (default 2048)")
    cal.add_argument("--max-num-seqs", type=int, default=256, help="--calibration: running requests per engine "
                     "(default 256)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="sharegpt, sharegpt-stratified, fixed-512-64, fixed-P-O, mooncake-conversation, mooncake-synthetic")
    src.add_argument("--trace", help="Mooncake JSONL trace whose lengths are sampled")
    add_slo_arguments(p, required=True)
    p.add_argument("--attainment", type=float, default=0.9, help="SLO attainment goal (default 0.9)")
    p.add_argument("--affinity", choices=["high", "low"], default="high",
                   help="high: Alg. 1 (fast cross-node network); low: Alg. 2 (pairs inside a node)")
    p.add_argument("--cross-node-gbps", type=float,
                   help="cross-node bandwidth per node, Gbit/s (default: KV transfer free, as DistServe's simulator)")
    p.add_argument("--rate", type=float, help="target request rate (default: fill the cluster)")
    p.add_argument("--max-instance-gpus", type=int, help="Alg. 1: largest instance, GPUs (default: --gpus-per-node)")
    p.add_argument("--profile", choices=["smoke", "ci", "full"], default="ci", help="search size (default ci)")
    p.add_argument("--workers", type=int, help="processes (default: all cores)")
    p.add_argument("--export", nargs=2, action=_ExportAction, metavar=("TARGET", "DIR"),
                   help=f"also write the placement for a cluster into DIR; TARGET: {', '.join(EXPORT_TARGETS)} "
                        "(repeat for both; nothing is written unless every export validates)")
    p.add_argument("--export-model", help="Hugging Face repo the exported workers serve (default: the catalog's)")
    p.add_argument("--export-router-mode", choices=ROUTER_MODES, default="kv",
                   help="Dynamo frontend --router-mode in the export (default kv)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run_calibrated(args: argparse.Namespace) -> int:
    """``pdlab place --calibration``: the deployment of at most ``--engines`` calibrated engines with
    the highest goodput (:func:`pdlab.sched.placement.place_calibrated`)."""
    from pdlab.sched.placement import SEARCH_PROFILES, place_calibrated
    from pdlab.simreal.calibration import load_calibration

    other = [flag for flag, used in (("--model", args.model), ("--gpu", args.gpu), ("--nodes", args.nodes),
                                     ("--gpus-per-node", args.gpus_per_node), ("--affinity", args.affinity != "high"),
                                     ("--cross-node-gbps", args.cross_node_gbps), ("--rate", args.rate),
                                     ("--max-instance-gpus", args.max_instance_gpus), ("--export", args.export))
             if used]
    if other:
        raise CLIError(f"{', '.join(other)}: for a catalog model's placement; --calibration searches deployments of "
                       "the calibrated engine (give --engines)")
    if args.engines is None or args.engines < 1:
        raise CLIError("--calibration needs --engines N >= 1 (the most engines a deployment may run)")
    if not 0 < args.attainment <= 1:
        raise CLIError(f"--attainment must be in (0, 1], got {args.attainment}")
    if args.trace and not args.trace.endswith(".jsonl"):
        raise CLIError(f"--trace expects a Mooncake .jsonl file, got {args.trace}")
    try:
        cal = load_calibration(args.calibration)
        cal = cal.without(*[t.strip() for t in args.without.split(",") if t.strip()])
        result = place_calibrated(cal, args.engines, args.workload or args.trace, slo_from_args(args),
                                  attainment=args.attainment, settings=SEARCH_PROFILES[args.profile],
                                  dispatch=args.dispatch, front_end_shares_core=args.front_end_shares_core,
                                  kv_capacity_tokens=args.kv_capacity_tokens, token_budget=args.token_budget,
                                  max_num_seqs=args.max_num_seqs)
    except (OSError, ValueError) as exc:
        raise CLIError(f"{args.calibration}: {exc}") from None
    one, many = {"cpu": ("core", "cores"), "cuda": ("GPU", "GPUs")}.get(result.device, ("engine", "engines"))
    d = result.as_dict()
    d.update(calibration=args.calibration, workload=args.workload or args.trace, slo_ttft_s=args.slo_ttft,
             slo_tpot_s=args.slo_tpot, profile=args.profile, unit=one)
    best = result.best
    lines = [f"best of the deployments on at most {args.engines} {many if args.engines != 1 else one}: "
             f"{best.deployment}, {best.goodput_rps:.3f} req/s = {best.per_engine_goodput_rps:.3f} req/s per {one} "
             f"at {args.attainment:.0%} attainment (searched in {result.search_wall_s:.1f} s)"]
    for c in result.candidates:
        lines.append(f"  {c.deployment}: skipped, {c.skipped}" if c.skipped else
                     f"  {c.deployment}: {c.goodput_rps:.3f} req/s on {c.deployment.engines} "
                     f"{many if c.deployment.engines != 1 else one}")
    emit(d, args.json, "\n".join(lines))
    return 0


def run(args: argparse.Namespace) -> int:
    from pdlab.sched.placement import SEARCH_PROFILES, place

    if args.calibration:
        return run_calibrated(args)
    missing = [flag for flag, v in (("--model", args.model), ("--gpu", args.gpu), ("--nodes", args.nodes),
                                    ("--gpus-per-node", args.gpus_per_node)) if v is None]
    if missing:
        raise CLIError(f"{', '.join(missing)} needed (or --calibration PROFILE --engines N for a calibrated engine)")
    calibrated_only = [flag for flag, used in (("--engines", args.engines is not None), ("--dispatch", args.dispatch),
                                               ("--front-end-shares-core", args.front_end_shares_core),
                                               ("--without", args.without)) if used]
    if calibrated_only:
        raise CLIError(f"{', '.join(calibrated_only)} need --calibration")
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise CLIError("--nodes and --gpus-per-node must be >= 1")
    if not 0 < args.attainment <= 1:
        raise CLIError(f"--attainment must be in (0, 1], got {args.attainment}")
    if args.cross_node_gbps is not None and args.cross_node_gbps <= 0:
        raise CLIError("--cross-node-gbps must be positive")
    slo = slo_from_args(args)
    workload = args.workload or args.trace
    if args.trace and not args.trace.endswith(".jsonl"):
        raise CLIError(f"--trace expects a Mooncake .jsonl file, got {args.trace}")
    kwargs = dict(attainment=args.attainment, rate_rps=args.rate, settings=SEARCH_PROFILES[args.profile],
                  workers=args.workers,
                  cross_node_bytes_per_s=args.cross_node_gbps * 1e9 / 8 if args.cross_node_gbps else None)
    if args.max_instance_gpus:
        kwargs["max_instance_gpus"] = args.max_instance_gpus
    result = place(args.model, args.gpu, args.nodes, args.gpus_per_node, workload, slo, affinity=args.affinity,
                   **kwargs)
    d = result.as_dict(with_candidates=False)
    d["candidates"] = [{"phase": c.phase, "prefill": str(c.prefill) if c.prefill else None,
                        "decode": str(c.decode) if c.decode else None, "num_gpus": c.num_gpus,
                        "goodput_rps": c.goodput_rps, "per_gpu_goodput_rps": c.per_gpu_goodput_rps, **c.detail}
                       for c in result.candidates]
    d.update(model=args.model, gpu=args.gpu, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
             workload=workload, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot, profile=args.profile)
    text = (f"{args.model} on {args.nodes}×{args.gpus_per_node} {args.gpu} ({args.affinity} affinity): "
            f"prefill {result.prefill} ×{result.num_prefill}, decode {result.decode} ×{result.num_decode}; "
            f"{result.cluster_goodput_rps:.2f} req/s on {result.total_gpus} GPUs = "
            f"{result.per_gpu_goodput_rps:.3f} req/s per GPU at {args.attainment:.0%} attainment "
            f"(searched in {result.search_wall_s:.1f} s)")
    if result.bandwidth_limited:
        text += "; rate capped by the cross-node bandwidth"
    if args.export:
        from pdlab.sched.deploy_export import ExportOptions, export_placement

        options = ExportOptions(args.model, model_id=args.export_model, router_mode=args.export_router_mode,
                                gpus_per_node=args.gpus_per_node, cluster_gpus=args.nodes * args.gpus_per_node)
        exports = export_placement(result, args.export, options)
        d["exports"] = [e.as_dict() for e in exports]
        text += "".join(f"\nwrote {e.target} ({e.gpus} GPUs): {', '.join(str(f) for f in e.files)}; checked: "
                        + "; ".join(e.checks) for e in exports)
    emit(d, args.json, text)
    return 0
