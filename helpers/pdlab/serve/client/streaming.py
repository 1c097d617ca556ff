"""One streamed OpenAI request, timed chunk by chunk — the client side both benchmarks share.

:func:`stream_request` POSTs a completions or chat body with ``stream: true`` and
``stream_options.include_usage`` and notes the ``time.perf_counter()`` of every server-sent event
that carries ``choices``: the timing rule of ``vllm bench serve`` (vLLM's
``benchmarks/lib/endpoint_request_func.py``), where a chunk counts even if its text is empty
and a chunk holding several tokens counts once. It also asks for
``stream_options.continuous_usage_stats`` (vLLM, SGLang): every chunk then carries the running
``usage.completion_tokens``, so the client knows how many tokens each chunk held, which the
timing rule alone cannot tell (an API server that falls behind merges tokens into one chunk). :func:`outcome_record` turns the outcome into a
:class:`pdlab.metrics.RequestRecord` for both :mod:`pdlab.serve.client.bench` (open-loop benchmarks) and
:mod:`pdlab.router.client` (router runs, agent sessions). :func:`run_sync` runs either from plain
code or Jupyter.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import ClientError, ClientSession

from pdlab.metrics import RequestRecord

__all__ = ["StreamOutcome", "stream_request", "chunk_token_counts", "outcome_record", "request_path", "run_sync"]


@dataclass
class StreamOutcome:
    """What one streamed request returned: chunk times (perf_counter s), usage, headers, error.

    ``chunk_tokens`` holds the output tokens each timed chunk carried (from the running
    ``usage.completion_tokens`` of continuous usage stats), or is empty when some chunk did not say."""

    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def request_path(body: dict[str, Any]) -> str:
    """``/v1/chat/completions`` for a body with ``messages``, else ``/v1/completions``."""
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


async def stream_request(session: ClientSession, url: str, body: dict[str, Any], *,
                         timeout_s: float | None = None) -> StreamOutcome:
    """POST ``body`` to ``url`` (the server root) as a stream; never raises for a failed request.

    A non-200 answer, a broken connection, an SSE ``error`` event, a stream without ``[DONE]``,
    no chunk at all, or more than ``timeout_s`` seconds in total set ``error`` to a message that
    names the problem; the chunk times seen until then are kept.
    """
    payload = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    out = StreamOutcome()
    running: list[int | None] = []  # usage.completion_tokens after each timed chunk (None: not said)
    done = False
    buffer = ""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url.rstrip("/") + request_path(body), json=payload) as resp:
                out.headers = dict(resp.headers)
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
                async for raw in resp.content.iter_any():
                    now = time.perf_counter()
                    buffer += raw.decode("utf-8", "replace")
                    while "\n\n" in buffer:
                        message, buffer = buffer.split("\n\n", 1)
                        message = message.strip()
                        if not message or message.startswith(":"):
                            continue
                        chunk = message.removeprefix("data:").strip()
                        if chunk == "[DONE]":
                            done = True
                            continue
                        data = json.loads(chunk)
                        if "error" in data:
                            err = data["error"]
                            raise RuntimeError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
                        usage = data.get("usage") or {}
                        if data.get("choices"):
                            out.chunk_times.append(now)
                            running.append(usage.get("completion_tokens"))
                        if usage:
                            out.usage = usage
        if not done:
            raise RuntimeError("the stream ended before [DONE]")
        if not out.chunk_times:
            raise RuntimeError("no token was streamed")
    except TimeoutError:
        out.error = (f"timed out after {timeout_s:g} s" if timeout_s is not None
                     else "timed out (the client session's time limit)")
    except ClientError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    except (RuntimeError, ValueError, OSError) as exc:
        out.error = str(exc) or type(exc).__name__
    out.chunk_tokens = chunk_token_counts(running)
    return out


def chunk_token_counts(running: list[int | None]) -> list[int]:
    """Tokens per chunk from the running ``usage.completion_tokens`` after each chunk; [] when some
    chunk did not carry it, or the count ever went down (not a running count).

    >>> chunk_token_counts([1, 2, 4, 5]), chunk_token_counts([1, None, 2]), chunk_token_counts([])
    ([1, 1, 2, 1], [], [])
    """
    if not running or any(not isinstance(n, int) for n in running):
        return []
    counts = np.diff(np.asarray(running), prepend=0)
    return [] if (counts < 0).any() else [int(c) for c in counts]


def outcome_record(outcome: StreamOutcome, *, request_id: Any, sent_s: float, prompt_tokens: int = 0,
                   clock0: float = 0.0, extra: dict[str, Any] | None = None) -> RequestRecord:
    """The :class:`~pdlab.metrics.RequestRecord` of one streamed request, as ``vllm bench serve`` keeps it.

    Times are ``perf_counter`` seconds minus ``clock0``; ``sent_s`` is when the request was sent
    (its arrival). TTFT is the first chunk, the request ends at its last content chunk, and every
    chunk is one token time. Output tokens come from the server's ``usage`` (the chunk count
    without it); ``chunk_tokens``, where the server said, how many each chunk held. ``prompt_tokens`` is the client's count, as vLLM's ``prompt_len`` (the server's
    ``usage`` count when none is given); the server's count is ``server_prompt_tokens``.
    A failed request has ``ok=False``, its error, no ``finish_s``, and the chunk times seen until
    it failed. The router's ``X-Route`` header goes to ``instance`` and ``extra["route"]``; the
    course proxy's ``X-Prefill-Seconds`` (its POST to the prefill server until the answer, s) to
    ``extra["prefill_leg_s"]``, so TTFT splits per request into the prefill leg and the rest.
    """
    times = [t - clock0 for t in outcome.chunk_times]
    usage = outcome.usage
    rec = RequestRecord(request_id=request_id, arrival_s=sent_s - clock0, prompt_tokens=int(prompt_tokens),
                        output_tokens=int(usage.get("completion_tokens") or len(times)), ok=outcome.ok,
                        error=outcome.error or "", extra=dict(extra or {}))
    if usage.get("prompt_tokens") is not None:
        rec.server_prompt_tokens = int(usage["prompt_tokens"])
        if not prompt_tokens:
            rec.prompt_tokens = int(usage["prompt_tokens"])
    if times:
        rec.first_token_s, rec.token_times_s = times[0], times
        if len(outcome.chunk_tokens) == len(times):
            rec.chunk_tokens = list(outcome.chunk_tokens)
        if rec.ok:
            rec.finish_s = times[-1]
    rec.instance = outcome.headers.get("X-Route", "")
    if rec.instance:
        rec.extra["route"] = rec.instance
    prefill_leg = next((v for k, v in outcome.headers.items() if k.lower() == "x-prefill-seconds"), None)
    if prefill_leg is not None:
        try:
            rec.extra["prefill_leg_s"] = float(prefill_leg)
        except ValueError:
            rec.extra["prefill_leg_s_unreadable"] = prefill_leg
    return rec


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from plain code, also inside a running loop (Jupyter): then
    in a worker thread with its own loop (servers and clients started in it live and die in it)."""
    import concurrent.futures

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
