"""HTTP plumbing shared by the P/D proxy (:mod:`pdlab.serve.proxy`) and the router (:mod:`pdlab.router.server`).

An OpenAI-style front end on aiohttp needs the same few parts whatever it does with a request:
validate the body (400 naming the problem before any backend is touched), one upstream
:class:`~aiohttp.ClientSession` per application, a health probe of its backends, and a relay that
streams a backend's answer back. :func:`backend_status` is the one place that decides what a
backend's non-200 answer becomes: a 4xx is the client's request at fault and passes through with
its status; anything else (3xx, 5xx) is the backend's fault and becomes 502.

Counters live in a plain ``stats`` dict (served as JSON): ``requests``, ``ok``, ``client_errors``,
``backend_errors`` (:func:`new_stats`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

__all__ = ["ENDPOINTS", "BadRequest", "validate_request", "error_response", "read_request", "new_stats",
           "backend_status", "backend_error_response", "forwarded_headers", "attach_client_session", "relay_app",
           "client_session", "health_response", "relay"]

ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # path → request kind
_SESSION = web.AppKey("session", ClientSession)


class BadRequest(ValueError):
    """The client's request is malformed (→ HTTP 400)."""


def validate_request(kind: str, body: Any) -> dict[str, Any]:
    """Check the minimum a backend needs; raise :class:`BadRequest` naming the problem.

    >>> validate_request("completions", {"prompt": "hi", "max_tokens": 8})["max_tokens"]
    8
    >>> validate_request("chat", {"messages": "hi"})
    Traceback (most recent call last):
    ...
    pdlab.serve.proxy.plumbing.BadRequest: 'messages' must be a non-empty list of objects
    """
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
        if key in body and body[key] is not None and (isinstance(body[key], bool) or not isinstance(body[key], int)
                                                      or body[key] < 1):
            raise BadRequest(f"'{key}' must be a positive integer, got {body[key]!r}")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest(f"'stream_options' must be an object such as {{\"include_usage\": true}}, got {options!r}")
        if not body.get("stream"):
            raise BadRequest("'stream_options' is only allowed with \"stream\": true")
        wrong = {k: v for k, v in options.items() if not isinstance(v, bool)}
        if wrong:
            raise BadRequest(f"'stream_options' values must be true or false, got {wrong}")
    return body


def new_stats(**extra: Any) -> dict[str, Any]:
    """A fresh counter dict: ``requests``, ``ok``, ``client_errors``, ``backend_errors`` (plus ``extra``)."""
    return {"requests": 0, "ok": 0, "client_errors": 0, "backend_errors": 0, **extra}


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-style JSON error: ``{"error": {"message", "type", "code"}}``, with ``headers`` on it."""
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status,
                             headers=headers)


def backend_status(status: int) -> tuple[int, str]:
    """What a backend's answer ``status`` becomes: ``(status the client gets, stats counter)``.

    >>> backend_status(200), backend_status(422), backend_status(307), backend_status(503)
    ((200, 'ok'), (422, 'client_errors'), (502, 'backend_errors'), (502, 'backend_errors'))
    """
    if status == 200:
        return 200, "ok"
    if 400 <= status < 500:
        return status, "client_errors"
    return 502, "backend_errors"


def backend_error_response(status: int, payload: bytes, stats: dict[str, Any],
                           headers: dict[str, str] | None = None) -> web.Response:
    """Pass a backend's non-200 answer on as :func:`backend_status` decides, counted in ``stats``."""
    answer, counter = backend_status(status)
    stats[counter] += 1
    return web.Response(status=answer, body=payload, content_type="application/json", headers=headers)


def forwarded_headers(request: web.Request) -> dict[str, str]:
    """The client's headers that go on to a backend: ``Authorization`` and ``X-Request-Id`` when present."""
    return {k: v for k, v in request.headers.items() if k in ("Authorization", "X-Request-Id")}


async def read_request(request: web.Request, stats: dict[str, Any]) -> dict[str, Any] | web.Response:
    """The validated JSON body of an OpenAI request, or a 400 response naming the problem.

    Counts rejected requests in ``stats["client_errors"]``.
    """
    try:
        text = (await request.read()).decode("utf-8")
        return validate_request(ENDPOINTS[request.path], json.loads(text))
    except UnicodeDecodeError as exc:
        stats["client_errors"] += 1
        return error_response(400, f"the request body is not valid UTF-8 (byte {exc.start}): JSON must be UTF-8",
                              "invalid_request_error")
    except json.JSONDecodeError as exc:
        stats["client_errors"] += 1
        return error_response(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} "
                              f"column {exc.colno})", "invalid_request_error")
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


def relay_app(handle: Any, health: Any, *, connect_timeout_s: float, read_timeout_s: float | None) -> web.Application:
    """An aiohttp application that relays: ``handle`` on every path of :data:`ENDPOINTS`,
    ``health`` on ``/health``, and one upstream session whose reads time out after
    ``read_timeout_s`` of silence (s; no total limit: a stream lasts as long as it talks).
    The caller adds its own GET routes."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    attach_client_session(app, ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s,
                                             sock_read=read_timeout_s))
    for path in ENDPOINTS:
        app.router.add_post(path, handle)
    app.router.add_get("/health", health)
    return app


def client_session(request: web.Request) -> ClientSession:
    """The upstream session of the application serving ``request``."""
    return request.app[_SESSION]


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


async def _stream_error_event(response: web.StreamResponse, message: str, kind: str) -> None:
    """End a stream whose headers are already sent with an SSE ``error`` event (best effort)."""
    event = {"error": {"message": message, "type": kind, "code": 502}}
    try:
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    except (ConnectionError, RuntimeError):
        pass


async def relay(request: web.Request, url: str, body: dict[str, Any], *, stats: dict[str, Any], who: str,
                error_kind: str, forward_headers: dict[str, str] | None = None,
                response_headers: dict[str, str] | None = None, first_byte_timeout_s: float | None = None,
                on_chunk: Callable[[bytes, float], None] | None = None) -> tuple[web.StreamResponse, bool]:
    """POST ``body`` to ``url + request.path`` and stream the answer back to the client as it arrives.

    The one relay of the P/D proxy's decode leg and the router. Returns ``(response, ok)``:

    - the backend answers 200: its body goes on chunk by chunk (``Content-Type`` kept), the stream
      is ended, ``stats["ok"]`` counted; ``ok`` is True. ``on_chunk(chunk, arrived_s)`` is called after
      each chunk has been written on, with the ``time.perf_counter()`` at which it arrived;
    - the backend answers another status: its body is passed on as :func:`backend_status` decides
      (a 4xx with its status, anything else as 502), counted in ``stats``;
    - the backend is unreachable or dies before answering → 502, no answer head within
      ``first_byte_timeout_s`` (None: no limit beyond the session's) or silent beyond the session's
      read timeout → 504 (``stats["backend_errors"]``);
    - the backend dies mid-stream: a streaming request (``"stream": true``) ends with an SSE ``error``
      event, ``ok`` is False (``stats["backend_errors"]``); the client never hangs.

    ``response_headers`` go on every answer, success or error; ``who`` names the backend in error
    messages (``"decode server"``), ``error_kind`` is the error's ``type``.
    """
    headers = dict(response_headers or {})
    response: web.StreamResponse | None = None
    try:
        async with asyncio.timeout(first_byte_timeout_s):
            resp = await client_session(request).post(url + request.path, json=body, headers=forward_headers)
        async with resp:
            if resp.status != 200:
                return backend_error_response(resp.status, await resp.read(), stats, headers), False
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
            return error_response(504 if isinstance(exc, TimeoutError) else 502, message, error_kind, headers), False
        if body.get("stream"):  # headers already sent: end the stream with an error event
            await _stream_error_event(response, message, error_kind)
        return response, False
    stats["ok"] += 1
    await response.write_eof()
    return response, True
