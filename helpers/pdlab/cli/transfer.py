"""``pdlab transfer bench``: measure KV-shaped transfers between two processes, verified.

Example: ``pdlab transfer bench --transport shm,tcp,mooncake --sizes 4KiB,1MiB,64MiB --json``.
Prints each transport's bandwidth and latency per size (median of repeats, min and max), this
machine's memcpy measured in the same run, and each transport's best as a fraction of it.
"""

from __future__ import annotations

import argparse

from pdlab.cli import CLIError, Subcommands, add_actions, emit
from pdlab.transfer.bench import benchmark
from pdlab.transfer.measurement import VerificationError
from pdlab.transfer.sizes import parse_sizes, sizes_for_profile
from pdlab.transfer.transports import TRANSPORTS, expand_transports, transport_status

__all__ = ["register", "run_bench"]


def register(sub: Subcommands) -> None:
    p = sub.add_parser("transfer", help="measured KV-cache transfers (shm, tcp, gloo, Mooncake, NIXL, CUDA)",
                       description=__doc__)
    tsub = add_actions(p, "transfer")
    b = tsub.add_parser("bench", help="sweep sizes over transports, verified, against memcpy",
                        description=__doc__)
    b.add_argument("--transport", default="shm,tcp",
                   help=f"comma-separated: {', '.join(TRANSPORTS)}, or all (default shm,tcp)")
    b.add_argument("--sizes", help="comma-separated sizes, e.g. 4KiB,1MiB,256MiB (default: 4 KiB…256 MiB ×4)")
    b.add_argument("--profile", choices=["smoke", "ci", "default", "full"], default="default",
                   help="size sweep when --sizes is not given (full goes to 1 GiB)")
    b.add_argument("--repeats", type=int, default=5, help="timed repeats per size (median reported)")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise CLIError(f"--repeats must be >= 1, got {args.repeats}")
    transports = expand_transports(args.transport)
    sizes = parse_sizes(args.sizes) if args.sizes else sizes_for_profile(args.profile)
    everything = args.transport.strip() == "all"
    if not everything:  # named explicitly: an unavailable one is a user error (exit 2)
        for name in transports:
            ok, why = transport_status(name)
            if not ok:
                raise CLIError(f"transport {name!r} is unavailable: {why}")
    try:
        report = benchmark(transports, sizes, args.repeats, skip_unavailable=everything,
                           progress=not args.json)
    except VerificationError as exc:
        print(f"pdlab transfer bench: verification failed: {exc}")
        return 1
    emit(report.as_dict(), args.json, report.summary())
    return 0
