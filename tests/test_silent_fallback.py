"""The silent fallback to decode-only (lab 06): the proxy's fault mode that drops ``kv_transfer_params``,
the check a deployment runs on the decode server's counters, and lab 06's mechanism key. No engine."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pdlab.exercises.lab06 import MECHANISMS, check_fault_mechanisms
from pdlab.serve.experiments.faults import FAULTS, FallbackRun
from pdlab.serve.measure.evidence import MetricsSnapshot, check_kv_transfer_is_used
from pdlab.serve.proxy import ProxyConfig, make_app


def _decode_metrics(prompt: int, external: int, compute: int, hit: int = 0, requests: int = 0) -> MetricsSnapshot:
    return MetricsSnapshot.from_text(f"""# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{model_name="m"}} {prompt}
# TYPE vllm:request_success counter
vllm:request_success_total{{model_name="m"}} {requests}
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{{model_name="m",source="external_kv_transfer"}} {external}
vllm:prompt_tokens_by_source_total{{model_name="m",source="local_compute"}} {compute}
vllm:prompt_tokens_by_source_total{{model_name="m",source="local_cache_hit"}} {hit}
""")


BEFORE = _decode_metrics(1000, 900, 100)


def test_a_pair_that_loads_the_kv_passes():
    # 4 prompts of 512 tokens: all but the last partial block of each came through the connector
    verdict = check_kv_transfer_is_used(BEFORE, _decode_metrics(1000 + 2048, 900 + 1984, 100 + 64, requests=4), 2048)
    assert verdict.ok and bool(verdict)
    assert verdict.evidence.external_kv_tokens == 1984 and verdict.evidence.local_compute_tokens == 64
    assert "1,984 loaded through the KV connector" in verdict.reason


def test_the_silent_fallback_fails_with_the_counts():
    verdict = check_kv_transfer_is_used(BEFORE, _decode_metrics(1000 + 2048, 900, 100 + 2048), 2048)
    assert not verdict.ok and not bool(verdict)
    assert verdict.reason.startswith("silent fallback to decode-only")
    assert "0 loaded through the KV connector, 2,048 computed locally" in verdict.reason


def test_a_pair_that_recomputes_most_prompts_fails():
    verdict = check_kv_transfer_is_used(BEFORE, _decode_metrics(1000 + 2048, 900 + 512, 100 + 1536), 2048)
    assert not verdict.ok and "recomputed most prompts (75%" in verdict.reason


def test_requests_that_did_not_reach_decode_fail():
    verdict = check_kv_transfer_is_used(BEFORE, _decode_metrics(1000 + 1024, 900 + 1000, 124), 2048)
    assert not verdict.ok and "1,024 of the 2,048 prompt tokens sent" in verdict.reason


def test_prompts_found_in_decodes_prefix_cache_tell_nothing():
    verdict = check_kv_transfer_is_used(BEFORE, _decode_metrics(1000 + 2048, 900, 100, hit=2048), 2048)
    assert not verdict.ok and verdict.reason.startswith("cannot tell")


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="prompt_tokens must be ≥ 1"):
        check_kv_transfer_is_used(BEFORE, BEFORE, 0)
    with pytest.raises(ValueError, match="max_local_share"):
        check_kv_transfer_is_used(BEFORE, BEFORE, 10, max_local_share=1.5)


def test_fallback_run_decode_speed_is_one_over_the_median_tpot():
    verdict = check_kv_transfer_is_used(BEFORE, _decode_metrics(1000 + 512, 900, 612), 512)
    run = FallbackRun("proxy drops kv_transfer_params", {"tpot_p50_s": 0.02}, 512, verdict)
    assert run.decode_tokens_per_s == pytest.approx(50.0)
    assert FallbackRun("x", {"tpot_p50_s": float("nan")}, 512, verdict).decode_tokens_per_s != 50.0


def _backend(name: str, log: list) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        log.append((name, body))
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x", "index": 0}],
                                      "kv_transfer_params": {"remote_engine_id": name, "do_remote_prefill": True}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body.get("max_tokens", 2)):
            await resp.write(f"data: {json.dumps({'choices': [{'text': f't{i}', 'index': 0}]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stand-in", "root": "stand-in"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


@pytest.mark.parametrize("drop", [False, True])
def test_the_proxys_fault_mode_drops_only_the_decode_legs_params(drop):
    async def run() -> list:
        log: list = []
        servers = [TestServer(_backend(n, log), host="127.0.0.1") for n in ("p0", "d0")]
        for s in servers:
            await s.start_server()
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        client = TestClient(TestServer(make_app(ProxyConfig([urls[0]], [urls[1]], drop_kv_transfer_params=drop)),
                                       host="127.0.0.1"))
        await client.start_server()
        try:
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2,
                                                              "stream": True})
            assert resp.status == 200 and "t1" in await resp.text(), "the client gets its answer either way"
        finally:
            await client.close()
            for s in servers:
                await s.close()
        return log

    log = asyncio.run(run())
    (pre_name, pre), (dec_name, dec) = log
    assert (pre_name, dec_name) == ("p0", "d0")
    assert pre["kv_transfer_params"]["do_remote_decode"] is True, "the prefill leg runs in both modes"
    assert ("kv_transfer_params" in dec) is not drop
    if not drop:
        assert dec["kv_transfer_params"]["remote_engine_id"] == "p0"


def test_the_proxy_flag_is_off_by_default():
    assert ProxyConfig(["http://127.0.0.1:1"], ["http://127.0.0.1:2"]).drop_kv_transfer_params is False


def test_lab06s_mechanism_key_names_every_fault_and_only_known_mechanisms():
    from pdlab.exercises import lab06

    assert set(lab06._MECHANISM_OF) == set(FAULTS)
    assert set(lab06._MECHANISM_OF.values()) == set(MECHANISMS)
    assert check_fault_mechanisms(dict(lab06._MECHANISM_OF), {"fail": False, "recompute": True}).status == "passed"
