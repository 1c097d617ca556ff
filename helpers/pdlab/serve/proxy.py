"""The disaggregation proxy: vLLM's ``kv_transfer_params`` protocol on aiohttp, xPyD, round robin.

For each OpenAI request (``/v1/completions``, ``/v1/chat/completions``):

1. send a copy to a prefill server (round robin) with ``max_tokens=1``, ``stream=false`` and
   ``"kv_transfer_params": {"do_remote_decode": true, ...}``: the prefill server computes the
   prompt's KV, keeps it for the decode side and answers with its own ``kv_transfer_params``
   (engine id, block ids, host, port);
2. send the original request to a decode server (round robin) with those ``kv_transfer_params``:
   the decode server pulls the KV (NIXL) or loads it (example connector) instead of recomputing,
   and generates; its answer (streamed or not) goes back to the client unchanged.

This is the protocol of vLLM's ``toy_proxy_server.py`` (examples/online_serving/disaggregated_serving,
vLLM 0.8+). Errors: a malformed request → 400 before any backend is touched; a prefill 4xx is passed
through; a backend that is down or dies → 502/504 within the configured time limits, and a stream
cut mid-way ends with an SSE ``error`` event (never a hang).

Run: ``python -m pdlab.serve.proxy --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

__all__ = ["ProxyConfig", "ProxyTiming", "make_app", "prefill_request", "decode_request", "validate_request", "read_request",
           "attach_client_session", "client_session", "error_response", "health_response", "relay", "ENDPOINTS",
           "main"]

log = logging.getLogger("pdlab.proxy")
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # path → request kind
_SESSION = web.AppKey("session", ClientSession)


@dataclass
class ProxyConfig:
    """Backends and time limits (seconds) of a proxy."""

    prefill_urls: list[str]
    decode_urls: list[str]
    connect_timeout_s: float = 5.0
    prefill_timeout_s: float = 120.0
    read_timeout_s: float = 60.0  # longest silence allowed between chunks from decode
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "ok": 0, "client_errors": 0,
                                                           "backend_errors": 0})
    # Per-request timings of the last ``max_timings`` successful requests (GET /proxy/timings).
    max_timings: int = 10_000
    timings: deque[dict[str, Any]] = field(default_factory=deque)


@dataclass(frozen=True)
class ProxyTiming:
    """Where one proxied request spent its time before its first byte left the proxy (seconds).

    ``own_s``: the proxy's own work (parsing, building both requests); ``prefill_leg_s``: POST to
    the prefill server until its whole answer arrived; ``decode_first_s``: POST to the decode
    server until its first body chunk arrived; ``ttft_s``: request received → first chunk sent on.
    """

    request_id: str
    own_s: float
    prefill_leg_s: float
    decode_first_s: float
    ttft_s: float


class BadRequest(ValueError):
    """The client's request is malformed (→ HTTP 400)."""


def validate_request(kind: str, body: Any) -> dict[str, Any]:
    """Check the minimum a backend needs; raise :class:`BadRequest` naming the problem."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if kind == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)) or (isinstance(prompt, list) and not prompt):
            raise BadRequest("'prompt' must be a non-empty string or list")
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be a non-empty list of objects")
    for key in ("max_tokens", "max_completion_tokens"):
        if key in body and body[key] is not None and (not isinstance(body[key], int) or body[key] < 1):
            raise BadRequest(f"'{key}' must be a positive integer")
    return body


def error_response(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-style JSON error: ``{"error": {"message", "type", "code"}}``."""
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


async def read_request(request: web.Request, stats: dict[str, Any]) -> dict[str, Any] | web.Response:
    """The validated JSON body of an OpenAI request, or a 400 response naming the problem.

    Counts rejected requests in ``stats["client_errors"]``.
    """
    try:
        return validate_request(ENDPOINTS[request.path], await request.json())
    except (json.JSONDecodeError, UnicodeDecodeError):
        stats["client_errors"] += 1
        return error_response(400, "the request body is not valid JSON", "invalid_request_error")
    except BadRequest as exc:
        stats["client_errors"] += 1
        return error_response(400, str(exc), "invalid_request_error")


def attach_client_session(app: web.Application, timeout: ClientTimeout) -> None:
    """Give ``app`` one upstream :class:`ClientSession`, opened at start-up and closed at clean-up."""

    async def on_startup(app: web.Application) -> None:
        app[_SESSION] = ClientSession(timeout=timeout)

    async def on_cleanup(app: web.Application) -> None:
        await app[_SESSION].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)


async def health_response(session: ClientSession, probes: dict[str, str], timeout_s: float) -> web.Response:
    """GET every probe URL (backend → URL); 200 ``ok`` if all answer 200 within ``timeout_s``, else 503."""
    states = {}
    for url, probe in probes.items():
        try:
            async with asyncio.timeout(timeout_s):
                async with session.get(probe) as resp:
                    states[url] = resp.status == 200
        except (ClientError, OSError, TimeoutError):
            states[url] = False
    ok = all(states.values())
    return web.json_response({"status": "ok" if ok else "degraded", "backends": states}, status=200 if ok else 503)


def client_session(request: web.Request) -> ClientSession:
    """The upstream session of the application serving ``request``."""
    return request.app[_SESSION]


async def relay(request: web.Request, url: str, body: dict[str, Any], *, stats: dict[str, Any], who: str,
                error_kind: str, forward_headers: dict[str, str] | None = None,
                response_headers: dict[str, str] | None = None, first_byte_timeout_s: float | None = None,
                on_chunk: Callable[[bytes, float], None] | None = None) -> tuple[web.StreamResponse, bool]:
    """POST ``body`` to ``url + request.path`` and stream the answer back to the client as it arrives.

    The one relay of the P/D proxy's decode leg and the router. Returns ``(response, ok)``:

    - the backend answers 200: its body goes on chunk by chunk (``Content-Type`` kept), the stream
      is ended, ``stats["ok"]`` counted; ``ok`` is True. ``on_chunk(chunk, arrived_s)`` is called after
      each chunk has been written on, with the ``time.perf_counter()`` at which it arrived;
    - the backend answers another status: its body is passed on, a 4xx with its status (counted in
      ``stats["client_errors"]``: the client's request is at fault), anything else as 502
      (``stats["backend_errors"]``);
    - the backend is unreachable or dies before answering → 502, no answer head within
      ``first_byte_timeout_s`` (None: no limit beyond the session's) or silent beyond the session's
      read timeout → 504 (``stats["backend_errors"]``);
    - the backend dies mid-stream: a streaming request (``"stream": true``) ends with an SSE ``error``
      event, ``ok`` is False (``stats["backend_errors"]``); the client never hangs.

    ``response_headers`` go on every answer, success or error; ``who`` names the backend in error
    messages (``"decode server"``), ``error_kind`` is the error's ``type``.
    """
    stream = bool(body.get("stream"))
    headers = dict(response_headers or {})
    response: web.StreamResponse | None = None
    try:
        async with asyncio.timeout(first_byte_timeout_s):
            resp = await client_session(request).post(url + request.path, json=body, headers=forward_headers)
        async with resp:
            if resp.status != 200:
                payload = await resp.read()
                client_fault = 400 <= resp.status < 500
                stats["client_errors" if client_fault else "backend_errors"] += 1
                return web.Response(status=resp.status if client_fault else 502, body=payload,
                                    content_type="application/json", headers=headers), False
            response = web.StreamResponse(status=200, headers={
                "Content-Type": resp.headers.get("Content-Type", "application/json"), **headers})
            await response.prepare(request)
            async for chunk in resp.content.iter_any():
                arrived = time.perf_counter()
                await response.write(chunk)
                if on_chunk is not None:
                    on_chunk(chunk, arrived)
    except (ClientError, OSError, TimeoutError) as exc:
        stats["backend_errors"] += 1
        message = f"{who} {url} failed: {type(exc).__name__}: {exc}"
        if response is None:
            err = error_response(504 if isinstance(exc, TimeoutError) else 502, message, error_kind)
            err.headers.update(headers)
            return err, False
        if stream:  # headers already sent: end the stream with an error event
            event = {"error": {"message": message, "type": error_kind, "code": 502}}
            try:
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
            except (ConnectionError, RuntimeError):
                pass
        return response, False
    stats["ok"] += 1
    await response.write_eof()
    return response, True


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request the prefill server gets: one token, no streaming, ``do_remote_decode``."""
    req = copy.deepcopy(body)
    req["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                 "remote_engine_id": None, "remote_block_ids": None,
                                 "remote_host": None, "remote_port": None}
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    req["stream"] = False
    for key in ("stream_options", "min_tokens"):
        req.pop(key, None)
    return req


def decode_request(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The request the decode server gets: the client's, plus the prefill's ``kv_transfer_params``."""
    req = copy.deepcopy(body)
    if kv_transfer_params:
        req["kv_transfer_params"] = kv_transfer_params
    return req


def _error(status: int, message: str, kind: str = "proxy_error") -> web.Response:
    return error_response(status, message, kind)


def make_app(config: ProxyConfig) -> web.Application:
    """The aiohttp application (also used directly by tests with aiohttp's test client)."""
    if not config.prefill_urls or not config.decode_urls:
        raise ValueError("a disaggregation proxy needs at least one prefill and one decode URL")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    prefill_rr = itertools.cycle(range(len(config.prefill_urls)))
    decode_rr = itertools.cycle(range(len(config.decode_urls)))
    timeout = ClientTimeout(total=None, connect=config.connect_timeout_s, sock_connect=config.connect_timeout_s,
                            sock_read=config.read_timeout_s)
    # Prefill answers once, after the whole prompt: bounded by its total time, not by silence.
    prefill_timeout = ClientTimeout(total=config.prefill_timeout_s, connect=config.connect_timeout_s,
                                    sock_connect=config.connect_timeout_s)

    attach_client_session(app, timeout)

    async def handle(request: web.Request) -> web.StreamResponse:
        t_in = time.perf_counter()
        config.stats["requests"] += 1
        body = await read_request(request, config.stats)
        if isinstance(body, web.Response):
            return body
        session = client_session(request)
        p_url = config.prefill_urls[next(prefill_rr)]
        d_url = config.decode_urls[next(decode_rr)]
        request_id = request.headers.get("X-Request-Id") or str(uuid.uuid4())
        headers = {"X-Request-Id": request_id}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        # 1. prefill
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(config.prefill_timeout_s):
                async with session.post(p_url + request.path, json=prefill_request(body), headers=headers,
                                        timeout=prefill_timeout) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        config.stats["backend_errors" if resp.status >= 500 else "client_errors"] += 1
                        status = resp.status if 400 <= resp.status < 500 else 502
                        return web.Response(status=status, body=payload, content_type="application/json")
                    kv_params = json.loads(payload).get("kv_transfer_params")
        except TimeoutError:
            config.stats["backend_errors"] += 1
            return _error(504, f"prefill server {p_url} did not answer within {config.prefill_timeout_s:g} s")
        except (ClientError, OSError, json.JSONDecodeError) as exc:
            config.stats["backend_errors"] += 1
            return _error(502, f"prefill server {p_url} failed: {type(exc).__name__}: {exc}")
        prefill_s = time.perf_counter() - t0
        # 2. decode, streamed back as it arrives
        t_decode = time.perf_counter()
        first_chunk = True

        def record_timing(chunk: bytes, arrived: float) -> None:
            nonlocal first_chunk
            if not first_chunk:
                return
            first_chunk = False
            decode_first_s = arrived - t_decode
            ttft_s = time.perf_counter() - t_in
            config.timings.append(asdict(ProxyTiming(
                request_id, own_s=ttft_s - prefill_s - decode_first_s, prefill_leg_s=prefill_s,
                decode_first_s=decode_first_s, ttft_s=ttft_s)))
            while len(config.timings) > config.max_timings:
                config.timings.popleft()

        response, _ = await relay(
            request, d_url, decode_request(body, kv_params), stats=config.stats, who="decode server",
            error_kind="proxy_error", forward_headers=headers, on_chunk=record_timing,
            response_headers={"X-Request-Id": request_id, "X-Prefill-Seconds": f"{prefill_s:.6f}",
                              "X-Prefill-Url": p_url, "X-Decode-Url": d_url})
        return response

    async def health(request: web.Request) -> web.Response:
        probes = {url: url + "/health" for url in config.prefill_urls + config.decode_urls}
        return await health_response(client_session(request), probes, config.connect_timeout_s)

    async def models(request: web.Request) -> web.Response:
        session = client_session(request)
        url = config.decode_urls[0]
        try:
            async with asyncio.timeout(config.connect_timeout_s * 2):
                async with session.get(url + "/v1/models") as resp:
                    return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")
        except (ClientError, OSError, TimeoutError) as exc:
            return _error(502, f"decode server {url} failed: {type(exc).__name__}: {exc}")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({**config.stats, "prefill": config.prefill_urls, "decode": config.decode_urls})

    async def timings(request: web.Request) -> web.Response:
        return web.json_response(list(config.timings))

    for path in ENDPOINTS:
        app.router.add_post(path, handle)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/proxy/stats", stats)
    app.router.add_get("/proxy/timings", timings)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pdlab.serve.proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill", nargs="+", required=True, help="prefill server URLs")
    parser.add_argument("--decode", nargs="+", required=True, help="decode server URLs")
    parser.add_argument("--read-timeout", type=float, default=60.0, help="seconds of silence from decode allowed")
    parser.add_argument("--connect-timeout", type=float, default=5.0)
    parser.add_argument("--prefill-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ProxyConfig([u.rstrip("/") for u in args.prefill], [u.rstrip("/") for u in args.decode],
                         connect_timeout_s=args.connect_timeout, prefill_timeout_s=args.prefill_timeout,
                         read_timeout_s=args.read_timeout)
    web.run_app(make_app(config), host=args.host, port=args.port, access_log=None,
                print=lambda msg: print(msg, flush=True))


if __name__ == "__main__":  # pragma: no cover
    main()
