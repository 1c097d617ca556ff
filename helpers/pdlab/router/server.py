"""The live router: an aiohttp server in front of colocated servers and a prefill/decode pair.

For every OpenAI request (``/v1/completions``, ``/v1/chat/completions``) it

1. validates the body (a malformed one gets 400 before any backend is touched; the checks are the
   disaggregation proxy's, :func:`pdlab.serve.proxy.plumbing.validate_request`);
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

from aiohttp import web

from pdlab.router.policies import (
    LoadEstimator,
    OutputPredictor,
    RouteRequest,
    RoutingPolicy,
    TargetLoad,
)
from pdlab.serve.proxy import (
    client_session,
    error_response,
    forwarded_headers,
    health_response,
    new_stats,
    read_request,
    relay,
    relay_app,
)

__all__ = ["RouterConfig", "RouterState", "Router", "RouterServer", "make_router_app", "prompt_counter",
           "request_key", "InFlight", "TrackedRequest"]


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

    def __post_init__(self) -> None:
        if not self.colocated_urls and not self.disaggregated_url:
            raise ValueError("a router needs at least one colocated URL or a disaggregated (P/D proxy) URL")

    @property
    def backends(self) -> list[str]:
        """Every backend URL: the colocated servers, then the P/D proxy."""
        return list(self.colocated_urls) + ([self.disaggregated_url] if self.disaggregated_url else [])


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


@dataclass
class RouterState:
    """What a running router changes: counters (``GET /router/stats``) and its in-flight view of
    every backend; the P/D pair is one target with two loads, its prefill queue and its decode batch."""

    config: RouterConfig
    stats: dict[str, Any] = field(default_factory=lambda: new_stats(routes={"colocated": 0, "disaggregated": 0}))
    inflight: dict[str, InFlight] = field(init=False)
    pd_prefill: InFlight = field(default_factory=InFlight)
    pd_decode: InFlight = field(default_factory=InFlight)

    def __post_init__(self) -> None:
        self.inflight = {url: InFlight() for url in self.config.backends}

    def track(self, target: str, url: str, prompt_tokens: int) -> TrackedRequest:
        """Count a request sent to ``url`` (``target`` ``colocated`` or ``disaggregated``) as prefilling."""
        disagg = target == "disaggregated"
        tracked = TrackedRequest(prefill=self.pd_prefill if disagg else self.inflight[url],
                                 decode=self.pd_decode if disagg else self.inflight[url],
                                 backend=self.inflight[url], prompt_tokens=prompt_tokens)
        tracked.start()
        return tracked


@dataclass
class TrackedRequest:
    """One request in the router's in-flight counts: ``prefill`` until its first chunk, then ``decode``
    until it ends (``done``). Each step happens once, whatever order the calls come in."""

    prefill: InFlight
    decode: InFlight
    backend: InFlight
    prompt_tokens: int
    phase: str = "new"

    def start(self) -> None:
        """Enter the prefill queue."""
        if self.phase == "new":
            p = self.prompt_tokens
            self.backend.requests += 1
            self.prefill.prefill_tokens += p
            self.prefill.prefill_sq_tokens += p * p
            self.phase = "prefill"

    def first_token(self) -> None:
        """Leave the prefill queue, join the decode batch."""
        if self.phase == "prefill":
            p = self.prompt_tokens
            self.prefill.prefill_tokens -= p
            self.prefill.prefill_sq_tokens -= p * p
            self.decode.decode_batch += 1
            self.decode.decode_ctx_tokens += p
            self.phase = "decode"

    def done(self) -> None:
        """Leave the decode batch and the backend's count."""
        self.first_token()
        if self.phase == "decode":
            self.decode.decode_batch -= 1
            self.decode.decode_ctx_tokens -= self.prompt_tokens
            self.backend.requests -= 1
            self.phase = "done"


class Router:
    """The router's request path and routes; :meth:`app` is the aiohttp application.

    A request goes :meth:`decide` (target, backend URL, :class:`RouteRequest`) → :meth:`forward`
    (relayed, tracked in flight) → the predictor learns the real output length.
    """

    def __init__(self, config: RouterConfig, state: RouterState | None = None):
        if config.policy.needs_estimates and config.estimator is None:
            raise ValueError(f"policy {config.policy.name!r} needs a LoadEstimator (latency models of the backends)")
        self.config = config
        self.state = state if state is not None else RouterState(config)

    def app(self) -> web.Application:
        """A fresh aiohttp application serving this router."""
        cfg = self.config
        app = relay_app(self.handle, self.health, connect_timeout_s=cfg.connect_timeout_s,
                        read_timeout_s=cfg.read_timeout_s)
        app.router.add_get("/router/stats", self.stats)
        return app

    def decide(self, body: dict[str, Any]) -> tuple[str, str, RouteRequest]:
        """``(target, backend URL, route request)`` for a validated body; the least busy colocated server."""
        cfg, inflight = self.config, self.state.inflight
        p = int(cfg.count_prompt(body))
        key = request_key(body)
        rr = RouteRequest(p, cfg.predictor.predict(p, key), key)
        coloc = min(cfg.colocated_urls, key=lambda u: (inflight[u].prefill_tokens, inflight[u].requests)) \
            if cfg.colocated_urls else None
        estimates = None
        if cfg.policy.needs_estimates and coloc and cfg.disaggregated_url:
            est = cfg.estimator
            estimates = {"colocated": est.colocated(rr, inflight[coloc].load()),
                         "disaggregated": est.disaggregated(rr, self.state.pd_prefill.load(),
                                                            self.state.pd_decode.load())}
        target = cfg.policy.decide(rr, estimates)
        if target == "colocated" and coloc is None:
            target = "disaggregated"
        if target == "disaggregated" and not cfg.disaggregated_url:
            target = "colocated"
        return target, (coloc if target == "colocated" else cfg.disaggregated_url), rr

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One OpenAI request: validate, decide, forward."""
        stats = self.state.stats
        stats["requests"] += 1
        body = await read_request(request, stats)
        if isinstance(body, web.Response):
            return body
        try:
            target, url, rr = self.decide(body)
        except Exception as exc:  # a tokenizer or policy failure is the request's problem, not a crash
            stats["client_errors"] += 1
            return error_response(400, f"cannot route this request: {type(exc).__name__}: {exc}",
                                  "invalid_request_error")
        stats["routes"][target] += 1
        return await self.forward(request, body, target, url, rr)

    async def forward(self, request: web.Request, body: dict[str, Any], target: str, url: str,
                      rr: RouteRequest) -> web.StreamResponse:
        """Relay the request to ``url``, tracked in flight; feed the real output length to the predictor."""
        stats = self.state.stats
        headers = {"X-Route": target, "X-Predicted-Output-Tokens": f"{rr.predicted_output_tokens:.1f}",
                   "X-Backend-Url": url}
        if "X-Request-Id" in request.headers:
            headers["X-Request-Id"] = request.headers["X-Request-Id"]
        tracked = self.state.track(target, url, rr.prompt_tokens)
        seen = bytearray()

        def on_chunk(chunk: bytes, arrived_s: float) -> None:
            tracked.first_token()
            seen.extend(chunk)

        t0 = time.perf_counter()
        try:
            response, ok = await relay(request, url, body, stats=stats, who=f"{target} backend",
                                       error_kind="router_error", forward_headers=forwarded_headers(request),
                                       response_headers=headers, first_byte_timeout_s=self.config.first_byte_timeout_s,
                                       on_chunk=on_chunk)
        finally:
            tracked.done()
        if ok:
            n_out = _count_output(bytes(seen), bool(body.get("stream")))
            if n_out:
                self.config.predictor.observe(rr.prompt_tokens, n_out, rr.key)
            stats["seconds"] = stats.get("seconds", 0.0) + time.perf_counter() - t0
        return response

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 when every colocated server (``/health``) and the P/D proxy answer, else 503."""
        cfg = self.config
        probes = {url: url + ("/health" if url in cfg.colocated_urls else "/proxy/stats") for url in cfg.backends}
        return await health_response(client_session(request), probes, cfg.connect_timeout_s)

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /router/stats``: counters, policy, predictor and the in-flight view."""
        return web.json_response({**self.state.stats, "policy": self.config.policy.describe(),
                                  "predictor": self.config.predictor.name,
                                  "inflight": {u: vars(f) for u, f in self.state.inflight.items()}})


def make_router_app(config: RouterConfig, state: RouterState | None = None) -> web.Application:
    """The aiohttp application (tests drive it with aiohttp's test client)."""
    return Router(config, state).app()


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
