"""Sim-to-real's first stage, one probe: what a front end (an engine's API server) takes of a core.

A deployment that runs each engine's front end on the engine's own core (two replicas on a
two-core host) slows every engine by the CPU its front end spends: HTTP, tokenisation, streaming
tokens back. :func:`probe_front_end_core` measures that CPU on a running server through the
course's benchmark client: blocks of requests at a few rates, the front end's own CPU seconds
sampled meanwhile (its processes without their children, so without the engine core;
:class:`pdlab.serve.measure.cpucost.CPUSampler`), split into cores while requests are in flight
and CPU seconds per request (:func:`pdlab.simreal.runfit.split_co_runner_cpu`). The result is the
calibration's ``front_end_core`` term (:class:`~pdlab.simreal.calibration.CoreShare`), which the
replay applies per engine (:func:`pdlab.simreal.replay.with_front_end_core`).

The probe needs a live server; where its front end runs does not matter (the CPU it spends is the
same work), so one colocated engine whose API server has a core of its own measures it for the
two-replica layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdlab.metrics import RequestRecord
from pdlab.simreal.calibration import CoreShare

__all__ = ["probe_front_end_core", "core_share_from_samples"]


def core_share_from_samples(samples: Sequence[Sequence[Sequence[float]]], records: Sequence[RequestRecord], *,
                            rate_rps: float = float("nan"), window_s: float = 1.0) -> CoreShare:
    """The :class:`~pdlab.simreal.calibration.CoreShare` of a front end from its CPU ``samples``
    (one list of ``(perf_counter time, CPU seconds so far)`` per block) and the ``records`` of the
    requests sent meanwhile (same clock): :func:`pdlab.simreal.runfit.split_co_runner_cpu`'s base
    cores and CPU seconds per request. ValueError with fewer than 4 sample windows."""
    from pdlab.simreal.runfit import split_co_runner_cpu

    split = split_co_runner_cpu(samples, records, window_s=window_s)
    return CoreShare(base_cores=split["base_cores"], cpu_s_per_request=split["cpu_s_per_request"],
                     requests=sum(1 for r in records if r.ok), windows=int(split["windows"]), r2=float(split["r2"]),
                     rate_rps=float(rate_rps))


def probe_front_end_core(url: str, front_end_pids: Sequence[int], *, rates_rps: Sequence[float] = (2.0, 6.0),
                         requests_per_rate: int = 40, prompt_tokens: int = 256, output_tokens: int = 32,
                         period_s: float = 0.25, window_s: float = 1.0, seed: int = 0,
                         **bench_kwargs: Any) -> CoreShare:
    """Measure what the front end of the server at ``url`` (its processes ``front_end_pids``: a
    vLLM API server's PID, without the engine core it spawned) spends per request and while
    requests are in flight: one block of ``requests_per_rate`` Poisson requests of
    ``prompt_tokens`` → ``output_tokens`` tokens per rate in ``rates_rps`` (req/s), sent by the
    course's benchmark client (:func:`pdlab.serve.client.bench.run_bench`, ``bench_kwargs``), the
    front end's CPU sampled every ``period_s`` s; fitted by :func:`core_share_from_samples` on
    windows of about ``window_s`` s. Two rates or more tell the base from the per-request cost.
    RuntimeError when a request fails; ValueError for bad settings."""
    from pdlab.serve.client.bench import run_bench
    from pdlab.serve.measure.cpucost import CPUSampler
    from pdlab.workloads import synthetic_requests

    if not front_end_pids:
        raise ValueError("front_end_pids is empty: give the front end's process ids (a vLLM API server's PID)")
    if not rates_rps or min(rates_rps) <= 0:
        raise ValueError(f"rates_rps must be positive rates, got {rates_rps!r}")
    if requests_per_rate < 4:
        raise ValueError(f"requests_per_rate must be >= 4, got {requests_per_rate}")
    samples, records = [], []
    for i, rate in enumerate(rates_rps):
        reqs = synthetic_requests(requests_per_rate, rate, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                  seed=seed + i)
        with CPUSampler(front_end_pids, period_s=period_s) as sampler:
            res = run_bench(url, reqs, progress=False, seed=seed + i, **bench_kwargs)
        bad = [r.error for r in res.records if not r.ok]
        if bad:
            raise RuntimeError(f"{len(bad)} of {len(res.records)} front-end probe requests to {url} failed: {bad[0]}")
        samples.append(sampler.samples)
        records.extend(res.records)
    mean_rate = sum(rates_rps) / len(rates_rps)
    return core_share_from_samples(samples, records, rate_rps=mean_rate, window_s=window_s)
