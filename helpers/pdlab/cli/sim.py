"""``pdlab sim``, the simulator's command group: ``run`` and ``compare`` (:mod:`pdlab.cli.simulate`) and
``calibrate``: fit the simulator's latency model to a live server's measured step times."""

from __future__ import annotations

import argparse
import math

from pdlab.cli import CLIError, Subcommands, add_actions, emit

__all__ = ["register", "run_calibrate"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def register(sub: Subcommands) -> None:
    """``pdlab sim``: ``run`` (:mod:`pdlab.cli.simulate`, also spelled ``pdlab simulate``), ``calibrate``, ``compare``."""
    from pdlab.cli.simulate import add_compare_parser, add_run_parser

    p = sub.add_parser("sim", help="the simulator: run it, calibrate it on a live server, compare it with one",
                       description="The simulator: `pdlab sim run` (alias `pdlab simulate`), `pdlab sim calibrate`, "
                       "`pdlab sim compare`.")
    ssub = add_actions(p, "sim", metavar="ACTION")
    add_run_parser(ssub)
    c = ssub.add_parser("calibrate", help="probe a live server, fit prefill/decode step times, write a profile",
                        description=__doc__ + "\n\nThe profile is read by `pdlab sim run --profile PATH` and "
                        "pdlab.sim.latency.load_profile.")
    c.add_argument("--url", required=True, help="server to probe for prefill (and decode), e.g. http://127.0.0.1:8100")
    c.add_argument("--out", required=True, help="profile JSON to write")
    c.add_argument("--decode-url", help="probe decode on this server instead (disaggregated: the decode server)")
    c.add_argument("--proxy-url", help="disaggregation proxy in front of --url/--decode-url: also fit the KV hand-off")
    c.add_argument("--plan", default="ci", choices=["smoke", "ci", "full"], help="probe sizes (default ci)")
    c.add_argument("--prefill-lengths", type=_ints, help="override: prompt lengths for prefill probes, e.g. 16,256,1024")
    c.add_argument("--decode-batches", type=_ints, help="override: concurrent streams for decode probes, e.g. 1,8,32")
    c.add_argument("--decode-prompts", type=_ints, help="override: prompt lengths of decode probes, e.g. 32,256")
    c.add_argument("--decode-tokens", type=int, help="override: output tokens per decode probe stream")
    c.add_argument("--repeats", type=int, help="override: samples per point (median kept)")
    c.add_argument("--max-probe-tokens", type=int, help="override: the most prompt tokens (b·p) one decode probe holds")
    c.add_argument("--tokenizer", help="model folder whose tokenizer builds prompts (default: the server's)")
    c.add_argument("--device", choices=["cpu", "cuda"],
                   help="what the probed engine runs on, written to the profile (a CPU engine's simulations count "
                   "cores; default: this machine's for a server on 127.0.0.1 or localhost, else not written)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=run_calibrate)
    add_compare_parser(ssub)


def run_calibrate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from pdlab.serve.client.bench import ClientOptions
    from pdlab.simreal.calibration import save_calibration
    from pdlab.simreal.probes import PROBE_PLANS, calibrate

    overrides = {k: v for k, v in (("prefill_lengths", args.prefill_lengths), ("decode_batches", args.decode_batches),
                                   ("decode_prompts", args.decode_prompts), ("decode_tokens", args.decode_tokens),
                                   ("repeats", args.repeats), ("max_probe_tokens", args.max_probe_tokens))
                 if v is not None}
    plan = replace(PROBE_PLANS[args.plan], **overrides)
    try:
        plan.check()
    except ValueError as exc:
        raise CLIError(f"probe plan: {exc}") from None
    device = args.device
    if device is None and any(host in args.url for host in ("//127.0.0.1", "//localhost")):
        from pdlab.hardware import resolve_device

        device = resolve_device("auto")
    try:
        res = calibrate(args.url, plan=plan, decode_url=args.decode_url, proxy_url=args.proxy_url, seed=args.seed,
                        client=ClientOptions(tokenizer=args.tokenizer), meta={"device": device} if device else None)
    except OSError as exc:
        raise CLIError(f"cannot probe {args.url}: {exc}") from exc
    except RuntimeError as exc:
        raise CLIError(str(exc)) from exc
    path = save_calibration(res, args.out)
    lat = res.latency
    fit = lat.meta["fit"]
    payload = {"profile": str(path), **res.as_dict(),
               "points": {"prefill": [p.to_dict() for p in res.prefill_points],
                          "decode": [p.to_dict() for p in res.decode_points], "handoff": list(res.handoff_points)}}
    ap, bp, cp = lat.prefill
    ad, bd, cd = lat.decode
    text = [f"wrote {path} (calibrated in {res.seconds:.1f} s)",
            f"  prefill = {ap * 1e3:.3f} ms + {bp * 1e6:.3f} µs·Σl + {cp * 1e9:.4f} ns·Σl²   "
            f"(R² {fit['prefill']['r2']:.3f}, mean |err| {fit['prefill']['mape']:.1%}, {fit['prefill']['points']} points)",
            f"  decode  = {ad * 1e3:.3f} ms + {bd * 1e6:.4f} µs·Σctx + {cd * 1e6:.3f} µs·batch   "
            f"(R² {fit['decode']['r2']:.3f}, mean |err| {fit['decode']['mape']:.1%}, {fit['decode']['points']} points)"]
    if res.kv_link is not None:
        link = res.kv_link
        text.append(f"  KV hand-off = {link.latency_s * 1e3:.3f} ms + {link.s_per_token * 1e6:.3f} µs/token")
    if res.prefill_stall is not None:
        stall = res.prefill_stall
        text.append(f"  prefill stall: a prompt holds {stall.streams} decoding streams up by its per-token terms + "
                    f"{stall.fixed_s * 1e3:.3f} ms; {stall.off_engine_s * 1e3:.3f} ms of a_p is off-engine "
                    f"({stall.injections} prompts)")
    text.append(f"use it: pdlab sim run --profile {path} ...")
    emit({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in payload.items()}, args.json,
         "\n".join(text))
    return 0
