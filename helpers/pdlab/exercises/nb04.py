"""Checks for notebook 04 (goodput and SLOs). Expected values are computed from the inputs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pdlab.exercises import CheckResult, check_close
from pdlab.metrics import RequestRecord

__all__ = ["stream_tpot_s", "check_stream_tpot", "check_tightest_ttft_slo", "check_interpolated_goodput",
           "tightest_ttft_slo_s", "interpolated_goodput_rps"]


def stream_tpot_s(sent_s: float, chunks: Sequence[tuple[float, int]]) -> float:
    """TPOT (s) of one streamed request as ``vllm bench serve`` computes it: (E2E − TTFT) / (output
    tokens − 1), E2E ending at the last chunk, the tokens counted over every chunk (a chunk may carry
    several), not the chunks. ``chunks``: (arrival time s, output tokens it carries) per chunk, in order,
    on the clock of ``sent_s``."""
    if not chunks:
        raise ValueError("a stream needs at least one chunk")
    times = [float(t) for t, _ in chunks]
    tokens = [int(n) for _, n in chunks]
    if min(tokens) < 1:
        raise ValueError(f"every chunk carries at least one token, got {tokens}")
    if times[0] < sent_s or any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("chunk times must follow the send time and each other")
    total = sum(tokens)
    if total < 2:
        raise ValueError("a stream of one output token has no TPOT")
    ttft, e2e = times[0] - sent_s, times[-1] - sent_s
    return (e2e - ttft) / (total - 1)


def check_stream_tpot(value, sent_s: float, chunks: Sequence[tuple[float, int]]) -> CheckResult:
    """Exercise 1: TPOT of a stream whose chunks carry several tokens (see :func:`stream_tpot_s`)."""
    expected = stream_tpot_s(sent_s, chunks)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="s",
                       hint="TPOT = (E2E − TTFT) / (output tokens − 1): E2E ends at the last chunk, and the "
                            "tokens are those the chunks carry, not the number of chunks.")


def tightest_ttft_slo_s(records: Sequence[RequestRecord], slo_tpot_s: float, goal: float = 0.9) -> float:
    """The smallest TTFT SLO (s) at which ``goal`` of *all* records meet both it and ``slo_tpot_s``
    (failed requests always miss; a one-token request has no TPOT and passes that part); ``inf``
    when the TPOT SLO alone already keeps attainment below the goal."""
    if not 0 < goal <= 1:
        raise ValueError(f"goal must be in (0, 1], got {goal}")
    if not records:
        raise ValueError("no records")
    ttfts = sorted(r.ttft_s for r in records if r.ok and (r.tpot_s or 0.0) <= slo_tpot_s)
    needed = math.ceil(goal * len(records) - 1e-9)  # requests that must meet both SLOs
    return ttfts[needed - 1] if needed <= len(ttfts) else math.inf


def check_tightest_ttft_slo(value, records: Sequence[RequestRecord], slo_tpot_s: float,
                            goal: float = 0.9) -> CheckResult:
    """Exercise 2: the tightest TTFT SLO (s) that ``goal`` of the run's requests meet together with the
    TPOT SLO (DistServe's "SLO scale" read the other way; see :func:`tightest_ttft_slo_s`)."""
    expected = tightest_ttft_slo_s(records, slo_tpot_s, goal)
    return check_close("Exercise 2", value, expected, rel_tol=1e-6, unit="s",
                       hint="Keep the completed requests that meet the TPOT SLO, sort their TTFTs, and take the one "
                            "that brings the count to goal × ALL requests (failed ones included in the total).")


def interpolated_goodput_rps(rates: Sequence[float], attainments: Sequence[float], goal: float = 0.9) -> float:
    """The request rate (req/s) at which attainment first falls below ``goal``, interpolated linearly
    between the swept rate at or above the goal and the next one below it (rates sorted ascending);
    the highest rate when every rate reaches the goal, 0 when no such crossing exists."""
    if len(rates) != len(attainments) or not rates:
        raise ValueError("rates and attainments must be non-empty and of equal length")
    pairs = sorted(zip(rates, attainments, strict=True))
    if min(a for _, a in pairs) >= goal:
        return pairs[-1][0]
    for (r0, a0), (r1, a1) in zip(pairs, pairs[1:], strict=False):
        if a0 >= goal > a1:
            return r0 + (a0 - goal) / (a0 - a1) * (r1 - r0)
    return 0.0


def check_interpolated_goodput(value, rates: Sequence[float], attainments: Sequence[float],
                               goal: float = 0.9) -> CheckResult:
    """Exercise 3: DistServe's goodput of one instance (the rate at the attainment goal), read between
    the swept rates instead of rounded down to one of them (see :func:`interpolated_goodput_rps`)."""
    expected = interpolated_goodput_rps(list(rates), list(attainments), goal)
    return check_close("Exercise 3", value, expected, rel_tol=1e-3, unit="req/s",
                       hint="Find the last swept rate whose attainment is ≥ the goal and the next one below it; "
                            "interpolate linearly between the two for the rate where attainment equals the goal.")
