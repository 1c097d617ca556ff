"""``pdlab course``: build student copies, run the course with papermill, export write-ups."""

from __future__ import annotations

import argparse
from pathlib import Path

from pdlab.cli import CLIError, Subcommands, add_actions, emit

__all__ = ["register"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("course", help="build, run and export the course notebooks", description=__doc__)
    csub = add_actions(p, "course")

    b = csub.add_parser("build", help="generate notebooks/ and labs/ from solutions/")
    b.add_argument("--check", action="store_true", help="only report copies that are out of date (exit 1)")
    b.set_defaults(func=_build)

    r = csub.add_parser("run", help="execute the course with papermill")
    r.add_argument("--profile", default="ci", choices=["ci", "full", "smoke"])
    r.add_argument("--only", help="glob on notebook names, e.g. '0[02]_*'")
    r.add_argument("--student", action="store_true", help="run the student copies instead of solutions")
    r.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds")
    r.add_argument("--no-html", action="store_true", help="skip the HTML export")
    r.add_argument("--out", type=Path, help="folder for the executed notebooks and HTML (default build/); "
                                            "give each run its own to keep earlier runs' notebooks")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_run)

    e = csub.add_parser("export", help="turn an executed notebook into a write-up")
    e.add_argument("notebook", type=Path)
    e.add_argument("--to", default="html", choices=["html", "pdf", "markdown"],
                   help="html and pdf render math offline (MathML); pdf prints with the system Chromium")
    e.add_argument("--out", type=Path)
    shown = e.add_mutually_exclusive_group()
    shown.add_argument("--no-input", action="store_true", help="hide all code cells")
    shown.add_argument("--writeup", action="store_true",
                       help="a student's write-up: exercise answers' code, check verdicts and plots, no other code")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_export)

    k = csub.add_parser("kernel", help="register the course's Jupyter kernel in this environment")
    k.set_defaults(func=_kernel)


def _build(args: argparse.Namespace) -> int:
    from pdlab.course import build, out_of_sync

    if args.check:
        stale = out_of_sync()
        for p in stale:
            print(f"out of date: {p}")
        return 1 if stale else 0
    changed = build()
    print(f"updated {len(changed)} notebooks" + "".join(f"\n  {p}" for p in changed))
    return 0


def _run(args: argparse.Namespace) -> int:
    from pdlab.course import run_course
    from pdlab.course.run import format_table

    results = run_course(profile=args.profile, only=args.only, student=args.student,
                         timeout_s=args.timeout, html_export=not args.no_html, out_dir=args.out)
    if not results:
        raise CLIError(f"no notebook matches {args.only!r}")
    payload = [{"notebook": r.notebook, "status": r.status, "seconds": round(r.seconds, 2),
                "output": str(r.output), "error": r.error} for r in results]
    emit(payload, args.json, format_table(results))
    if not args.no_html and not args.json:
        html = results[0].html.parent / "index.html" if results[0].html else None
        if html:
            print(f"\nexecuted notebooks under {results[0].output.parent.parent}; HTML index: {html}")
    return 0 if all(r.status == "ok" for r in results) else 1


def _export(args: argparse.Namespace) -> int:
    from pdlab.course import ChromiumNotFoundError, export

    if not args.notebook.exists():
        raise CLIError(f"no such notebook: {args.notebook}")
    try:
        out = export(args.notebook, to=args.to, out=args.out, no_input=args.no_input, writeup=args.writeup)
    except ChromiumNotFoundError as exc:
        raise CLIError(str(exc)) from exc
    emit({"out": str(out), "format": args.to}, args.json, str(out))
    return 0


def _kernel(args: argparse.Namespace) -> int:
    from pdlab.course import ensure_kernel

    print(f"kernel registered: {ensure_kernel()}")
    return 0
