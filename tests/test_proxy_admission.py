"""The P/D proxy refuses on arrival what cannot succeed: context overflow (400) and, with early
rejection on, requests whose predicted TTFT misses the SLO (503 + Retry-After). Backends are small
aiohttp apps on 127.0.0.1 that count what reaches them."""

from __future__ import annotations

import asyncio
import functools
import json

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pdlab.serve.proxy import ProxyConfig, make_app


def sync(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def _backend(hits: list[str], name: str, prefill_s: float = 0.0):
    async def completions(request):
        body = await request.json()
        hits.append(name)
        await asyncio.sleep(prefill_s)
        if body.get("kv_transfer_params", {}).get("do_remote_decode"):
            return web.json_response({"choices": [{"text": "x", "index": 0}], "kv_transfer_params": {"e": name}})
        return web.json_response({"choices": [{"text": "done", "index": 0}]})

    async def models(request):
        return web.json_response({"data": [{"id": "m", "max_model_len": 2048}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


async def _start(app) -> tuple[TestServer, str]:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, str(server.make_url("")).rstrip("/")


async def _pair(hits, prefill_s=0.0, **config):
    (p, p_url), (d, d_url) = await _start(_backend(hits, "prefill", prefill_s)), await _start(_backend(hits, "decode"))
    client = TestClient(TestServer(make_app(ProxyConfig([p_url], [d_url], **config)), host="127.0.0.1"))
    await client.start_server()
    return client, (p, d)


@sync
async def test_requests_that_cannot_fit_the_context_never_reach_an_engine():
    hits: list[str] = []
    client, servers = await _pair(hits)
    try:
        for body, words in (({"model": "m", "prompt": [3] * 2100, "max_tokens": 4}, "does not fit"),
                            ({"model": "m", "prompt": [3] * 2000, "max_tokens": 100}, "exceed"),
                            ({"model": "m", "prompt": "hi", "max_tokens": 5000}, "leaves no room")):
            resp = await client.post("/v1/completions", json=body)
            payload = await resp.json()
            assert resp.status == 400 and words in payload["error"]["message"] and "2048" in payload["error"]["message"]
            assert resp.headers["X-Request-Id"]
        assert hits == [], f"an engine got a request that could not fit: {hits}"
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4})
        assert resp.status == 200 and hits == ["prefill", "decode"]
    finally:
        await client.close()
        for s in servers:
            await s.close()


@sync
async def test_early_rejection_refuses_what_would_miss_the_ttft_slo(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"prefill": [0.0, 0.001, 0.0], "decode": [0.0, 0.0, 0.0]}))  # 1 ms per token
    hits: list[str] = []
    client, servers = await _pair(hits, prefill_s=0.3, admission_profile=str(profile), ttft_slo_s=0.5)
    try:
        body = {"model": "m", "prompt": [5] * 300, "max_tokens": 2}  # 0.3 s predicted alone
        first = asyncio.create_task(client.post("/v1/completions", json=body))
        await asyncio.sleep(0.05)  # the first is in its prefill leg: the queue holds 0.3 s
        second = await client.post("/v1/completions", json=body)  # 0.3 + 0.3 > 0.5
        payload = await second.json()
        assert second.status == 503 and int(second.headers["Retry-After"]) >= 1
        assert "predicted TTFT" in payload["error"]["message"] and "0.5 s" in payload["error"]["message"]
        assert (await first).status == 200
        third = await client.post("/v1/completions", json=body)  # the queue drained: admitted
        assert third.status == 200
        state = await (await client.get("/proxy/admission")).json()
        assert state["enabled"] and state["admitted"] == 2 and state["rejected"] == 1 and state["in_flight"] == 0
        timings = await (await client.get("/proxy/timings")).json()  # the two admitted: 0.3 s predicted, ≥ 0.3 s taken
        assert [round(t["predicted_ttft_s"], 1) for t in timings] == [0.3, 0.3]
        assert all(t["ttft_s"] >= 0.3 for t in timings)
        text = await client.post("/v1/completions", json={"model": "m", "prompt": "words", "max_tokens": 2})
        assert text.status == 400 and "token ids" in (await text.json())["error"]["message"]
    finally:
        await client.close()
        for s in servers:
            await s.close()


@sync
async def test_admission_is_off_by_default():
    hits: list[str] = []
    client, servers = await _pair(hits)
    try:
        assert (await (await client.get("/proxy/admission")).json()) == {"enabled": False}
    finally:
        await client.close()
        for s in servers:
            await s.close()


@sync
async def test_engine_metrics_that_are_missing_leave_the_proxy_on_its_bookkeeping(tmp_path):
    """The backends here have no /metrics (404): admission reads nothing, warns, and still admits."""
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"prefill": [0.0, 0.001, 0.0]}))
    hits: list[str] = []
    client, servers = await _pair(hits, admission_profile=str(profile), ttft_slo_s=0.5, engine_metrics=True)
    try:
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": [5] * 100, "max_tokens": 2})
        state = await (await client.get("/proxy/admission")).json()
        assert resp.status == 200 and hits == ["prefill", "decode"]
        assert state["engine_state"] and state["state_fallbacks"] == 1 and state["admitted"] == 1
    finally:
        await client.close()
        for s in servers:
            await s.close()
