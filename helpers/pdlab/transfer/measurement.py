"""One measured transfer and its failure: the records every transfer benchmark returns.

:class:`Measurement` is one transport at one size (median latency over repeats, bandwidth in
decimal B/s); :class:`VerificationError` is raised when a transfer delivered wrong bytes. A leaf
module: the process benchmarks (:mod:`pdlab.transfer.bench`) and the CUDA copies
(:mod:`pdlab.transfer.cuda`) both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Measurement", "VerificationError"]


class VerificationError(RuntimeError):
    """A transfer delivered bytes whose checksum differs from what was sent."""


@dataclass
class Measurement:
    """One transport at one size: median latency (s) over repeats, bandwidth in B/s (decimal)."""

    transport: str
    size_bytes: int
    latency_s: float
    latency_min_s: float
    latency_max_s: float
    bandwidth_bytes_per_s: float
    bandwidth_min_bytes_per_s: float
    bandwidth_max_bytes_per_s: float
    repeats: int
    verified: bool
    layout: dict = field(default_factory=dict)
    fraction_of_memcpy: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)
