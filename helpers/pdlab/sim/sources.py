"""Request sources for the simulator: a trace file, or synthetic Poisson / gamma arrivals.

A source is an object with ``requests() -> list[Request]``; the simulator only needs that list.
Sources wrap the loaders and generators of :mod:`pdlab.workloads`, so new workload generators
become sources by wrapping them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pdlab.workloads import (
    Request,
    gamma_arrivals,
    make_requests,
    read_mooncake_jsonl,
    read_sharegpt_lengths,
    scale_rate,
)

__all__ = ["Source", "TraceSource", "PoissonSource", "GammaSource", "ListSource"]


class Source:
    """Base class: a finite stream of requests."""

    def requests(self) -> list[Request]:
        raise NotImplementedError


@dataclass
class ListSource(Source):
    """Requests given as a list."""

    items: Sequence[Request]

    def requests(self) -> list[Request]:
        return list(self.items)


@dataclass
class TraceSource(Source):
    """A Mooncake JSONL trace; ``rate_scale`` 2 replays it twice as fast; ``limit`` keeps the first N."""

    path: str | Path
    rate_scale: float = 1.0
    limit: int | None = None

    def requests(self) -> list[Request]:
        reqs = read_mooncake_jsonl(self.path, limit=self.limit)
        return reqs if self.rate_scale == 1.0 else scale_rate(reqs, self.rate_scale)


@dataclass
class GammaSource(Source):
    """``n`` requests with gamma inter-arrival gaps (mean 1/rate, coefficient of variation ``cv``).

    Lengths: fixed (``prompt_tokens``/``output_tokens``) or sampled from ShareGPT
    (``lengths="sharegpt"``).
    """

    n: int
    rate_rps: float
    prompt_tokens: int = 512
    output_tokens: int = 64
    lengths: str | None = None
    cv: float = 1.0
    seed: int = 0

    def requests(self) -> list[Request]:
        import numpy as np

        arrivals = gamma_arrivals(self.rate_rps, self.n, cv=self.cv, seed=self.seed)
        if self.lengths is None:
            return make_requests(arrivals, self.prompt_tokens, self.output_tokens)
        if self.lengths != "sharegpt":
            raise ValueError(f"unknown lengths source {self.lengths!r}; known: sharegpt")
        table = read_sharegpt_lengths()
        idx = np.random.default_rng(self.seed + 1).integers(0, len(table), size=self.n)
        return make_requests(arrivals, table[idx, 0], table[idx, 1])


@dataclass
class PoissonSource(GammaSource):
    """``n`` requests with Poisson arrivals at ``rate_rps`` (exponential gaps)."""

    def __post_init__(self) -> None:
        self.cv = 1.0
