"""Drive a live endpoint with streamed requests: open-loop arrivals or closed-loop agent sessions.

Each request is sent with ``stream: true`` (and ``stream_options.include_usage``); the time of every
streamed chunk is recorded, so a :class:`pdlab.metrics.RequestRecord` gets TTFT, TPOT and ITL as
``vllm bench serve`` defines them (a chunk that carries several tokens counts as one gap). The
``X-Route`` header of the router lands in ``record.instance`` and ``record.extra["route"]``.

- :func:`run_open_loop` — send bodies at given arrival times (Poisson, a trace), never waiting for
  answers: the load does not adapt to the server (the honest way to measure latency against rate);
- :func:`run_sessions` — agent sessions: a session's next turn is sent ``think_time_s`` after the
  previous answer ended (closed loop within a session; sessions start at their own times).

``prefix_caching=False`` adds a unique ``cache_salt`` to every request (vLLM ≥ 0.9): the engine
then finds no shared prefix, as if prefix caching were off, without restarting the server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import ClientSession, ClientTimeout

from pdlab.metrics import RequestRecord
from pdlab.serve.client.streaming import outcome_record, run_sync, stream_request

__all__ = ["send_streaming", "run_open_loop", "run_sessions", "chat_body", "run_sync"]


def chat_body(messages: list[dict[str, str]], max_tokens: int, *, model: str | None = None,
              exact_length: bool = True, prefix_caching: bool = True, **extra: Any) -> dict[str, Any]:
    """A streamed chat-completions body; ``exact_length`` asks vLLM for exactly ``max_tokens`` tokens
    (``min_tokens`` + ``ignore_eos``, vLLM extensions) so the output lengths follow the workload."""
    body: dict[str, Any] = {"messages": messages, "max_tokens": int(max_tokens), "temperature": 0.0}
    if model:
        body["model"] = model
    if exact_length:
        body["min_tokens"] = int(max_tokens)
        body["ignore_eos"] = True
    if not prefix_caching:
        body["cache_salt"] = uuid.uuid4().hex
    body.update(extra)
    return body


async def send_streaming(session: ClientSession, url: str, body: dict[str, Any], *, request_id: Any,
                         prompt_tokens: int = 0, clock0: float = 0.0, extra: dict[str, Any] | None = None
                         ) -> RequestRecord:
    """POST ``body`` (chat if it has ``messages``, else completions) with streaming; return its record.

    Times are ``time.perf_counter() - clock0``; the record is made by :func:`pdlab.serve.client.streaming.outcome_record`.
    A failed request (non-200, broken connection, SSE ``error`` event) gives ``ok=False`` with the message.
    """
    sent = time.perf_counter()
    outcome = await stream_request(session, url, body)
    return outcome_record(outcome, request_id=request_id, sent_s=sent, prompt_tokens=prompt_tokens,
                          clock0=clock0, extra=extra)


def _session(timeout_s: float) -> ClientSession:
    from aiohttp import TCPConnector

    return ClientSession(timeout=ClientTimeout(total=timeout_s), connector=TCPConnector(limit=0))


async def run_open_loop(url: str, bodies: Sequence[dict[str, Any]], arrivals_s: Sequence[float], *,
                        prompt_tokens: Sequence[int] | None = None, timeout_s: float = 300.0,
                        extras: Sequence[dict[str, Any]] | None = None) -> list[RequestRecord]:
    """Send ``bodies[i]`` at ``arrivals_s[i]`` seconds from now; records in request order."""
    if len(bodies) != len(arrivals_s):
        raise ValueError("need one arrival time per body")
    async with _session(timeout_s) as session:
        clock0 = time.perf_counter()

        async def one(i: int) -> RequestRecord:
            delay = arrivals_s[i] - (time.perf_counter() - clock0)
            if delay > 0:
                await asyncio.sleep(delay)
            return await send_streaming(session, url, bodies[i], request_id=i, clock0=clock0,
                                        prompt_tokens=prompt_tokens[i] if prompt_tokens is not None else 0,
                                        extra=extras[i] if extras is not None else None)

        return list(await asyncio.gather(*(one(i) for i in range(len(bodies)))))


async def run_sessions(url: str, turns: Sequence[dict[str, Any]], *, model: str | None = None,
                       prefix_caching: bool = True, think_scale: float = 1.0, start_scale: float = 1.0,
                       timeout_s: float = 300.0) -> list[RequestRecord]:
    """Replay agent sessions (dicts from :func:`pdlab.workloads.agentic.text_requests`), closed loop per session.

    A session starts at its first turn's ``arrival_s`` × ``start_scale``; each later turn waits
    ``think_time_s`` × ``think_scale`` after the previous answer. Records are in ``turns`` order;
    ``extra`` holds ``session_id`` and ``turn``.
    """
    by_session: dict[int, list[int]] = {}
    for i, t in enumerate(turns):
        by_session.setdefault(t["session_id"], []).append(i)
    out: list[RequestRecord | None] = [None] * len(turns)
    async with _session(timeout_s) as session:
        clock0 = time.perf_counter()

        async def run(idx: list[int]) -> None:
            idx = sorted(idx, key=lambda i: turns[i]["turn"])
            start = turns[idx[0]]["arrival_s"] * start_scale
            delay = start - (time.perf_counter() - clock0)
            if delay > 0:
                await asyncio.sleep(delay)
            for n, i in enumerate(idx):
                t = turns[i]
                if n:
                    await asyncio.sleep(t["think_time_s"] * think_scale)
                body = chat_body(t["messages"], t["max_tokens"], model=model, prefix_caching=prefix_caching)
                rec = await send_streaming(session, url, body, request_id=i, prompt_tokens=t["prompt_tokens"],
                                           clock0=clock0, extra={"session_id": t["session_id"], "turn": t["turn"]})
                out[i] = rec

        await asyncio.gather(*(run(idx) for idx in by_session.values()))
    return [r for r in out if r is not None]
