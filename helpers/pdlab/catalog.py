"""Shared lookup of catalog entries by name, with helpful errors for unknown names."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from pdlab.paths import catalog_path

__all__ = ["UnknownNameError", "CatalogError", "normalize_name", "load_yaml", "lookup", "typed_fields"]


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


class CatalogError(ValueError):
    """A catalog entry with a missing or malformed field; the message names file, entry and field."""

    def __init__(self, file: str, entry: str, field: str, problem: str):
        self.file, self.entry, self.field, self.problem = file, entry, field, problem
        super().__init__(f"{file}: entry {entry!r}, field {field!r}: {problem}")


def _check(value: Any, annotation: str) -> Any:
    kinds = {part.strip() for part in annotation.split("|")}
    if value is None:
        if "None" in kinds:
            return None
        raise ValueError("is missing")
    if "float" in kinds:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"must be a number >= 0, got {value!r}")
        return value
    if "int" in kinds:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"must be a whole number >= 0, got {value!r}")
        return value
    if "str" in kinds:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"must be a non-empty string, got {value!r}")
        return value
    if "bool" in kinds and not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def typed_fields(cls: type, entry: Mapping[str, Any], *, file: str, key: str,
                 exclude: tuple[str, ...] = ("key", "extra")) -> dict[str, Any]:
    """The fields of dataclass ``cls`` read from a catalog ``entry``, checked against their annotations.

    ``float`` fields take finite numbers >= 0 (as written), ``int`` whole numbers >= 0, ``str``
    non-empty text; a field annotated ``... | None`` may be absent. Anything else raises
    :class:`CatalogError` naming ``file``, the entry ``key`` and the field.
    """
    if not isinstance(entry, Mapping):
        raise CatalogError(file, key, "*", f"the entry must be a mapping of fields, got {type(entry).__name__}")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        try:
            out[f.name] = _check(entry.get(f.name), str(f.type))
        except ValueError as exc:
            raise CatalogError(file, key, f.name, str(exc)) from None
    return out
