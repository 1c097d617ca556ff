"""``pdlab sim run``: run a trace or synthetic arrivals through the serving simulator (pdlab.sim);
``pdlab sim compare``: simulated records against measured ones. ``pdlab simulate`` is an alias of
``pdlab sim run`` (the group itself is wired in :mod:`pdlab.cli.sim`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdlab.cli import CLIError, Subcommands, add_slo_arguments, emit, slo_from_args

__all__ = ["register", "add_run_parser", "add_compare_parser", "run", "run_compare"]


RUN_HELP = "simulate colocated, chunked-prefill or disaggregated serving"
RUN_DESCRIPTION = "Run a trace or synthetic arrivals through the serving simulator (pdlab.sim)."


def register(sub: Subcommands) -> None:
    """``pdlab simulate``: the alias of ``pdlab sim run``, kept for the old spelling."""
    add_run_parser(sub, "simulate", help="alias of `pdlab sim run`: " + RUN_HELP,
                   description="`pdlab simulate` is an alias of `pdlab sim run`. " + RUN_DESCRIPTION)


def add_run_parser(sub: Subcommands, name: str = "run", *, help: str = RUN_HELP,
                   description: str = RUN_DESCRIPTION) -> argparse.ArgumentParser:
    """Add the simulator's run command as ``name`` to ``sub`` (``pdlab sim run``, its alias ``pdlab simulate``)."""
    p = sub.add_parser(name, help=help, description=description)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids)")
    src.add_argument("--synthetic", action="store_true", help="synthetic arrivals (see --rate, --requests ...)")
    p.add_argument("--limit", type=int, help="use only the first N requests of the trace")
    p.add_argument("--rate-scale", type=float, default=1.0, help="replay the trace X times faster (default 1)")
    p.add_argument("--rate", type=float, default=1.0, help="synthetic: requests/s (default 1)")
    p.add_argument("--requests", type=int, default=1000, help="synthetic: number of requests (default 1000)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="synthetic: prompt length (default 512)")
    p.add_argument("--output-tokens", type=int, default=64, help="synthetic: output length (default 64)")
    p.add_argument("--lengths", choices=["fixed", "sharegpt"], default="fixed",
                   help="synthetic: fixed lengths or sampled ShareGPT lengths")
    p.add_argument("--arrival", choices=["poisson", "gamma"], default="poisson", help="synthetic arrival process")
    p.add_argument("--cv", type=float, default=1.0, help="gamma arrivals: coefficient of variation (burstiness)")
    p.add_argument("--seed", type=int, default=0, help="synthetic: seed")
    p.add_argument("--mode", choices=["colocated", "chunked", "disaggregated"], required=True,
                   help="colocated: continuous batching without chunked prefill (a step prefills whole prompts or "
                   "decodes); chunked: Sarathi-Serve chunked prefill within --token-budget; disaggregated: prefill and decode instances joined by a "
                   "KV link. With a calibrated --profile, colocated and chunked are the same: the calibrated engine "
                   "is vLLM V1, whose scheduler always chunks prefills within its token budget "
                   "(--max-num-batched-tokens, here --token-budget), and both simulate that scheduler")
    p.add_argument("--gpu", help="catalog GPU, e.g. h100-sxm (not needed with a calibrated --profile)")
    p.add_argument("--model", help="catalog model, e.g. llama-3-70b (not needed with a calibrated --profile)")
    p.add_argument("--instances", type=int, help="colocated/chunked: number of instances, replicas of the calibrated "
                   "engine with a calibrated --profile (default 1)")
    p.add_argument("--prefill", type=int, help="disaggregated: prefill instances (default 1)")
    p.add_argument("--decode", type=int, help="disaggregated: decode instances (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallelism per instance (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline parallelism per instance (default 1)")
    p.add_argument("--decode-tp", type=int, help="disaggregated: TP of decode instances (default --tp)")
    p.add_argument("--decode-pp", type=int, help="disaggregated: PP of decode instances (default --pp)")
    bw = p.add_mutually_exclusive_group()
    bw.add_argument("--link", help="disaggregated: catalog link for KV transfer, e.g. ib-ndr (default: instant)")
    bw.add_argument("--bandwidth-gbs", type=float, help="disaggregated: KV link bandwidth in GB/s")
    p.add_argument("--layerwise-overlap", action="store_true", help="overlap KV transfer with prefill, layer by layer")
    p.add_argument("--token-budget", type=int, default=2048, help="chunked, and every engine of a calibrated --profile: tokens per "
                   "step, vLLM's --max-num-batched-tokens (default 2048)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="running requests per instance (default 256)")
    p.add_argument("--dispatch", choices=["round_robin", "shortest_queue", "least_loaded"],
                   help="dispatch of arrivals (default: round_robin, shortest_queue when disaggregated)")
    p.add_argument("--profile", help="latency profile JSON (DistServe-style fit) instead of the roofline model; "
                   "one written by `pdlab sim calibrate` or lab 05 (format pdlab-latency-profile/1) simulates any "
                   "deployment of the calibrated engine (--instances and --dispatch, --mode chunked, --prefill and "
                   "--decode) with every term that carries to it (pdlab.simreal.replay.carry); a term that cannot "
                   "carry is an error that names it")
    p.add_argument("--front-end-shares-core", action="store_true",
                   help="calibrated --profile: each engine's front end (its API server) runs on the engine's core, "
                   "as two replicas on a two-core host: the profile's front_end_core term slows every engine")
    p.add_argument("--without", default="",
                   help="calibrated --profile: comma-separated terms to leave out on purpose (e.g. cpu_contention, "
                   "run_fit.prefill_core), where one cannot carry to the deployment asked for")
    p.add_argument("--kv-capacity-tokens", type=int, default=131072,
                   help="calibrated --profile: KV tokens each instance holds (default 131072)")
    add_slo_arguments(p)
    p.add_argument("--records", help="write per-request records to this JSONL file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def add_compare_parser(sub: Subcommands) -> argparse.ArgumentParser:
    """Add ``compare``: simulated records against measured ones (:func:`pdlab.simreal.validation.validation_table`)."""
    p = sub.add_parser("compare", help="simulated request records against measured ones: medians, p90s, KS, TOST",
                       description="Compare two per-request record files (JSONL of pdlab.metrics.RequestRecord, as "
                       "`pdlab sim run --records` writes them and `pdlab bench` as build/bench/NAME-records.jsonl): per metric the medians "
                       "and p90s with their errors in %, the KS test and the TOST equivalence verdict of the "
                       "median ratio within --margin (pdlab.simreal.validation).")
    p.add_argument("--sim", required=True, help="simulated records (JSONL)")
    p.add_argument("--real", required=True, help="measured records (JSONL)")
    p.add_argument("--metrics", default="ttft_s,tpot_s", help="comma-separated: ttft_s, tpot_s, e2e_s, itl_s "
                   "(default ttft_s,tpot_s)")
    p.add_argument("--margin", type=float, default=0.10, help="equivalence margin of the median ratio (default 0.10)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_compare)
    return p


def run_compare(args: argparse.Namespace) -> int:
    """``pdlab sim compare``: one row per metric; exit 0 whether or not the two agree."""
    import math

    from pdlab.metrics import read_records
    from pdlab.simreal.validation import validation_table

    if not (0 < args.margin < 1):
        raise CLIError(f"--margin must be between 0 and 1, got {args.margin}")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    sim, real = read_records(args.sim), read_records(args.real)
    if not sim or not real:
        raise CLIError(f"no records in {args.sim if not sim else args.real}")
    table = validation_table({"run": (sim, real)}, metrics=metrics, margin=args.margin, seed=args.seed)
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items() if k != "run"}
            for row in table.to_dict("records")]
    if not rows:
        raise CLIError(f"neither file has samples of {', '.join(metrics)}")
    lines = [f"{len(sim)} simulated vs {len(real)} measured requests (margin {args.margin:.0%}):"]
    lines += [f"  {r['metric']:<7} median {r['median_sim']:.4g} vs {r['median_real']:.4g} s "
              f"({r['median_err_pct']:+.1f} %), p90 {r['p90_sim']:.4g} vs {r['p90_real']:.4g} s "
              f"({r['p90_err_pct']:+.1f} %), KS p {r['ks_p']:.3f}, "
              f"{'equivalent' if r['equivalent'] else 'not shown equivalent'}" for r in rows]
    emit(rows, args.json, "\n".join(lines))
    return 0


def _requests(args: argparse.Namespace):
    from pdlab.workloads import read_mooncake_jsonl, scale_rate, synthetic_requests

    if args.rate_scale <= 0:
        raise CLIError(f"--rate-scale must be positive, got {args.rate_scale}")
    if args.trace:
        reqs = read_mooncake_jsonl(args.trace, limit=args.limit)
        return scale_rate(reqs, args.rate_scale) if args.rate_scale != 1.0 else reqs
    if args.requests < 1:
        raise CLIError(f"--requests must be >= 1, got {args.requests}")
    if args.lengths == "sharegpt":
        reqs = synthetic_requests(args.requests, args.rate, lengths="sharegpt", arrival=args.arrival, cv=args.cv,
                                  seed=args.seed)
    else:
        reqs = synthetic_requests(args.requests, args.rate, prompt_tokens=args.prompt_tokens,
                                  output_tokens=args.output_tokens, arrival=args.arrival, cv=args.cv, seed=args.seed)
    return scale_rate(reqs, args.rate_scale) if args.rate_scale != 1.0 else reqs


def _calibration(args: argparse.Namespace):
    """The profile's calibration when it holds terms beyond the coefficients, else None (``--without``
    applied); CLIError for options a calibrated engine cannot take."""
    from pdlab.simreal.calibration import load_calibration

    try:
        cal = load_calibration(args.profile)
        cal = cal.without(*[t.strip() for t in args.without.split(",") if t.strip()])
    except (OSError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    if not cal.terms():
        if args.front_end_shares_core:
            raise CLIError(f"--front-end-shares-core needs the profile's front_end_core term; {args.profile} has none")
        return None
    lat = cal.latency
    engine = f"TP{lat.tp}×PP{lat.pp}"
    for flag, tp, pp in (("--tp/--pp", args.tp, args.pp),
                         ("--decode-tp/--decode-pp", args.decode_tp or args.tp, args.decode_pp or args.pp)):
        if (tp, pp) != (lat.tp, lat.pp):
            raise CLIError(f"{flag}: {args.profile} calibrates one {engine} engine (its step-time rows); "
                           f"a TP{tp}×PP{pp} engine is another engine: calibrate it")
    if args.link or args.bandwidth_gbs or args.layerwise_overlap:
        raise CLIError(f"--link/--bandwidth-gbs/--layerwise-overlap: the KV link of {args.profile} is its measured "
                       "kv_link (a latency and a time per token, the hand-off end to end); they describe a catalog "
                       "link in bytes/s")
    return cal


def _deployment(args: argparse.Namespace):
    """The :class:`pdlab.simreal.replay.Deployment` the placement flags ask for."""
    from pdlab.simreal.replay import Deployment

    return Deployment(args.mode, instances=args.instances or 1, prefill=args.prefill or 1, decode=args.decode or 1,
                      dispatch=args.dispatch, front_end_shares_core=args.front_end_shares_core)


#: Words for a calibrated engine's device: what one engine runs on.
_UNITS = {"cpu": ("core", "cores"), "cuda": ("GPU", "GPUs"), None: ("engine", "engines")}


def _replay(args: argparse.Namespace, cal, reqs):
    """Records of the calibrated replay (:func:`pdlab.simreal.replay.replay`), the deployment, how
    each term carried (:func:`pdlab.simreal.replay.carry`), wall seconds."""
    import time

    from pdlab.simreal.replay import carry, replay

    t0 = time.perf_counter()
    try:
        dep = _deployment(args)
        how = carry(cal, dep)
        recs = replay(reqs, dep, cal, kv_capacity_tokens=args.kv_capacity_tokens,
                      token_budget=args.token_budget, max_num_seqs=args.max_num_seqs)
    except ValueError as exc:
        raise CLIError(f"{args.profile}: {exc}") from None
    return recs, dep, how, time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from pdlab.metrics import summarize
    from pdlab.sim import simulate
    from pdlab.sim.latency import load_profile

    disagg = args.mode == "disaggregated"
    if disagg and args.instances is not None:
        raise CLIError("--instances is for colocated/chunked; use --prefill N --decode M with disaggregated")
    if not disagg and (args.prefill is not None or args.decode is not None):
        raise CLIError("--prefill/--decode need --mode disaggregated; use --instances N otherwise")
    if not disagg and (args.link or args.bandwidth_gbs):
        raise CLIError("--link/--bandwidth-gbs need --mode disaggregated")
    slo = slo_from_args(args)
    if not args.profile and (args.front_end_shares_core or args.without):
        raise CLIError("--front-end-shares-core and --without need a calibrated --profile")
    cal = _calibration(args) if args.profile else None
    if cal is None and not (args.gpu and args.model):
        raise CLIError("--gpu and --model are needed (only a calibrated --profile runs without them)")
    latency = None
    if args.profile:
        prof_path = args.profile

        def latency(tp: int, pp: int):
            return load_profile(prof_path, tp=tp, pp=pp)
    kwargs = dict(tp=args.tp, pp=args.pp, latency=latency, token_budget=args.token_budget,
                  max_num_seqs=args.max_num_seqs, dispatch=args.dispatch)
    if disagg:
        kwargs.update(prefill=args.prefill or 1, decode=args.decode or 1, decode_tp=args.decode_tp,
                      decode_pp=args.decode_pp, link=args.link,
                      link_bandwidth_bytes_per_s=args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None,
                      layerwise_overlap=args.layerwise_overlap)
    else:
        kwargs.update(instances=args.instances or 1)
    reqs = _requests(args)
    units, device = ("GPU", "GPUs"), None
    if cal is not None:
        records, dep, how, sim_wall_s = _replay(args, cal, reqs)
        device = cal.device
        units = _UNITS[device]
        s = {**summarize(records, slo, num_gpus=dep.engines), "num_gpus": dep.engines if units[0] == "GPU" else None,
             "preemptions": sum(r.preemptions for r in records)}
    else:
        result = simulate(reqs, args.mode, args.gpu, args.model, record_token_times=bool(args.records), **kwargs)
        records, sim_wall_s, s = result.records, result.sim_wall_s, result.summary(slo)
    keys = ["requests", "completed", "failed", "num_gpus", "duration_s", "request_throughput_rps",
            "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p90_s",
            "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "preemptions"]
    if args.records:
        keys += ["itl_p50_s", "itl_p99_s"]
    payload = {k: s[k] for k in keys}
    payload.update(slo_attainment=s.get("slo_attainment"), goodput_rps=s.get("goodput_rps"),
                   per_gpu_goodput_rps=s.get("per_gpu_goodput_rps"), sim_wall_s=sim_wall_s,
                   mode=args.mode, gpu=args.gpu, model=args.model,
                   calibrated_terms=cal.terms() if cal is not None else None)
    if cal is not None:
        per_engine = payload.pop("per_gpu_goodput_rps")
        payload.update(deployment=str(dep), engines=dep.engines, device=device, carried_terms=how.applied,
                       unused_terms=how.unused, **{f"per_{units[0].lower()}_goodput_rps": per_engine})
        if units[0] == "core":
            payload["num_cores"] = dep.engines
    if args.records:
        path = Path(args.records)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            for rec in records:
                fh.write(json.dumps(rec.as_dict(with_token_times=True)) + "\n")
        payload["records_path"] = str(path)
    n = dep.engines if cal is not None else payload["num_gpus"]
    where = f"{dep}: " if cal is not None else f"{args.mode}: "
    text = (f"{where}{payload['completed']}/{payload['requests']} requests on {n} {units[n != 1]}, "
            f"TTFT p50/p99 {payload['ttft_p50_s']:.3f}/{payload['ttft_p99_s']:.3f} s, "
            f"TPOT p50/p99 {payload['tpot_p50_s'] * 1e3:.1f}/{payload['tpot_p99_s'] * 1e3:.1f} ms")
    if slo is not None:
        text += f", SLO attainment {payload['slo_attainment']:.1%}, goodput {payload['goodput_rps']:.3f} req/s"
    text += f" (simulated in {sim_wall_s:.2f} s)"
    if cal is not None:
        text += "".join(f"\n  {term}: {why}" for term, why in how.applied.items())
        text += "".join(f"\n  {term} (not used): {why}" for term, why in how.unused.items())
    emit(payload, args.json, text)
    return 0
