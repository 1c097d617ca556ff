"""A STAND-IN SGLang worker: speaks enough of SGLang's HTTP API for ``smg`` to route to it.

**It is not an inference engine.** SGLang cannot run on a CPU-only machine (its PyPI wheels pin
CUDA builds), so lab 02 puts these stand-ins behind the *real* ``smg`` (Shepherd Model Gateway) in
PD mode to show, on the wire, what the gateway does: it probes the workers, picks a prefill and a
decode worker per request, adds ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` to the
request and sends it to *both*; the prefill worker would push the KV to the decode worker identified
by that room, and the gateway returns the decode worker's answer.

A prefill stand-in given ``--bootstrap-port`` also listens there, as SGLang's prefill server's KV
bootstrap service does (smg checks at registration that the port accepts connections); it answers
``/health`` and serves no KV.

Every request a stand-in receives is appended to a JSON-lines *wire log* (path, body, time).
The decode stand-in streams ``max_tokens`` filler tokens at a fixed pace (``--token-interval``);
the prefill stand-in answers after ``--prefill-delay`` seconds. Both say ``"stand-in": true`` in
every answer.

Run: ``python -m pdlab.serve.engines.standin --role decode --port 31002 --wire-log build/serve/d.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

__all__ = ["make_standin_app", "read_wire_log", "main"]

_MODEL = "stand-in (no model: SGLang does not run on this CPU)"


def read_wire_log(path: str | Path) -> list[dict]:
    """The requests a stand-in recorded, oldest first."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _requested_tokens(body: dict, native: bool) -> int:
    """Tokens asked for: SGLang's native ``sampling_params.max_new_tokens`` or OpenAI's ``max_tokens``."""
    if native:
        params = body.get("sampling_params") or {}
        return int(params.get("max_new_tokens", 16))
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)


def _whole_answer(n_tokens: int, native: bool, chat: bool) -> dict:
    """A non-streamed answer of ``n_tokens`` filler tokens (native, chat or text completion)."""
    text = " tok" * n_tokens
    if native:
        return {"text": text, "stand-in": True, "meta_info": {
            "completion_tokens": n_tokens, "prompt_tokens": 0, "finish_reason": {"type": "length"}}}
    choice = {"index": 0, "finish_reason": "length"}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return {"object": "chat.completion" if chat else "text_completion", "stand-in": True, "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": n_tokens}}


def _stream_chunk(i: int, native: bool, chat: bool) -> dict:
    """The ``i``-th streamed event (native: the text so far; OpenAI: one token's delta)."""
    if native:
        return {"text": " tok" * (i + 1), "meta_info": {"completion_tokens": i + 1}}
    if chat:
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " tok"}}]}
    return {"object": "text_completion", "choices": [{"index": 0, "text": " tok"}]}


async def _stream_answer(request: web.Request, body: dict, n_tokens: int, native: bool, chat: bool,
                         token_interval_s: float) -> web.StreamResponse:
    """Server-sent events: one filler token every ``token_interval_s``, usage if asked (on every
    chunk too with ``continuous_usage_stats``, as vLLM), then ``[DONE]``."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    options = body.get("stream_options") or {}
    running = not native and options.get("include_usage") and options.get("continuous_usage_stats")
    for i in range(n_tokens):
        await asyncio.sleep(token_interval_s)
        chunk = _stream_chunk(i, native, chat)
        if running:
            chunk["usage"] = {"prompt_tokens": 0, "completion_tokens": i + 1}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    if not native and options.get("include_usage"):
        usage = {"choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": n_tokens}}
        await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_standin_app(role: str, wire_log: str | Path, *, token_interval_s: float = 0.005,
                     prefill_delay_s: float = 0.01, bootstrap_port: int | None = None,
                     bootstrap_host: str | None = None) -> web.Application:
    """The aiohttp app of one stand-in worker (``role``: ``prefill`` or ``decode``). With ``bootstrap_host``
    (prefill only) the app also listens on ``bootstrap_host:bootstrap_port`` while it runs."""
    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be prefill or decode, got {role!r}")
    log_path = Path(wire_log)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def record(request: web.Request, body) -> None:
        with open(log_path, "a") as fh:
            fh.write(json.dumps({"t": time.time(), "role": role, "method": request.method, "path": request.path,
                                 "body": body}) + "\n")

    async def info(request: web.Request) -> web.Response:
        record(request, None)
        return web.json_response({
            "stand-in": True, "model_path": _MODEL, "tokenizer_path": _MODEL, "is_generation": True,
            "served_model_name": "stand-in", "disaggregation_mode": role,
            "disaggregation_bootstrap_port": bootstrap_port, "max_total_num_tokens": 1_000_000,
            "version": "stand-in"})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stand-in", "object": "model",
                                                              "root": "stand-in", "owned_by": "pdlab"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "invalid JSON"}}, status=400)
        record(request, body)
        native = request.path == "/generate"
        n_tokens = _requested_tokens(body, native)
        if role == "prefill":
            await asyncio.sleep(prefill_delay_s)
            n_tokens = 1
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            await asyncio.sleep(token_interval_s * n_tokens)
            return web.json_response(_whole_answer(n_tokens, native, chat))
        return await _stream_answer(request, body, n_tokens, native, chat, token_interval_s)

    app = web.Application()
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        app.router.add_get(path, info)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, health)
    app.router.add_get("/v1/models", models)
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        app.router.add_post(path, generate)
    if bootstrap_host is not None:
        if role != "prefill" or bootstrap_port is None:
            raise ValueError("a bootstrap listener needs role prefill and a bootstrap_port")
        app.cleanup_ctx.append(_bootstrap_listener(bootstrap_host, bootstrap_port))
    return app


def _bootstrap_listener(host: str, port: int):
    """An aiohttp cleanup context: a bare listener on the KV bootstrap port for the app's lifetime."""

    async def listen(app: web.Application):
        bootstrap = web.Application()
        bootstrap.router.add_get("/health", lambda request: web.Response(text="stand-in: no KV bootstrap"))
        runner = web.AppRunner(bootstrap, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        yield
        await runner.cleanup()

    return listen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pdlab.serve.engines.standin", description=__doc__.splitlines()[0])
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--wire-log", required=True, help="JSON-lines file of every request received")
    parser.add_argument("--token-interval", type=float, default=0.005, help="seconds per streamed token (decode)")
    parser.add_argument("--prefill-delay", type=float, default=0.01, help="seconds per prefill answer")
    parser.add_argument("--bootstrap-port", type=int,
                        help="reported in /server_info and listened on (prefill; SGLang's KV bootstrap port)")
    args = parser.parse_args(argv)
    if args.bootstrap_port is not None and args.role != "prefill":
        parser.error("--bootstrap-port is for --role prefill")
    app = make_standin_app(args.role, args.wire_log, token_interval_s=args.token_interval,
                           prefill_delay_s=args.prefill_delay, bootstrap_port=args.bootstrap_port,
                           bootstrap_host=args.host if args.bootstrap_port is not None else None)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=lambda m: print(m, flush=True))


if __name__ == "__main__":  # pragma: no cover
    main()
