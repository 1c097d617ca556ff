"""Byte sizes for transfer benchmarks: parse ``4KiB``/``1MB``, format them, and build sweeps.

Binary prefixes (KiB, MiB, GiB = 2**10, 2**20, 2**30 B) and decimal ones (kB/KB, MB, GB = 1e3,
1e6, 1e9 B) are both accepted; a bare number is bytes. Bandwidths elsewhere in
:mod:`pdlab.transfer` are decimal (1 GB/s = 1e9 B/s).
"""

from __future__ import annotations

import re

__all__ = ["parse_size", "parse_sizes", "format_size", "size_sweep", "PROFILE_SIZES", "sizes_for_profile"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from ``"4KiB"``, ``"1 MiB"``, ``"1.5GB"`` or ``4096``; ValueError names the problem."""
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse size {text!r}; use e.g. 4KiB, 1MiB, 256MiB, 1GiB")
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit {m.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, kB, MB, GB")
    value = number * _UNITS[unit]
    if value != int(value) or value <= 0:
        raise ValueError(f"size {text!r} must be a positive whole number of bytes")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes (``"4KiB,1MiB,64MiB"``), sorted and de-duplicated."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError("no sizes given")
    return sorted({parse_size(p) for p in parts})


def format_size(n_bytes: float) -> str:
    """Human-readable binary size: ``4096`` → ``"4 KiB"``, ``268435456`` → ``"256 MiB"``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover


def size_sweep(smallest: int | str = "4KiB", largest: int | str = "256MiB", step: int = 4) -> list[int]:
    """Geometric sweep from ``smallest`` to ``largest`` (both included), multiplying by ``step``."""
    lo, hi = parse_size(smallest), parse_size(largest)
    if lo > hi or step < 2:
        raise ValueError(f"need smallest <= largest and step >= 2 (got {lo}, {hi}, {step})")
    sizes, s = [], lo
    while s < hi:
        sizes.append(s)
        s *= step
    sizes.append(hi)
    return sizes


#: Sweeps per notebook profile: smoke (seconds), ci (about a minute on 2 cores), full (to 1 GiB).
PROFILE_SIZES: dict[str, list[int]] = {
    "smoke": [4096, 1024**2],
    "ci": size_sweep("4KiB", "16MiB", 16),
    "default": size_sweep("4KiB", "256MiB", 4),
    "full": size_sweep("4KiB", "1GiB", 4),
}


def sizes_for_profile(profile: str) -> list[int]:
    """The size sweep of a profile (``smoke``, ``ci``, ``default``, ``full``)."""
    try:
        return list(PROFILE_SIZES[profile])
    except KeyError:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILE_SIZES)}") from None
