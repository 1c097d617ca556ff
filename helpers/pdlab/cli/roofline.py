"""``pdlab roofline``: analytic roofline of a prefill or decode step, or ``measure`` this device.

Analytic: ``pdlab roofline --gpu h100-sxm --model llama-3-8b --phase decode --batch 1 --context 1024``.
Measured: ``pdlab roofline measure --device cuda --out data/profiles/h100.json`` (a few minutes at most
on a GPU; under a minute on a 2-core CPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pdlab.cli import CLIError, Subcommands, emit

__all__ = ["register", "run"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("roofline", help="roofline of prefill/decode (analytic) or measure this device",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["measure"],
                   help="'measure' times this device; without it, the analytic roofline is printed")
    a = p.add_argument_group("analytic")
    a.add_argument("--gpu", help="catalog GPU name, e.g. h100-sxm")
    src = a.add_mutually_exclusive_group()
    src.add_argument("--model", help="catalog model name, e.g. llama-3-8b")
    src.add_argument("--config", help="path to an HF config.json (or its folder)")
    a.add_argument("--phase", choices=["prefill", "decode"])
    a.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    a.add_argument("--tokens", type=int, default=2048, help="prefill: new tokens per sequence (default 2048)")
    a.add_argument("--prefix", type=int, default=0, help="prefill: cached prefix tokens per sequence (default 0)")
    a.add_argument("--context", type=int, default=1024, help="decode: context tokens per sequence (default 1024)")
    a.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    a.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8", "fp32"], help="weights dtype")
    a.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp8", "fp32"], help="KV-cache dtype (default: --dtype)")
    a.add_argument("--ops", action="store_true", help="also print the per-operator table")
    m = p.add_argument_group("measure")
    m.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    m.add_argument("--size", choices=["smoke", "ci", "full"],
                   help="measurement sizes (default: full on a GPU, ci on the CPU)")
    m.add_argument("--out", type=Path, help="write the profile JSON here (e.g. data/profiles/h100-sxm.json)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return _measure(args) if args.action == "measure" else _analytic(args)


def _analytic(args: argparse.Namespace) -> int:
    from pdlab.hardware import get_gpu
    from pdlab.models import get_model, load_config
    from pdlab.roofline.analytic import analyze

    missing = [flag for flag, v in (("--gpu", args.gpu), ("--model or --config", args.model or args.config),
                                    ("--phase", args.phase)) if not v]
    if missing:
        raise CLIError(f"the analytic roofline needs {', '.join(missing)} (or use `pdlab roofline measure`)")
    gpu = get_gpu(args.gpu)
    model = get_model(args.model) if args.model else load_config(args.config)
    r = analyze(model, gpu, args.phase, batch=args.batch, tokens=args.tokens, context=args.context,
                prefix=args.prefix, tp=args.tp, dtype=args.dtype, kv_dtype=args.kv_dtype)
    payload = r.summary()
    if args.ops:
        payload["ops"] = r.table()
    shape = (f"{args.batch}×{args.tokens} tokens" + (f" after {args.prefix} cached" if args.prefix else "")
             if args.phase == "prefill" else f"{args.batch} seqs at context {args.context}")
    text = (f"{model.name} {args.phase} ({shape}) on {gpu.name}, tp={args.tp}, {args.dtype}:\n"
            f"  {r.flops / 1e12:.4g} TFLOP, {r.bytes / 1e9:.4g} GB per GPU "
            f"(weights {r.weight_bytes / 1e9:.4g} GB, KV {r.kv_bytes / 1e9:.4g} GB)\n"
            f"  AI {r.arithmetic_intensity:.4g} FLOP/B vs ridge {r.ridge_point:.4g} → {r.bound}-bound\n"
            f"  step {r.time_s * 1e3:.4g} ms (roofline bound {r.roofline_time_s * 1e3:.4g} ms), "
            f"MFU {r.mfu:.1%}, MBU {r.mbu:.1%}")
    if args.ops:
        text += "\n" + "\n".join(f"  {o['name']:<15} {o['flops'] / 1e9:12.4g} GFLOP {o['bytes'] / 1e6:12.4g} MB "
                                 f"AI {o['arithmetic_intensity']:9.3g} {o['time_s'] * 1e6:10.4g} µs {o['bound']}"
                                 for o in payload["ops"])
    emit(payload, args.json, text)
    return 0


def _measure(args: argparse.Namespace) -> int:
    import sys

    from pdlab.roofline.measure import measure_device, save_device_profile

    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    profile = measure_device(args.device, args.size, progress=progress)
    if args.out:
        if args.out.suffix != ".json":
            raise CLIError(f"--out must name a .json file, got {args.out}")
        save_device_profile(profile, args.out)
    d = profile.as_dict()
    payload = {"device": {"kind": profile.kind, "name": profile.name, "count": profile.count},
               "torch": profile.torch, "date": profile.date, "size": profile.size,
               "matmul_flops_per_s": profile.matmul_flops_per_s,
               "memory_bytes_per_s": profile.memory_bytes_per_s, "memory": profile.memory,
               "layer": profile.layer, "layer_points": d["layer_points"],
               "catalog_gpu": profile.catalog_gpu, "seconds": profile.seconds,
               "out": str(args.out) if args.out else None}
    lines = [f"{profile.name} ({profile.kind}), torch {profile.torch}, {profile.seconds:.1f} s",
             "  matmul: " + ", ".join(f"{k} {v / 1e12:.4g} TFLOP/s" for k, v in profile.matmul_flops_per_s.items()),
             f"  memory: {profile.memory_bytes_per_s / 1e9:.4g} GB/s",
             f"  layer {profile.layer['name']} ({profile.layer['dtype']}):"]
    for p in profile.layer_points:
        lines.append(f"    {p.phase:<7} B={p.batch:<4} S={p.tokens:<5} C={p.context:<5} AI {p.arithmetic_intensity:8.3g} "
                     f"{p.time_s * 1e3:9.3f} ms, {p.achieved_flops_per_s / 1e12:.4g} TFLOP/s = "
                     f"{p.fraction_of_roofline:.0%} of the roof (predicted {p.predicted_time_s * 1e3:.3f} ms)")
    if args.out:
        lines.append(f"  saved {args.out}")
    emit(payload, args.json, "\n".join(lines))
    return 0
