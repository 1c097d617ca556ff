"""Shared lookup of catalog entries by name, with helpful errors for unknown names."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from pdlab.paths import catalog_path

__all__ = ["UnknownNameError", "normalize_name", "load_yaml", "lookup"]


class UnknownNameError(KeyError):
    """An unknown GPU, link or model name; the message lists the closest known names."""

    def __init__(self, kind: str, name: str, known: list[str]):
        close = difflib.get_close_matches(normalize_name(name), known, n=4, cutoff=0.3)
        hint = f" Closest: {', '.join(close)}." if close else ""
        self.kind, self.name, self.closest = kind, name, close
        super().__init__(f"unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(known))}.")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


def normalize_name(name: str) -> str:
    """Lower-case, with spaces and underscores as dashes: ``"H100_SXM"`` → ``"h100-sxm"``."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@cache
def _load(path: str, mtime: float) -> dict[str, Any]:
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def load_yaml(name_or_path: str | Path) -> dict[str, Any]:
    """Load a catalog YAML file (a name under ``data/catalog/`` or a path), cached by mtime."""
    path = Path(name_or_path)
    if not path.exists():
        path = catalog_path(str(name_or_path))
    return _load(str(path), path.stat().st_mtime)


def lookup(kind: str, table: Mapping[str, Any], name: str) -> tuple[str, Any]:
    """Find ``name`` in ``table`` (normalised); raise :class:`UnknownNameError` otherwise."""
    key = normalize_name(name)
    if key in table:
        return key, table[key]
    raise UnknownNameError(kind, name, list(table))
