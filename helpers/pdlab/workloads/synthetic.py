"""Synthetic arrivals and named workloads: Poisson and gamma (bursty) arrival processes, requests
of given or sampled lengths, rate changes, and the named workloads of ``pdlab place --workload``.

Keep each generator a plain function ``(..., seed) -> list[Request]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from pdlab.workloads.traces import Request, mooncake_trace_path, read_mooncake_jsonl, read_sharegpt_lengths

__all__ = [
    "poisson_arrivals",
    "gamma_arrivals",
    "make_requests",
    "synthetic_requests",
    "stratified_rows",
    "scale_rate",
    "with_rate",
    "named_workload",
    "WORKLOADS",
]


def _check_rate(rate_rps: float) -> None:
    if not (isinstance(rate_rps, int | float) and math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate_rps!r}")


def poisson_arrivals(rate_rps: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s) of a Poisson process: exponential gaps with mean 1/rate; first at the first gap."""
    return gamma_arrivals(rate_rps, n, cv=1.0, seed=seed)


def gamma_arrivals(rate_rps: float, n: int, *, cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s) with gamma-distributed gaps of mean 1/rate and coefficient of variation ``cv``.

    ``cv = 1`` is Poisson; ``cv > 1`` is burstier. Shape k = 1/cv², scale = 1/(rate·k) (the
    ``--burstiness`` of ``vllm bench serve`` is k).
    """
    _check_rate(rate_rps)
    if cv <= 0:
        raise ValueError(f"cv must be positive, got {cv}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    return np.cumsum(gaps)


def make_requests(arrivals_s: Sequence[float], prompt_tokens: Sequence[int] | int,
                  output_tokens: Sequence[int] | int) -> list[Request]:
    """Zip arrival times with token counts (scalars are broadcast) into :class:`Request` objects."""
    n = len(arrivals_s)
    p = np.broadcast_to(np.asarray(prompt_tokens, dtype=np.int64), (n,))
    o = np.broadcast_to(np.asarray(output_tokens, dtype=np.int64), (n,))
    if n and (p.min() < 1 or o.min() < 1):
        raise ValueError("prompt and output token counts must be >= 1")
    return [Request(i, float(a), int(pi), int(oi)) for i, (a, pi, oi) in enumerate(zip(arrivals_s, p, o, strict=False))]


def stratified_rows(table: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices of ``n`` draws from ``table``, one uniformly at random from each of ``n`` equal
    strata of its first column (sorted), in random order.

    Stratified sampling: the sample covers the distribution of the first column evenly, so
    neighbouring values near any quantile lie about one stratum apart. A plain random sample of
    60 ShareGPT conversations can leave a 33 % gap in prompt length right at the median, and then
    the median TTFT jumps by that gap when one request changes sides.
    """
    if not 1 <= n <= len(table):
        raise ValueError(f"need 1 ≤ n ≤ {len(table)} rows to stratify, got {n}")
    order = np.argsort(table[:, 0], kind="stable")
    edges = np.linspace(0, len(table), n + 1).astype(np.int64)
    picks = order[rng.integers(edges[:-1], edges[1:])]
    return rng.permutation(picks)


def synthetic_requests(n: int, rate_rps: float, *, prompt_tokens: int | Sequence[int] | None = None,
                       output_tokens: int | Sequence[int] | None = None, lengths: str | None = None,
                       arrival: str = "poisson", cv: float = 1.0, seed: int = 0) -> list[Request]:
    """``n`` requests at ``rate_rps`` with Poisson (``arrival="poisson"``) or gamma arrivals.

    Lengths: fixed (``prompt_tokens=512, output_tokens=64``), given per request, or (prompt, output)
    pairs of ShareGPT conversations (DistServe's chatbot workload): ``lengths="sharegpt"`` samples
    them with replacement, ``"sharegpt-stratified"`` one from each of ``n`` equal strata of prompt
    length (:func:`stratified_rows`; medians of short runs move less between runs).
    """
    if arrival not in ("poisson", "gamma"):
        raise ValueError(f"arrival must be poisson or gamma, got {arrival!r}")
    arrivals = gamma_arrivals(rate_rps, n, cv=cv if arrival == "gamma" else 1.0, seed=seed)
    if lengths is not None:
        if lengths not in ("sharegpt", "sharegpt-stratified"):
            raise ValueError(f"unknown lengths source {lengths!r}; known: sharegpt, sharegpt-stratified")
        table = read_sharegpt_lengths()
        rng = np.random.default_rng(seed + 1)
        idx = stratified_rows(table, n, rng) if lengths == "sharegpt-stratified" else \
            rng.integers(0, len(table), size=n)
        prompt_tokens, output_tokens = table[idx, 0], table[idx, 1]
    if prompt_tokens is None or output_tokens is None:
        raise ValueError("give prompt_tokens and output_tokens, or lengths='sharegpt'")
    return make_requests(arrivals, prompt_tokens, output_tokens)


def scale_rate(requests: Sequence[Request], factor: float) -> list[Request]:
    """Compress time by ``factor`` (2 → twice the request rate): arrival times divided by ``factor``."""
    if not factor > 0:
        raise ValueError(f"rate scale must be positive, got {factor}")
    return [replace(r, arrival_s=r.arrival_s / factor) for r in requests]


def with_rate(requests: Sequence[Request], rate_rps: float, *, seed: int = 0, arrival: str = "poisson",
              cv: float = 1.0) -> list[Request]:
    """Keep the token counts of ``requests`` but redraw arrivals at ``rate_rps`` (Poisson or gamma)."""
    _check_rate(rate_rps)
    arrivals = gamma_arrivals(rate_rps, len(requests), cv=cv if arrival == "gamma" else 1.0, seed=seed)
    return [replace(r, request_id=i, arrival_s=float(a)) for i, (r, a) in enumerate(zip(requests, arrivals, strict=False))]


def _sharegpt(stratified: bool) -> Callable[[int, float, int], list[Request]]:
    def gen(n: int, rate: float, seed: int) -> list[Request]:
        return synthetic_requests(n, rate, lengths="sharegpt-stratified" if stratified else "sharegpt", seed=seed)
    return gen


def _fixed(prompt: int, output: int) -> Callable[[int, float, int], list[Request]]:
    def gen(n: int, rate: float, seed: int) -> list[Request]:
        return synthetic_requests(n, rate, prompt_tokens=prompt, output_tokens=output, seed=seed)
    return gen


def _mooncake(name: str) -> Callable[[int, float, int], list[Request]]:
    def gen(n: int, rate: float, seed: int) -> list[Request]:
        reqs = read_mooncake_jsonl(mooncake_trace_path(name))
        idx = np.random.default_rng(seed + 1).integers(0, len(reqs), size=n)
        return with_rate([reqs[i] for i in idx], rate, seed=seed)
    return gen


#: Named workloads for ``pdlab place --workload``: ``f(n, rate_rps, seed) -> list[Request]``
#: (lengths from the source, Poisson arrivals at the rate).
WORKLOADS: dict[str, Callable[[int, float, int], list[Request]]] = {
    "sharegpt": _sharegpt(False),
    "sharegpt-stratified": _sharegpt(True),
    "fixed-512-64": _fixed(512, 64),
    "mooncake-conversation": _mooncake("conversation"),
    "mooncake-synthetic": _mooncake("synthetic"),
}


def named_workload(name: str, n: int, rate_rps: float, seed: int = 0) -> list[Request]:
    """``n`` requests of a named workload (see :data:`WORKLOADS`) at ``rate_rps``.

    A name ``fixed-P-O`` (e.g. ``fixed-2048-128``) gives fixed lengths P in / O out.
    """
    if name in WORKLOADS:
        return WORKLOADS[name](n, rate_rps, seed)
    parts = name.split("-")
    if len(parts) == 3 and parts[0] == "fixed" and parts[1].isdigit() and parts[2].isdigit():
        return _fixed(int(parts[1]), int(parts[2]))(n, rate_rps, seed)
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}, fixed-P-O")
