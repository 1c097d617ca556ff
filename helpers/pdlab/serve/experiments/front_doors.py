"""Two front doors on the same 1P1D servers: the course's proxy and ``vllm-router`` in PD mode.

:func:`compare_front_doors` puts ``vllm-router --vllm-pd-disaggregation`` in front of the prefill and
decode servers of a running deployment, beside its proxy, and sends the same interference load through
each, taking turns in rounds (the order alternates, so a machine that gets busier or quieter hits both
alike). Then it times one tiny request three ways: the two legs sent by hand, through the proxy,
through the router; the difference is what a front door itself costs per request. Lab 01's appendix
runs it. Nothing starts at import time.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord
from pdlab.process import free_port
from pdlab.serve.client.bench import interference_requests, run_bench
from pdlab.serve.engines.vllm_router import start_vllm_router
from pdlab.serve.proxy import prefill_request

__all__ = ["FrontDoorRun", "compare_front_doors", "p50_ms"]


@dataclass
class FrontDoorRun:
    """What :func:`compare_front_doors` measured.

    ``records`` / ``failed``: each door's requests, all rounds pooled, and how many failed.
    ``tiny_ms``: one tiny request's end-to-end milliseconds, per way (``by hand``, ``proxy``,
    ``vllm-router``). ``router``: the router's ``startup_s``, ``idle_cores`` (fraction of one core
    over ``idle_s``) and ``alive_after_stop``. ``lines``: one summary line per round and door.
    """

    records: dict[str, list[RequestRecord]] = field(default_factory=lambda: {"proxy": [], "vllm-router": []})
    failed: dict[str, int] = field(default_factory=lambda: {"proxy": 0, "vllm-router": 0})
    tiny_ms: dict[str, list[float]] = field(default_factory=lambda: {"by hand": [], "proxy": [], "vllm-router": []})
    router: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def p50_ms(records: list[RequestRecord], metric: str) -> float:
    """Median ``ttft``, ``tpot`` or ``itl`` (gaps between streamed tokens) of the completed records, in ms."""
    if metric == "itl":
        vals = [b - a for r in records if r.ok and r.token_times_s
                for a, b in zip(r.token_times_s[:-1], r.token_times_s[1:], strict=True)]
    elif metric in ("ttft", "tpot"):
        vals = [getattr(r, f"{metric}_s") for r in records if r.ok and getattr(r, f"{metric}_s") is not None]
    else:
        raise ValueError(f"metric must be ttft, tpot or itl, got {metric!r}")
    return float(np.median(vals)) * 1e3 if vals else float("nan")


def _post_json(url: str, body: dict, timeout_s: float = 60.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _by_hand_s(dep, body: dict) -> float:
    """The two legs a front door makes, sent by hand: prefill (max_tokens 1), then decode with its params."""
    t0 = time.perf_counter()
    first = _post_json(dep.prefill[0].url + "/v1/completions", prefill_request(body))
    _post_json(dep.decode[0].url + "/v1/completions", {**body, "kv_transfer_params": first["kv_transfer_params"]})
    return time.perf_counter() - t0


def _through_s(url: str, body: dict) -> float:
    t0 = time.perf_counter()
    _post_json(url + "/v1/completions", body)
    return time.perf_counter() - t0


def compare_front_doors(dep, *, slo: SLO, rate_rps: float, duration_s: float, rounds: int, tiny_requests: int,
                        idle_s: float, short_prompt: int, short_output: int, long_prompt: int,
                        seed: int = 100) -> FrontDoorRun:
    """The same 1P1D servers (``dep``, a running disaggregated deployment) behind its proxy and behind
    ``vllm-router``: ``rounds`` turns of the interference workload at ``rate_rps`` for ``duration_s``
    through each door, then ``tiny_requests`` tiny requests (16 prompt tokens, 2 output tokens)
    each way. Raises :class:`~pdlab.serve.engines.vllm_router.RouterMissingError` without the binary."""
    if not (dep.prefill and dep.decode):
        raise ValueError(f"compare_front_doors needs a disaggregated deployment, got {dep.kind}")
    out = FrontDoorRun()
    served = dep.served_model()
    n = max(4, int(round(rate_rps * duration_s)))
    with start_vllm_router(dep.prefill[0].url, dep.decode[0].url, port=free_port()) as router:
        out.router.update(startup_s=router.startup_s, pid=router.pid)
        time.sleep(1.0)
        out.router["idle_cores"] = router.idle_cpu(idle_s)
        for k in range(rounds):
            order = [("proxy", dep.url), ("vllm-router", router.url)]
            for door, url in (order if k % 2 == 0 else order[::-1]):   # alternate who goes first
                reqs = interference_requests(n, rate_rps, short_prompt=short_prompt, short_output=short_output,
                                             long_prompt=long_prompt, long_output=4, long_every=4,
                                             seed=seed + 2 * k + (door == "proxy"))
                res = run_bench(url, reqs, slo=slo, progress=False, seed=seed + k)
                out.records[door].extend(res.records)
                out.failed[door] += res.summary["failed"]
                out.lines.append(f"round {k + 1}, {door} @ {rate_rps:g} req/s: {res.summary['completed']} completed, "
                                 f"{res.summary['failed']} failed")
        for i in range(tiny_requests):   # distinct prompts: no prefix-cache hit for anyone
            for j, way in enumerate(out.tiny_ms):
                body = {"model": served, "prompt": [300 + 3 * i + j] * 16, "max_tokens": 2,
                        "temperature": 0.0, "ignore_eos": True}
                if way == "by hand":
                    seconds = _by_hand_s(dep, body)
                else:
                    seconds = _through_s(dep.url if way == "proxy" else router.url, body)
                out.tiny_ms[way].append(seconds * 1e3)
    out.router["alive_after_stop"] = router.alive()
    return out
