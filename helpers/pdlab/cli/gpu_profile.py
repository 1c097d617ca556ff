"""``pdlab gpu-profile``: roofline, KV hand-off paths and step times of this GPU (or CPU), as JSON.

``pdlab gpu-profile --size full --out data/profiles`` on a GPU box (under 8 minutes on one H200)
writes ``<gpu>-gpu-profile.json`` (everything, read by notebooks 01 and 03),
``<gpu>-latency.json`` (``pdlab sim run --profile``) and ``<gpu>-roofline.json``.
``--size smoke`` runs in seconds (on a CPU: tiny fp32 model, CUDA paths listed as skipped).
``scripts/gpu_profile.sh`` wraps this command; ``python -m pdlab.cli.gpu_profile`` runs it without
loading the other subcommands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdlab.cli import CLIError, Subcommands, emit

__all__ = ["register", "run", "main"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", choices=["smoke", "full"], default="smoke",
                   help="smoke: seconds (CI); full: Llama-3-8B-shaped, nb03's sizes to 1 GiB (default smoke)")
    p.add_argument("--out", type=Path, help="folder for the JSON files (e.g. data/profiles)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--parts", default="roofline,handoff,steps",
                   help="comma-separated parts to measure (default: roofline,handoff,steps)")
    p.add_argument("--name", help="file name stem (default: the catalog GPU key, e.g. h200, or cpu)")
    p.add_argument("--strict", action="store_true", help="stop at the first failing part (default: record it, go on)")
    p.add_argument("--annotate", type=Path, metavar="FILE",
                   help="measure nothing: add AIConfigurator's predictions to an existing *-gpu-profile.json "
                        "(needs the optional 'aic' extra; runs on a CPU)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")


def register(sub: Subcommands) -> None:
    p = sub.add_parser("gpu-profile", help="measure roofline, KV hand-off and step times; write JSON",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pdlab.peers.aic_compare import add_aiconfigurator
    from pdlab.simreal.gpu_profile import PARTS, handoff_rows, roofline_rows, run_gpu_profile, step_rows

    if args.annotate:
        return _annotate(args)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise CLIError(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    command = "pdlab gpu-profile " + " ".join(getattr(args, "argv", None) or sys.argv[1:])
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    profile = run_gpu_profile(args.size, args.out, device=args.device, parts=parts, name=args.name,
                              command=command.strip(), keep_going=not args.strict, progress=progress,
                              annotate=lambda gp: add_aiconfigurator(gp, progress=progress))
    lines = [f"{profile.label}: {profile.data['seconds']:.1f} s"]
    for r in roofline_rows(profile):
        spec = f" (datasheet {r['datasheet']:.4g}, {r['measured / datasheet']:.0%})" if r["datasheet"] else ""
        lines.append(f"  {r['quantity']:<28} {r['measured']:.4g}{spec}")
    for r in handoff_rows(profile):
        if r["best GB/s"] is None:
            lines.append(f"  {r['kind']:<18} skipped: {r['skipped because']}")
        else:
            lines.append(f"  {r['kind']:<18} {r['best GB/s']:8.3f} GB/s at {r['at size']:>8}, "
                         f"verified={r['verified']} ({r['verified by']})")
    for r in step_rows(profile):
        a = r["analytic, measured roof (ms)"]
        lines.append(f"  {r['phase']:<7} B={r['batch']:<4} S={r['tokens']:<5} C={r['context']:<5} "
                     f"measured {r['measured (ms)']:9.3f} ms, fitted {r['fitted profile (ms)'] or float('nan'):9.3f} ms"
                     + (f", analytic {a:9.3f} ms" if a else ""))
    for part, err in profile.data["errors"].items():
        lines.append(f"  ERROR in {part}: {err}")
    if profile.path:
        lines.append(f"  wrote {', '.join(profile.data['files'].values())} in {profile.path.parent}")
    emit(profile.data, args.json, "\n".join(lines))
    return 1 if profile.data["errors"] else 0


def _annotate(args: argparse.Namespace) -> int:
    import json

    from pdlab.peers.aic_compare import add_aiconfigurator
    from pdlab.simreal.gpu_profile import load_gpu_profile

    profile = load_gpu_profile(args.annotate)
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    status = add_aiconfigurator(profile, progress=progress)
    if status.get("available"):
        args.annotate.write_text(json.dumps(profile.data, indent=2) + "\n")
    emit(status, args.json, f"{args.annotate}: AIConfigurator "
         + (f"predictions added ({status['backend']}, {status['system']})" if status.get("available")
            else f"not added: {status['reason']}"))
    return 0 if status.get("available") else 1


def main(argv: list[str] | None = None) -> int:
    """Run only this subcommand (``python -m pdlab.cli.gpu_profile``), without the others' imports."""
    from pdlab.catalog import UnknownNameError

    parser = argparse.ArgumentParser(prog="pdlab gpu-profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except (UnknownNameError, CLIError, ValueError, FileNotFoundError) as exc:
        print(f"pdlab gpu-profile: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
