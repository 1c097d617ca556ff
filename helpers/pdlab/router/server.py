"""The live router: an aiohttp server in front of colocated servers and a prefill/decode pair.

For every OpenAI request (``/v1/completions``, ``/v1/chat/completions``) it

1. validates the body (a malformed one gets 400 before any backend is touched; the checks are the
   disaggregation proxy's, :func:`pdlab.serve.proxy.validate_request`);
2. counts the prompt's tokens (the model's tokenizer when given, else ≈ 4 characters per token)
   and predicts the output length (:mod:`pdlab.router.policies` predictors; the key is the hash
   of the first message or the first 2,048 prompt characters — the agent's system prompt);
3. asks the routing policy for ``colocated`` or ``disaggregated`` — with latency estimates from
   the router's own count of its in-flight requests per backend when the policy wants them;
4. forwards the request unchanged to the least busy colocated server, or to the P/D proxy
   (:mod:`pdlab.serve.proxy`, which speaks vLLM's ``kv_transfer_params`` protocol), and streams
   the answer back with ``X-Route`` and ``X-Predicted-Output-Tokens`` headers;
5. when the answer ends, feeds the real output length (``usage.completion_tokens``, else the
   number of streamed chunks) back to the predictor.

Errors: backend refused or died → 502, backend silent beyond the time limits → 504, a stream cut
mid-way ends with an SSE ``error`` event; never a hang. ``GET /health`` (503 when a backend is
down), ``GET /router/stats`` (decisions, errors, predictor state).

Run: ``pdlab router serve --colocated http://127.0.0.1:8100 --disaggregated http://127.0.0.1:8000
--policy threshold --prompt-threshold 512``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientTimeout, web

from pdlab.router.policies import (
    LoadEstimator,
    OutputPredictor,
    RouteRequest,
    RoutingPolicy,
    TargetLoad,
)
from pdlab.serve.proxy import (
    ENDPOINTS,
    attach_client_session,
    client_session,
    error_response,
    health_response,
    read_request,
    relay,
)

__all__ = ["RouterConfig", "RouterServer", "make_router_app", "prompt_counter", "request_key", "InFlight"]



def request_key(body: dict[str, Any]) -> Hashable:
    """The predictor key of a request: a hash of its first message (the system prompt) or of the
    first 2,048 characters of the prompt."""
    if "messages" in body:
        first = body["messages"][0].get("content", "")
        text = first if isinstance(first, str) else json.dumps(first)
    else:
        prompt = body.get("prompt", "")
        text = prompt[:2048] if isinstance(prompt, str) else json.dumps(prompt)[:2048]
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def prompt_counter(tokenizer: Any = None) -> Callable[[dict[str, Any]], int]:
    """A function body → prompt tokens. With a tokenizer (a model folder path or a loaded Hugging
    Face tokenizer) chat prompts are rendered with its chat template; without, ≈ 4 characters per
    token (plus 4 per chat message)."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def count(body: dict[str, Any]) -> int:
        if "messages" in body:
            if tokenizer is not None and getattr(tokenizer, "chat_template", None):
                ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
                return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
            text = "".join(m.get("content", "") if isinstance(m.get("content", ""), str) else "" for m in body["messages"])
            if tokenizer is not None:
                return len(tokenizer.encode(text, add_special_tokens=False)) + 4 * len(body["messages"])
            return len(text) // 4 + 4 * len(body["messages"])
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return len(prompt)
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        if tokenizer is not None:
            return len(tokenizer.encode(text, add_special_tokens=False))
        return max(1, len(text) // 4)

    return count


@dataclass
class InFlight:
    """The router's view of one backend: its requests before the first token (prefill) and after."""

    prefill_tokens: float = 0.0
    prefill_sq_tokens: float = 0.0
    decode_batch: int = 0
    decode_ctx_tokens: float = 0.0
    requests: int = 0

    def load(self) -> TargetLoad:
        return TargetLoad(self.prefill_tokens, self.prefill_sq_tokens, self.decode_batch, self.decode_ctx_tokens)


@dataclass
class RouterConfig:
    """Backends, policy, predictor, estimator (for policies that want estimates) and time limits (s).

    ``colocated_urls``: colocated vLLM servers; ``disaggregated_url``: the P/D proxy. Either may be
    empty, then every request goes to the other (a misconfigured router with neither is refused).
    """

    colocated_urls: list[str]
    disaggregated_url: str | None
    policy: RoutingPolicy
    predictor: OutputPredictor
    estimator: LoadEstimator | None = None
    count_prompt: Callable[[dict[str, Any]], int] = field(default_factory=prompt_counter)
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 120.0
    read_timeout_s: float = 60.0
    stats: dict[str, Any] = field(default_factory=lambda: {
        "requests": 0, "ok": 0, "client_errors": 0, "backend_errors": 0,
        "routes": {"colocated": 0, "disaggregated": 0}})


def _error(status: int, message: str, kind: str = "router_error") -> web.Response:
    return error_response(status, message, kind)


def _count_output(chunks: bytes, stream: bool) -> int | None:
    """Completion tokens from the body: ``usage.completion_tokens`` if present, else (streams) the
    number of ``data:`` chunks that carry text."""
    text = chunks.decode(errors="replace")
    if not stream:
        try:
            return int(json.loads(text)["usage"]["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            return None
    n = 0
    usage = None
    for line in text.splitlines():
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        try:
            obj = json.loads(line[5:])
        except ValueError:
            continue
        if obj.get("usage") and obj["usage"].get("completion_tokens") is not None:
            usage = int(obj["usage"]["completion_tokens"])
        for ch in obj.get("choices", []):
            if ch.get("text") or (ch.get("delta") or {}).get("content"):
                n += 1
    return usage if usage is not None else n


def make_router_app(config: RouterConfig) -> web.Application:
    """The aiohttp application (tests drive it with aiohttp's test client)."""
    if not config.colocated_urls and not config.disaggregated_url:
        raise ValueError("a router needs at least one colocated URL or a disaggregated (P/D proxy) URL")
    if config.policy.needs_estimates and config.estimator is None:
        raise ValueError(f"policy {config.policy.name!r} needs a LoadEstimator (latency models of the backends)")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    backends = list(config.colocated_urls) + ([config.disaggregated_url] if config.disaggregated_url else [])
    inflight = {url: InFlight() for url in backends}
    # the P/D pair is one target with two loads: the prefill queue and the decode batch
    pd_prefill, pd_decode = InFlight(), InFlight()
    timeout = ClientTimeout(total=None, connect=config.connect_timeout_s, sock_connect=config.connect_timeout_s,
                            sock_read=config.read_timeout_s)

    attach_client_session(app, timeout)

    def decide(body: dict[str, Any]) -> tuple[str, str, RouteRequest]:
        p = int(config.count_prompt(body))
        key = request_key(body)
        rr = RouteRequest(p, config.predictor.predict(p, key), key)
        coloc = min(config.colocated_urls, key=lambda u: (inflight[u].prefill_tokens, inflight[u].requests)) \
            if config.colocated_urls else None
        estimates = None
        if config.policy.needs_estimates and coloc and config.disaggregated_url:
            est = config.estimator
            estimates = {"colocated": est.colocated(rr, inflight[coloc].load()),
                         "disaggregated": est.disaggregated(rr, pd_prefill.load(), pd_decode.load())}
        target = config.policy.decide(rr, estimates)
        if target == "colocated" and coloc is None:
            target = "disaggregated"
        if target == "disaggregated" and not config.disaggregated_url:
            target = "colocated"
        url = coloc if target == "colocated" else config.disaggregated_url
        return target, url, rr

    async def handle(request: web.Request) -> web.StreamResponse:
        config.stats["requests"] += 1
        body = await read_request(request, config.stats)
        if isinstance(body, web.Response):
            return body
        try:
            target, url, rr = decide(body)
        except Exception as exc:  # a tokenizer or policy failure is the request's problem, not a crash
            config.stats["client_errors"] += 1
            return _error(400, f"cannot route this request: {type(exc).__name__}: {exc}", "invalid_request_error")
        config.stats["routes"][target] += 1
        stream = bool(body.get("stream"))
        p = rr.prompt_tokens
        pre = pd_prefill if target == "disaggregated" else inflight[url]
        dec = pd_decode if target == "disaggregated" else inflight[url]
        inflight[url].requests += 1
        pre.prefill_tokens += p
        pre.prefill_sq_tokens += p * p
        in_prefill, in_decode = True, False

        def first_token() -> None:
            nonlocal in_prefill, in_decode
            if in_prefill:
                pre.prefill_tokens -= p
                pre.prefill_sq_tokens -= p * p
                in_prefill = False
                dec.decode_batch += 1
                dec.decode_ctx_tokens += p
                in_decode = True

        def done() -> None:
            nonlocal in_decode
            first_token()
            if in_decode:
                dec.decode_batch -= 1
                dec.decode_ctx_tokens -= p
                in_decode = False
            inflight[url].requests -= 1

        headers = {"X-Route": target, "X-Predicted-Output-Tokens": f"{rr.predicted_output_tokens:.1f}",
                   "X-Backend-Url": url}
        if "X-Request-Id" in request.headers:
            headers["X-Request-Id"] = request.headers["X-Request-Id"]
        fwd = {k: v for k, v in request.headers.items() if k in ("Authorization", "X-Request-Id")}
        seen = bytearray()

        def on_chunk(chunk: bytes, arrived: float) -> None:
            first_token()
            seen.extend(chunk)

        t0 = time.perf_counter()
        try:
            response, ok = await relay(request, url, body, stats=config.stats, who=f"{target} backend",
                                       error_kind="router_error", forward_headers=fwd, response_headers=headers,
                                       first_byte_timeout_s=config.first_byte_timeout_s, on_chunk=on_chunk)
        finally:
            done()
        if ok:
            n_out = _count_output(bytes(seen), stream)
            if n_out:
                config.predictor.observe(p, n_out, rr.key)
            config.stats.setdefault("seconds", 0.0)
            config.stats["seconds"] += time.perf_counter() - t0
        return response

    async def health(request: web.Request) -> web.Response:
        probes = {url: url + ("/health" if url in config.colocated_urls else "/proxy/stats") for url in backends}
        return await health_response(client_session(request), probes, config.connect_timeout_s)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({**config.stats, "policy": config.policy.describe(),
                                  "predictor": config.predictor.name,
                                  "inflight": {u: vars(f) for u, f in inflight.items()}})

    for path in ENDPOINTS:
        app.router.add_post(path, handle)
    app.router.add_get("/health", health)
    app.router.add_get("/router/stats", stats)
    return app


class RouterServer:
    """Run the router app inside the current asyncio loop (a notebook's, a test's) on 127.0.0.1.

    ``async with RouterServer(config) as url: ...`` — the port is picked free unless given; the
    listening socket and the client session are closed on every exit path. Swap
    ``config.policy`` / ``config.predictor`` between runs: the app reads them per request.
    """

    def __init__(self, config: RouterConfig, *, port: int | None = None, host: str = "127.0.0.1"):
        self.config, self.host, self.port = config, host, port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        from pdlab.process import free_port

        if self.port is None:
            self.port = free_port(self.host)
        self._runner = web.AppRunner(make_router_app(self.config), access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except BaseException:
            await self.stop()
            raise
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
