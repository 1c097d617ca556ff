"""The ``pdlab`` command: one subcommand per user task, ``--json`` on each for scripting.

Each subcommand lives in its own module here with ``register(subparsers)``, which adds a parser
whose ``func(args) -> int`` does the work. Add new modules to ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from pdlab.catalog import UnknownNameError

__all__ = ["main", "build_parser", "emit", "CLIError", "Subcommands", "add_actions", "add_slo_arguments", "slo_from_args"]

_COMMANDS = ["pdlab.cli.kv", "pdlab.cli.course", "pdlab.cli.trace", "pdlab.cli.queue", "pdlab.cli.simulate", "pdlab.cli.place",
             "pdlab.cli.roofline",
             "pdlab.cli.transfer",
             "pdlab.cli.model", "pdlab.cli.serve", "pdlab.cli.bench",
             "pdlab.cli.workload", "pdlab.cli.router",
             "pdlab.cli.sim",
             "pdlab.cli.gpu_profile"]


class Subcommands(Protocol):
    """What ``register(sub)`` receives: the object ``ArgumentParser.add_subparsers()`` returns.

    argparse gives its class no public name, so the subcommand modules annotate with this
    structural type (the one method they call) rather than reach for a private one.
    """

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


class CLIError(Exception):
    """A user error: printed without a traceback; exit status 2."""


def add_actions(parser: argparse.ArgumentParser, name: str, metavar: str = "ACTION") -> Subcommands:
    """The actions of ``pdlab NAME`` (``pdlab NAME ACTION ...``; one is required), each added with
    ``add_parser``; the chosen one is ``args.NAME_command``."""
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar=metavar)


def add_slo_arguments(parser: argparse.ArgumentParser, *, required: bool = False, e2e: bool = False,
                      what: str = "") -> None:
    """``--slo-ttft`` and ``--slo-tpot`` (with ``e2e``, ``--slo-e2e`` too), in seconds; ``what``
    starts their help (e.g. ``"slo-aware: "``). :func:`slo_from_args` reads them."""
    parser.add_argument("--slo-ttft", type=float, required=required, help=f"{what}TTFT SLO, s")
    parser.add_argument("--slo-tpot", type=float, required=required, help=f"{what}TPOT SLO, s")
    if e2e:
        parser.add_argument("--slo-e2e", type=float, help=f"{what}E2E SLO, s")


def slo_from_args(args: argparse.Namespace):
    """The :class:`pdlab.metrics.SLO` of the ``--slo-*`` options (:func:`add_slo_arguments`), or None
    when none is given."""
    from pdlab.metrics import SLO

    values = [getattr(args, f"slo_{k}", None) for k in ("ttft", "tpot", "e2e")]
    return None if all(v is None for v in values) else SLO(*values)


def emit(payload: Any, as_json: bool, text: str | None = None) -> None:
    """Print ``payload`` as JSON (``--json``) or ``text`` for people."""
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text if text is not None else payload)


def build_parser() -> argparse.ArgumentParser:
    from pdlab import __version__

    parser = argparse.ArgumentParser(prog="pdlab", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pdlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UnknownNameError, CLIError, ValueError, FileNotFoundError) as exc:
        print(f"pdlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
