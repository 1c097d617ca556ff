"""Where a request's time to first token goes, from the engines' own clocks.

For a **disaggregated** request (client → proxy → prefill server → proxy → decode server → client):

========================  ==================================================================
part                      source
========================  ==================================================================
proxy                     the proxy's own work (``/proxy/timings``: ``own_s``)
prefill front end         proxy's prefill leg − the prefill engine's queue+prefill+decode
                          (HTTP, tokenisation, detokenisation, hand-off to the engine core)
prefill queue             prefill server ``vllm:request_queue_time_seconds``
prefill compute           prefill server ``vllm:request_prefill_time_seconds`` + ``…decode_time…``
decode front end          proxy's decode leg (to its first chunk) − decode queue+prefill
decode queue              decode server ``vllm:request_queue_time_seconds``
KV transfer               decode server ``vllm:nixl_xfer_time_seconds`` (NIXL reads)
decode first step         decode ``vllm:request_prefill_time_seconds`` − KV transfer (the
                          partial last block and the first token, plus waits for the pull's
                          notifications)
========================  ==================================================================

vLLM v1 (``vllm/v1/metrics/stats.py``) times a request from its arrival in the front end:
*queue* = queued → first scheduled; *prefill* = first scheduled → first token (on a decode
server this includes waiting for the remote KV); *decode* = first → last token; *e2e* and *TTFT*
from arrival. The two front-end parts are the difference between what the proxy measured around
each backend and what that backend's engine measured inside, so the parts add up to the proxy's
TTFT; :attr:`TTFTBreakdown.consistent` then checks two things that can fail: the proxy's TTFT
agrees with the client's within ``tolerance`` or ``gap_slack_s`` (nothing unaccounted between
client and proxy beyond the hop's scheduling), and
no part is negative (each engine's time fits inside the proxy's leg around it).

A **colocated** request has: front end (client TTFT − engine TTFT), queue, prefill compute,
and engine overhead (engine TTFT − queue − prefill); its parts add up by construction.

Per request: send requests one at a time and difference the metrics around each one
(:func:`probe_breakdowns`); under load the same parts are means over a run (histogram sums ÷
counts between two snapshots, :func:`mean_breakdown`).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pdlab.serve.measure.evidence import MetricsSnapshot, scrape_metrics

__all__ = ["DISAGG_PARTS", "COLOCATED_PARTS", "TTFTBreakdown", "combine_breakdowns", "EngineTimes", "engine_times",
           "disaggregated_breakdown", "colocated_breakdown", "mean_breakdown", "probe_breakdowns",
           "proxy_timings", "streamed_ttft", "BreakdownWindow"]

DISAGG_PARTS = ("proxy", "prefill front end", "prefill queue", "prefill compute", "decode front end",
                "decode queue", "KV transfer", "decode first step")
COLOCATED_PARTS = ("front end", "queue", "prefill compute", "engine overhead")

_H = "vllm:{}_seconds"


@dataclass(frozen=True)
class EngineTimes:
    """Mean per-request times (seconds) one vLLM server's ``/metrics`` recorded between two scrapes."""

    requests: float
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float
    e2e_s: float
    kv_transfer_s: float
    kv_transfers: float


def _mean(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> tuple[float, float]:
    n = after.total(name + "_count") - before.total(name + "_count")
    s = after.total(name + "_sum") - before.total(name + "_sum")
    return (s / n if n > 0 else 0.0), n


def engine_times(before: MetricsSnapshot, after: MetricsSnapshot) -> EngineTimes:
    """Mean request times between two scrapes of one server (0 for a metric that did not move)."""
    queue, n = _mean(before, after, _H.format("request_queue_time"))
    prefill, _ = _mean(before, after, _H.format("request_prefill_time"))
    decode, _ = _mean(before, after, _H.format("request_decode_time"))
    ttft, _ = _mean(before, after, _H.format("time_to_first_token"))
    e2e, _ = _mean(before, after, _H.format("e2e_request_latency"))
    xfer_sum = after.total("vllm:nixl_xfer_time_seconds_sum") - before.total("vllm:nixl_xfer_time_seconds_sum")
    xfers = after.total("vllm:nixl_xfer_time_seconds_count") - before.total("vllm:nixl_xfer_time_seconds_count")
    return EngineTimes(n, queue, prefill, decode, ttft, e2e, xfer_sum / n if n else 0.0, xfers)


@dataclass
class TTFTBreakdown:
    """One TTFT split into named parts (seconds), with the client's own measurement beside it."""

    deployment: str
    client_ttft_s: float
    parts: dict[str, float]
    tolerance: float = 0.10
    negative_slack_s: float = 0.002  # clocks of two processes: allow 2 ms of disagreement per part
    notes: list[str] = field(default_factory=list)
    # The client↔proxy hop is two wake-ups of processes whose cores busy engines share: on the course's
    # 2-core VM it left 4–8 ms of a 60–115 ms TTFT unaccounted (tests/test_live.py, 2026-12-03), over
    # 10 % of a fast machine's short TTFT. A gap within this many seconds still adds up.
    gap_slack_s: float = 0.010

    @property
    def accounted_s(self) -> float:
        return sum(self.parts.values())

    @property
    def rel_gap(self) -> float:
        """(client TTFT − sum of parts) / client TTFT."""
        return (self.client_ttft_s - self.accounted_s) / self.client_ttft_s if self.client_ttft_s > 0 else 0.0

    @property
    def consistent(self) -> bool:
        """Parts add up to the client's TTFT within ``tolerance`` (or within ``gap_slack_s`` seconds)
        and none is negative beyond ``negative_slack_s``."""
        gap_s = abs(self.client_ttft_s - self.accounted_s)
        adds_up = abs(self.rel_gap) <= self.tolerance or gap_s <= self.gap_slack_s
        return adds_up and min(self.parts.values()) >= -self.negative_slack_s

    def rows(self) -> list[dict[str, object]]:
        """Long format for a stacked bar: deployment, part, milliseconds."""
        return [{"deployment": self.deployment, "part": k, "ms": v * 1e3} for k, v in self.parts.items()]

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.parts.items())
        return (f"{self.deployment}: client TTFT {self.client_ttft_s * 1e3:.1f} ms = {parts} ms "
                f"(sum {self.accounted_s * 1e3:.1f} ms, gap {self.rel_gap:+.1%})")


def combine_breakdowns(breakdowns: Sequence[TTFTBreakdown], weights: Sequence[float]) -> TTFTBreakdown:
    """The weighted mean of breakdowns of one deployment with the same parts: one run measured in
    several windows (the blocks of :mod:`pdlab.workloads.blocks`), each weighted by its number of
    requests, is the breakdown of the whole run."""
    if not breakdowns or len(breakdowns) != len(weights) or sum(weights) <= 0:
        raise ValueError(f"need breakdowns with positive total weight, got {len(breakdowns)} and weights {list(weights)}")
    keys = list(breakdowns[0].parts)
    if any(list(b.parts) != keys for b in breakdowns):
        raise ValueError("breakdowns to combine must have the same parts")
    w = [x / sum(weights) for x in weights]
    return replace(breakdowns[0], client_ttft_s=sum(wi * b.client_ttft_s for wi, b in zip(w, breakdowns, strict=True)),
                   parts={k: sum(wi * b.parts[k] for wi, b in zip(w, breakdowns, strict=True)) for k in keys},
                   notes=[n for b in breakdowns for n in b.notes])


def disaggregated_breakdown(prefill: EngineTimes, decode: EngineTimes, proxy: dict[str, float],
                            client_ttft_s: float, deployment: str = "1P1D", tolerance: float = 0.10) -> TTFTBreakdown:
    """Parts of a disaggregated TTFT from both engines' times and the proxy's (``ProxyTiming`` fields)."""
    parts = {
        "proxy": proxy["own_s"],
        "prefill front end": proxy["prefill_leg_s"] - (prefill.queue_s + prefill.prefill_s + prefill.decode_s),
        "prefill queue": prefill.queue_s,
        "prefill compute": prefill.prefill_s + prefill.decode_s,
        "decode front end": proxy["decode_first_s"] - (decode.queue_s + decode.prefill_s),
        "decode queue": decode.queue_s,
        "KV transfer": decode.kv_transfer_s,
        "decode first step": decode.prefill_s - decode.kv_transfer_s,
    }
    return TTFTBreakdown(deployment, client_ttft_s, parts, tolerance)


def colocated_breakdown(server: EngineTimes, client_ttft_s: float, deployment: str = "colocated",
                        tolerance: float = 0.10) -> TTFTBreakdown:
    """Parts of a colocated TTFT from the server's times and the client's."""
    parts = {
        "front end": client_ttft_s - server.ttft_s,
        "queue": server.queue_s,
        "prefill compute": server.prefill_s,
        "engine overhead": server.ttft_s - server.queue_s - server.prefill_s,
    }
    return TTFTBreakdown(deployment, client_ttft_s, parts, tolerance)


def proxy_timings(proxy_url: str, timeout_s: float = 10.0) -> list[dict[str, float]]:
    """The proxy's per-request timings (``GET /proxy/timings``), oldest first."""
    with urllib.request.urlopen(proxy_url.rstrip("/") + "/proxy/timings", timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _mean_proxy(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = ("own_s", "prefill_leg_s", "decode_first_s", "ttft_s")
    return {k: sum(r[k] for r in rows) / len(rows) for k in keys} if rows else dict.fromkeys(keys, 0.0)


def mean_breakdown(deployment, before: dict[str, MetricsSnapshot], after: dict[str, MetricsSnapshot],
                   client_ttfts_s: Sequence[float], proxy_rows: Sequence[dict[str, float]] = (),
                   tolerance: float = 0.10) -> TTFTBreakdown:
    """Mean TTFT parts over a run, from snapshots (by server URL) taken before and after it.

    ``deployment``: a :class:`pdlab.serve.engines.Deployment`. ``proxy_rows``: the proxy's timings of
    this run's requests (disaggregated only). Means of parts add up to the mean TTFT.
    """
    client = sum(client_ttfts_s) / len(client_ttfts_s) if client_ttfts_s else 0.0
    times = {s.url: engine_times(before[s.url], after[s.url]) for s in deployment.servers}
    if not deployment.prefill:   # colocated: one server, or replicas behind a router (the request-weighted mean)
        return colocated_breakdown(_merge([times[s.url] for s in deployment.servers]), client, deployment.kind,
                                   tolerance)
    p = _merge([times[s.url] for s in deployment.prefill])
    d = _merge([times[s.url] for s in deployment.decode])
    return disaggregated_breakdown(p, d, _mean_proxy(proxy_rows), client, deployment.kind, tolerance)


def _merge(rows: Sequence[EngineTimes]) -> EngineTimes:
    """Request-weighted mean over servers of one role."""
    n = sum(r.requests for r in rows)
    if n == 0:
        return rows[0]
    w = [r.requests / n for r in rows]
    fields = ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s", "kv_transfer_s")
    vals = {f: sum(wi * getattr(r, f) for wi, r in zip(w, rows, strict=True)) for f in fields}
    return EngineTimes(n, kv_transfers=sum(r.kv_transfers for r in rows), **vals)


class BreakdownWindow:
    """Engine and proxy timings of a deployment between ``__enter__`` and ``__exit__``.

    ``with BreakdownWindow(dep) as w: result = run_bench(dep.url, ...)`` then
    ``w.breakdown([r.ttft_s for r in result.records if r.ok])``: the mean TTFT parts of that run.
    """

    def __init__(self, deployment, tolerance: float = 0.10):
        self.deployment = deployment
        self.tolerance = tolerance
        self.before: dict[str, MetricsSnapshot] = {}
        self.after: dict[str, MetricsSnapshot] = {}
        self.proxy_rows: list[dict[str, float]] = []
        self._seen = 0

    def _proxied(self) -> bool:
        """Behind the course's proxy, whose ``/proxy/timings`` the breakdown reads (not vllm-router)."""
        return self.deployment.proxy_port is not None and getattr(self.deployment, "front_door", "proxy") == "proxy"

    def __enter__(self) -> BreakdownWindow:
        self.before = {s.url: scrape_metrics(s.url) for s in self.deployment.servers}
        self._seen = len(proxy_timings(self.deployment.url)) if self._proxied() else 0
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        self.after = {s.url: scrape_metrics(s.url) for s in self.deployment.servers}
        self.proxy_rows = proxy_timings(self.deployment.url)[self._seen:] if self._proxied() else []

    def breakdown(self, client_ttfts_s: Sequence[float]) -> TTFTBreakdown:
        return mean_breakdown(self.deployment, self.before, self.after, client_ttfts_s, self.proxy_rows,
                              self.tolerance)


def probe_breakdowns(deployment, send: Callable[[int], float], n: int = 5,
                     tolerance: float = 0.10, settle_s: float = 0.3) -> list[TTFTBreakdown]:
    """Per-request breakdowns: ``send(i)`` sends request ``i`` alone and returns its client TTFT (s).

    Metrics are scraped around each request, so each breakdown is that one request's. The
    request must be finished when ``send`` returns; ``settle_s`` lets the engines publish it.
    """
    out = []
    for i in range(n):
        with BreakdownWindow(deployment, tolerance) as window:
            ttft = send(i)
            time.sleep(settle_s)
        out.append(window.breakdown([ttft]))
    return out


def streamed_ttft(url: str, model: str, prompt_token_ids: Sequence[int], max_tokens: int = 8,
                  timeout_s: float = 120.0) -> float:
    """Send one streamed completion (prompt as token ids) and return its client TTFT in seconds.

    Raises RuntimeError naming the server's error when the request fails.
    """
    from aiohttp import ClientSession

    from pdlab.serve.client.streaming import run_sync, stream_request

    body = {"model": model, "prompt": list(prompt_token_ids), "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0}

    async def one():
        async with ClientSession() as session:
            t0 = time.perf_counter()
            out = await stream_request(session, url, body, timeout_s=timeout_s)
            return t0, out

    t0, out = run_sync(one())
    if not out.ok or not out.chunk_times:
        raise RuntimeError(f"request to {url} failed: {out.error}")
    return out.chunk_times[0] - t0
