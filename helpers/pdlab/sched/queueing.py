"""DistServe §3.1: the prefill instance as an M/D/1 queue, and what TP or PP does to its TTFT.

Assumptions (DistServe OSDI'24, arXiv 2401.09670v3 §3.1): uniform prompts, Poisson arrivals at
rate R (requests/s), first come first served, no batching, a deterministic execution time D (s)
per request on one GPU; stable only when R·D < 1.

- One device (Pollaczek–Khinchine for M/D/1: mean wait = R·D² / (2(1 − R·D))):
  ``Avg_TTFT = D + R·D² / (2(1 − R·D))``
- Two-way inter-op (pipeline) parallelism: a request still takes D_s ≈ D end to end, but a new one
  can start every D_m ≈ D/2 (the slowest stage), so the queue is an M/D/1 with service D/2:
  ``Avg_TTFT_inter = D + R·D² / (4(2 − R·D))``
- Two-way intra-op (tensor) parallelism with speedup 1 < K < 2 (communication keeps K below 2):
  the service time becomes D/K: ``Avg_TTFT_intra = D/K + R·D² / (2K(K − R·D))``

Replicating an instance N times divides the rate: use R/N. :func:`simulate_avg_ttft` checks the
formulas with the course simulator (``pdlab.sim``): one prefill-only instance with a constant
latency model, PP=2 for inter-op, service D/K for intra-op.
"""

from __future__ import annotations

import math

__all__ = ["avg_ttft_single", "avg_ttft_inter_op", "avg_ttft_intra_op", "avg_ttft_all", "crossover_rate",
           "simulate_avg_ttft", "simulate_all"]


def _check(rate: float, service_s: float) -> None:
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate}")
    if not (math.isfinite(service_s) and service_s > 0):
        raise ValueError(f"service time must be a positive number of seconds, got {service_s}")


def _check_speedup(k: float) -> None:
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"speedup K must be positive, got {k}")


def avg_ttft_single(rate: float, service_s: float) -> float:
    """``D + R·D² / (2(1 − R·D))``; ``inf`` when R·D ≥ 1 (the queue grows without bound).

    >>> round(avg_ttft_single(5.0, 0.1), 6)    # R·D = 0.5: 0.1 + 5·0.01 / (2·0.5)
    0.15
    >>> avg_ttft_single(10.0, 0.1)
    inf
    """
    _check(rate, service_s)
    rho = rate * service_s
    if rho >= 1:
        return math.inf
    return service_s + rate * service_s**2 / (2 * (1 - rho))


def avg_ttft_inter_op(rate: float, service_s: float) -> float:
    """Two-way pipeline: ``D + R·D² / (4(2 − R·D))``; ``inf`` when R·D/2 ≥ 1.

    >>> round(avg_ttft_inter_op(5.0, 0.1), 6)  # 0.1 + 5·0.01 / (4·1.5)
    0.108333
    """
    _check(rate, service_s)
    rho = rate * service_s
    if rho >= 2:
        return math.inf
    return service_s + rate * service_s**2 / (4 * (2 - rho))


def avg_ttft_intra_op(rate: float, service_s: float, speedup: float) -> float:
    """Two-way tensor parallelism with speedup K: ``D/K + R·D² / (2K(K − R·D))``; ``inf`` when R·D ≥ K.

    >>> round(avg_ttft_intra_op(5.0, 0.1, 1.5), 6)   # 0.1/1.5 + 5·0.01 / (2·1.5·1.0)
    0.083333
    """
    _check(rate, service_s)
    _check_speedup(speedup)
    rho = rate * service_s
    if rho >= speedup:
        return math.inf
    return service_s / speedup + rate * service_s**2 / (2 * speedup * (speedup - rho))


def avg_ttft_all(rate: float, service_s: float, speedup: float) -> dict[str, float]:
    """``{"single", "inter_op", "intra_op"}`` average TTFT in seconds."""
    return {"single": avg_ttft_single(rate, service_s), "inter_op": avg_ttft_inter_op(rate, service_s),
            "intra_op": avg_ttft_intra_op(rate, service_s, speedup)}


def crossover_rate(service_s: float, speedup: float) -> float:
    """The rate (requests/s) above which inter-op beats intra-op; NaN when intra-op always wins.

    Solved numerically (bisection on the difference of the two closed forms over 0 < R·D < K).
    """
    _check(1.0, service_s)
    _check_speedup(speedup)

    def diff(r: float) -> float:
        return avg_ttft_intra_op(r, service_s, speedup) - avg_ttft_inter_op(r, service_s)

    hi = min(speedup, 2.0) / service_s * (1 - 1e-9)
    lo = 1e-12
    if diff(lo) > 0:
        return 0.0
    if diff(hi) <= 0:
        return float("nan")
    for _ in range(200):
        mid = (lo + hi) / 2
        if diff(mid) <= 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def simulate_avg_ttft(rate: float, service_s: float, *, kind: str = "single", speedup: float = 1.5,
                      requests: int = 100_000, seed: int = 0) -> float:
    """Average TTFT measured by ``pdlab.sim`` for ``kind`` = ``single``, ``inter_op`` or ``intra_op``.

    One prefill instance, no batching (one 512-token prompt per iteration, one output token),
    Poisson arrivals; inter-op runs the same latency D on a 2-stage pipeline (a new request every
    D/2), intra-op runs with latency D/K.
    """
    from pdlab.sim.cluster import ClusterSpec, PoolSpec, build_cluster
    from pdlab.sim.latency import ConstantLatency
    from pdlab.workloads import synthetic_requests

    _check(rate, service_s)
    if kind == "single":
        lat = ConstantLatency(service_s)
    elif kind == "inter_op":
        lat = ConstantLatency(service_s, pp=2)
    elif kind == "intra_op":
        _check_speedup(speedup)
        lat = ConstantLatency(service_s / speedup, tp=2)
    else:
        raise ValueError(f"kind must be single, inter_op or intra_op, got {kind!r}")
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    pool = PoolSpec("colocated", latency=lat, kv_capacity_tokens=10**12,
                    options={"max_batched_tokens": 512, "max_num_seqs": 1})
    reqs = synthetic_requests(requests, rate, prompt_tokens=512, output_tokens=1, seed=seed)
    res = build_cluster(ClusterSpec([pool]), record_token_times=False).run(reqs)
    ttfts = [r.ttft_s for r in res.records if r.ok]
    return sum(ttfts) / len(ttfts)


def simulate_all(rate: float, service_s: float, speedup: float, *, requests: int = 100_000,
                 seed: int = 0) -> dict[str, float]:
    """:func:`simulate_avg_ttft` for the three set-ups (same arrivals for each)."""
    return {k: simulate_avg_ttft(rate, service_s, kind=k, speedup=speedup, requests=requests, seed=seed)
            for k in ("single", "inter_op", "intra_op")}
