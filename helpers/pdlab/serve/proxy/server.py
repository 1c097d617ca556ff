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
vLLM 0.8+). Errors: a malformed request → 400 before any backend is touched; a backend's 4xx is
passed through, any other non-200 answer becomes 502 (:func:`pdlab.serve.proxy.plumbing.backend_status`);
a backend that is down or dies → 502/504 within the configured time limits, and a stream cut
mid-way ends with an SSE ``error`` event (never a hang). Every answer carries ``X-Request-Id``.
The HTTP parts shared with the router are in :mod:`pdlab.serve.proxy.plumbing`.

Run: ``python -m pdlab.serve.proxy --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import logging
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import ClientError, ClientTimeout, web

from pdlab.sched.admission import PrefillModel, TTFTAdmission
from pdlab.serve.proxy.admission import MetricsPoller
from pdlab.serve.proxy.plumbing import (
    backend_error_response,
    client_session,
    error_response,
    health_response,
    new_stats,
    read_request,
    relay,
    relay_app,
)

__all__ = ["ProxyConfig", "ProxyState", "ProxyTiming", "ProxiedRequest", "PDProxy", "BackendLimits", "make_app",
           "prefill_request", "decode_request", "context_error"]

log = logging.getLogger("pdlab.proxy")
_KIND = "proxy_error"  # the ``type`` of the proxy's own error answers


@dataclass(frozen=True)
class ProxyConfig:
    """Backends and time limits (seconds) of a proxy; ``max_timings``: how many per-request timings
    ``GET /proxy/timings`` keeps (the last successful ones)."""

    prefill_urls: list[str]
    decode_urls: list[str]
    connect_timeout_s: float = 5.0
    prefill_timeout_s: float = 120.0
    read_timeout_s: float = 60.0  # longest silence allowed between chunks from decode
    max_timings: int = 10_000
    #: Early rejection (off when None): a latency profile whose prefill coefficients predict TTFT
    #: (:mod:`pdlab.serve.proxy.admission`), the TTFT SLO, the hand-off time added to every prediction,
    #: and the tokenizer folder that counts a text prompt's tokens.
    admission_profile: str | None = None
    ttft_slo_s: float | None = None
    handoff_s: float = 0.0
    tokenizer: str | None = None
    admission_learn: float = 0.2  # EWMA weight of the measured/predicted prefill-leg ratio (0: off)
    admission_headroom: float = 1.0  # admit when the predicted TTFT ≤ headroom × the SLO
    #: With admission on: also read the first prefill and decode engines' vLLM ``/metrics`` (their queue
    #: and the decode KV headroom, :class:`~pdlab.serve.proxy.admission.MetricsPoller`), refuse what would
    #: take decode's KV usage above ``admission_kv_limit`` (0–1), and learn the hand-off under load.
    engine_metrics: bool = False
    admission_kv_limit: float = 0.95
    #: A fault mode (lab 06): send the decode leg without the prefill's ``kv_transfer_params``, as a front
    #: door that does not thread them through. The decode then prefills every prompt itself, with no error.
    drop_kv_transfer_params: bool = False

    def __post_init__(self) -> None:
        if not self.prefill_urls or not self.decode_urls:
            raise ValueError("a disaggregation proxy needs at least one prefill and one decode URL")
        if self.max_timings < 1:
            raise ValueError(f"max_timings must be at least 1, got {self.max_timings}")
        if self.admission_profile is not None and self.ttft_slo_s is None:
            raise ValueError("admission needs a TTFT SLO (--ttft-slo) with its profile")


@dataclass(frozen=True)
class ProxyTiming:
    """Where one proxied request spent its time before its first byte left the proxy (seconds).

    ``own_s``: the proxy's own work (parsing, building both requests); ``prefill_leg_s``: POST to
    the prefill server until its whole answer arrived; ``decode_first_s``: POST to the decode
    server until its first body chunk arrived; ``ttft_s``: request received → first chunk sent on;
    ``predicted_ttft_s``: what the admission predicted on arrival (None with admission off).
    """

    request_id: str
    own_s: float
    prefill_leg_s: float
    decode_first_s: float
    ttft_s: float
    predicted_ttft_s: float | None = None


@dataclass
class ProxyState:
    """What a running proxy changes: counters (``GET /proxy/stats``), the last timings
    (``GET /proxy/timings``) and its place in the two round robins."""

    config: ProxyConfig
    stats: dict[str, int] = field(default_factory=lambda: new_stats(rejected=0))
    timings: deque[dict[str, Any]] = field(init=False)
    limits: BackendLimits | None = None
    admission: TTFTAdmission | None = field(init=False, default=None)
    poller: MetricsPoller | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.timings = deque(maxlen=self.config.max_timings)
        self._prefill_rr = itertools.cycle(self.config.prefill_urls)
        self._decode_rr = itertools.cycle(self.config.decode_urls)
        self._tokenizer = None
        cfg = self.config
        if cfg.admission_profile is not None:
            self.admission = TTFTAdmission(PrefillModel.from_profile(cfg.admission_profile), cfg.ttft_slo_s,
                                           cfg.handoff_s, learn=cfg.admission_learn,
                                           headroom=cfg.admission_headroom, kv_limit=cfg.admission_kv_limit)
            if cfg.engine_metrics:
                self.poller = MetricsPoller(cfg.prefill_urls[0], cfg.decode_urls[0]).start()
                self.admission.engine_state, self.admission.learn_handoff = self.poller, True
            if cfg.tokenizer is not None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """Tokens of a request's prompt: a token-id list's length, else the tokenizer's count."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if self._tokenizer is None:
            raise ValueError("this proxy predicts TTFT from token counts: send the prompt as token ids, or start "
                             "it with --tokenizer")
        if "messages" in body:
            return len(self._tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True))
        texts = prompt if isinstance(prompt, list) else [prompt]
        return sum(len(self._tokenizer(t).input_ids) for t in texts)

    def next_pair(self) -> tuple[str, str]:
        """The next (prefill URL, decode URL), each by round robin."""
        return next(self._prefill_rr), next(self._decode_rr)


@dataclass(frozen=True)
class BackendLimits:
    """What the backends accept: their model names and context length (tokens), from ``/v1/models``."""

    model_ids: frozenset[str]
    max_model_len: int | None


def context_error(body: dict[str, Any], limits: BackendLimits) -> str | None:
    """Why a request cannot fit the context, or None: checked before any backend does work.

    A prompt given as token ids is checked with its length; a text prompt's length is known only
    to the engine (its own check answers that). ``max_tokens`` alone must leave room for a prompt.

    >>> lim = BackendLimits(frozenset({"m"}), 2048)
    >>> context_error({"prompt": [1] * 2000, "max_tokens": 100}, lim)
    'prompt (2000 tokens) + max_tokens (100) exceed the model context of 2048 tokens'
    >>> context_error({"prompt": "hi", "max_tokens": 16}, lim) is None
    True
    """
    if limits.max_model_len is None:
        return None
    n = limits.max_model_len
    out = body.get("max_tokens") or body.get("max_completion_tokens")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if len(prompt) >= n:
            return f"the prompt ({len(prompt)} tokens) does not fit the model context of {n} tokens"
        if out and len(prompt) + out > n:
            return f"prompt ({len(prompt)} tokens) + max_tokens ({out}) exceed the model context of {n} tokens"
    if out and out >= n:
        return f"max_tokens ({out}) leaves no room for a prompt in the model context of {n} tokens"
    return None


@dataclass
class ProxiedRequest:
    """One admitted request on its way through both legs: its body, id, backends and clocks
    (``time.perf_counter()`` seconds)."""

    body: dict[str, Any]
    request_id: str
    forward_headers: dict[str, str]
    prefill_url: str
    decode_url: str
    received_s: float
    prefill_leg_s: float = 0.0
    decode_sent_s: float = 0.0
    first_chunk_seen: bool = False
    predicted_ttft_s: float | None = None  # the admission's prediction on arrival (s); None with admission off

    def timing(self, first_chunk_s: float) -> ProxyTiming:
        """The request's :class:`ProxyTiming`, its first decode chunk having arrived at ``first_chunk_s``."""
        decode_first_s = first_chunk_s - self.decode_sent_s
        ttft_s = time.perf_counter() - self.received_s
        return ProxyTiming(self.request_id, own_s=ttft_s - self.prefill_leg_s - decode_first_s,
                           prefill_leg_s=self.prefill_leg_s, decode_first_s=decode_first_s, ttft_s=ttft_s,
                           predicted_ttft_s=self.predicted_ttft_s)


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request the prefill server gets: one token, no streaming, ``do_remote_decode``.

    >>> req = prefill_request({"prompt": "hi", "max_tokens": 50, "stream": True})
    >>> req["max_tokens"], req["stream"], req["kv_transfer_params"]["do_remote_decode"]
    (1, False, True)
    """
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


class PDProxy:
    """The proxy's request path and routes; :meth:`app` is the aiohttp application.

    A request goes :meth:`admit` (validated body → :class:`ProxiedRequest`, or a refusal) →
    :meth:`prefill_leg` (``kv_transfer_params``) → :meth:`decode_leg` (streamed back).
    """

    def __init__(self, config: ProxyConfig, state: ProxyState | None = None):
        self.config = config
        self.state = state if state is not None else ProxyState(config)
        # Prefill answers once, after the whole prompt: bounded by its total time, not by silence.
        self._prefill_timeout = ClientTimeout(total=config.prefill_timeout_s, connect=config.connect_timeout_s,
                                              sock_connect=config.connect_timeout_s)

    def app(self) -> web.Application:
        """A fresh aiohttp application serving this proxy."""
        cfg = self.config
        app = relay_app(self.handle, self.health, connect_timeout_s=cfg.connect_timeout_s,
                        read_timeout_s=cfg.read_timeout_s)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/proxy/stats", self.stats)
        app.router.add_get("/proxy/timings", self.timings)
        app.router.add_get("/proxy/admission", self.admission_state)
        if (poller := self.state.poller) is not None:
            app.on_cleanup.append(lambda _app: asyncio.to_thread(poller.stop))
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One OpenAI request: admit, prefill, decode."""
        received_s = time.perf_counter()
        self.state.stats["requests"] += 1
        body = await read_request(request, self.state.stats)
        if isinstance(body, web.Response):
            return body
        if self.state.limits is None:
            self.state.limits = await self.backend_limits(request)
        job = self.admit(request, body, received_s)
        if isinstance(job, web.Response):
            return job
        try:
            kv_params = await self.prefill_leg(request, job)
        finally:
            if self.state.admission is not None:
                self.state.admission.done(job.request_id)
        if isinstance(kv_params, web.Response):
            return kv_params
        return await self.decode_leg(request, job, kv_params)

    def admit(self, request: web.Request, body: dict[str, Any], received_s: float) -> ProxiedRequest | web.Response:
        """Admit a validated request before any backend is touched: pick its two backends and its id.

        Refused here, with nothing sent to an engine: a request that cannot fit the context (400;
        an unknown model is the engines' 404, passed on), and — with admission on — a request whose predicted TTFT misses the
        SLO (503 with ``Retry-After``, :mod:`pdlab.serve.proxy.admission`).
        """
        request_id = request.headers.get("X-Request-Id") or str(uuid.uuid4())
        reply = {"X-Request-Id": request_id}
        limits, stats = self.state.limits, self.state.stats
        if limits is not None and (why := context_error(body, limits)):
            stats["client_errors"] += 1
            return error_response(400, why, "invalid_request_error", reply)
        policy = self.state.admission
        if policy is not None:
            try:
                tokens = self.state.prompt_tokens(body)
            except ValueError as exc:
                stats["client_errors"] += 1
                return error_response(400, str(exc), "invalid_request_error", reply)
            verdict = policy.decide(tokens, int(body.get("max_tokens") or body.get("max_completion_tokens") or 0))
            if not verdict.admit:
                stats["rejected"] += 1
                why = (f"the decode engine's KV cache has no room for {tokens} prompt tokens and their output"
                       if verdict.reason == "decode_kv" else f"predicted TTFT {verdict.predicted_ttft_s:.3f} s (queue "
                       f"{verdict.wait_s:.3f} s + prefill of {tokens} tokens) exceeds the target of {policy.target_s:g} s "
                       f"({policy.headroom:g} × the {policy.ttft_slo_s:g} s SLO)")
                return error_response(503, f"rejected on arrival: {why}",
                    "overloaded", {**reply, "Retry-After": str(verdict.retry_after_s)})
            policy.start(request_id, tokens)
        p_url, d_url = self.state.next_pair()
        headers = {**{k: v for k, v in request.headers.items() if k == "Authorization"}, "X-Request-Id": request_id}
        return ProxiedRequest(body, request_id, headers, p_url, d_url, received_s,
                              predicted_ttft_s=verdict.predicted_ttft_s if policy is not None else None)

    async def backend_limits(self, request: web.Request) -> BackendLimits | None:
        """Model names and context length from the first prefill server's ``/v1/models`` (None if it fails)."""
        url = self.config.prefill_urls[0] + "/v1/models"
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                async with client_session(request).get(url) as resp:
                    data = (await resp.json())["data"]
        except (ClientError, OSError, TimeoutError, KeyError, TypeError, ValueError) as exc:
            log.warning("could not read the backends' limits from %s: %s", url, exc)
            return None
        ids = frozenset(str(m["id"]) for m in data if "id" in m)
        lens = [int(m["max_model_len"]) for m in data if m.get("max_model_len")]
        return BackendLimits(ids, min(lens) if lens else None)

    async def prefill_leg(self, request: web.Request, job: ProxiedRequest) -> dict[str, Any] | None | web.Response:
        """POST the prefill request; its ``kv_transfer_params``, or the error answer for the client."""
        cfg, stats, url = self.config, self.state.stats, job.prefill_url
        reply_headers = {"X-Request-Id": job.request_id}
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(cfg.prefill_timeout_s):
                async with client_session(request).post(url + request.path, json=prefill_request(job.body),
                                                        headers=job.forward_headers,
                                                        timeout=self._prefill_timeout) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        return backend_error_response(resp.status, payload, stats, reply_headers)
                    kv_params = json.loads(payload).get("kv_transfer_params")
        except TimeoutError:
            stats["backend_errors"] += 1
            return error_response(504, f"prefill server {url} did not answer within {cfg.prefill_timeout_s:g} s",
                                  _KIND, reply_headers)
        except (ClientError, OSError, json.JSONDecodeError) as exc:
            stats["backend_errors"] += 1
            return error_response(502, f"prefill server {url} failed: {type(exc).__name__}: {exc}", _KIND,
                                  reply_headers)
        job.prefill_leg_s = time.perf_counter() - t0
        return kv_params

    async def decode_leg(self, request: web.Request, job: ProxiedRequest,
                         kv_params: dict[str, Any] | None) -> web.StreamResponse:
        """Relay the decode request, streamed back as it arrives; record the timing of its first chunk."""
        job.decode_sent_s = time.perf_counter()

        def on_chunk(chunk: bytes, arrived_s: float) -> None:
            if not job.first_chunk_seen:
                job.first_chunk_seen = True
                timing = job.timing(arrived_s)
                self.state.timings.append(asdict(timing))
                if self.state.admission is not None:
                    self.state.admission.observe_handoff(timing.ttft_s - timing.prefill_leg_s)

        response, _ = await relay(
            request, job.decode_url, decode_request(job.body, None if self.config.drop_kv_transfer_params else kv_params),
            stats=self.state.stats,
            who="decode server", error_kind=_KIND, forward_headers=job.forward_headers, on_chunk=on_chunk,
            response_headers={"X-Request-Id": job.request_id, "X-Prefill-Seconds": f"{job.prefill_leg_s:.6f}",
                              "X-Prefill-Url": job.prefill_url, "X-Decode-Url": job.decode_url})
        return response

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 when every prefill and decode server answers its ``/health``, else 503."""
        probes = {url: url + "/health" for url in self.config.prefill_urls + self.config.decode_urls}
        return await health_response(client_session(request), probes, self.config.connect_timeout_s)

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the first decode server's answer."""
        url = self.config.decode_urls[0]
        try:
            async with asyncio.timeout(self.config.connect_timeout_s * 2):
                async with client_session(request).get(url + "/v1/models") as resp:
                    return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")
        except (ClientError, OSError, TimeoutError) as exc:
            return error_response(502, f"decode server {url} failed: {type(exc).__name__}: {exc}", _KIND)

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /proxy/stats``: the counters and the backends."""
        return web.json_response({**self.state.stats, "prefill": self.config.prefill_urls,
                                  "decode": self.config.decode_urls})

    async def timings(self, request: web.Request) -> web.Response:
        """``GET /proxy/timings``: :class:`ProxyTiming` of the last successful requests, oldest first."""
        return web.json_response(list(self.state.timings))

    async def admission_state(self, request: web.Request) -> web.Response:
        """``GET /proxy/admission``: whether early rejection is on, its counters and predicted queue."""
        policy = self.state.admission
        return web.json_response({"enabled": False} if policy is None else {"enabled": True, **policy.state()})


def make_app(config: ProxyConfig, state: ProxyState | None = None) -> web.Application:
    """The aiohttp application (also used directly by tests with aiohttp's test client)."""
    return PDProxy(config, state).app()
