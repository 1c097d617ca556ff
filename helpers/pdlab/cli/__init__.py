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

__all__ = ["main", "build_parser", "emit", "CLIError", "Subcommands"]

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
