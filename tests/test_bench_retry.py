"""``pdlab bench`` honours ``Retry-After``: a request refused with HTTP 503 is sent again after the
time the server gave, a bounded number of times, and the summary counts refused, retried and
finally failed requests apart. The server is a small aiohttp app on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web
from aiohttp.test_utils import TestServer
from pdlab.metrics import SLO
from pdlab.serve.client.bench import ClientOptions, format_summary, retry_after_s, run_bench
from pdlab.workloads import Request


def _refusing_server(refusals: dict[str, int], attempts: dict[str, list[float]], wait: str = "0.3"):
    """Refuses each prompt its first ``refusals[prompt]`` times (503, ``Retry-After: wait``), then streams."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["prompt"]
        attempts.setdefault(prompt, []).append(time.perf_counter())
        if len(attempts[prompt]) <= refusals.get(prompt, 0):
            return web.json_response({"error": {"message": "overloaded"}}, status=503, headers={"Retry-After": wait})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body["max_tokens"]):
            await resp.write(f"data: {json.dumps({'choices': [{'text': f't{i}', 'index': 0}]})}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def _run(refusals, client, wait="0.3"):
    attempts: dict[str, list[float]] = {}

    async def go():
        server = TestServer(_refusing_server(refusals, attempts, wait), host="127.0.0.1")
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            reqs = [Request(i, 0.0, 3, 2) for i in range(3)]
            return await asyncio.to_thread(run_bench, url, reqs, slo=SLO(ttft_s=5.0, tpot_s=1.0), client=client,
                                           progress=False, prompts=["once", "always", "never"])
        finally:
            await server.close()

    return asyncio.run(go()), attempts


def test_refused_requests_are_retried_after_retry_after_and_counted_apart():
    client = ClientOptions(model="m", tokenizer="unused", max_retries=2)
    res, attempts = _run({"once": 1, "always": 99}, client)
    by_id = {r.request_id: r for r in res.records}
    assert by_id[0].ok and by_id[0].extra["retries"] == 1 and by_id[0].extra["rejections"] == 1
    gaps = [b - a for a, b in zip(attempts["once"], attempts["once"][1:], strict=False)]
    assert len(gaps) == 1 and gaps[0] >= 0.3, f"the retry did not wait Retry-After: {gaps}"
    assert by_id[0].ttft_s >= 0.3, "the record's TTFT must count from the first attempt"
    assert not by_id[1].ok and by_id[1].error.startswith("HTTP 503") and len(attempts["always"]) == 3
    assert by_id[2].ok and by_id[2].extra["retries"] == 0 and len(attempts["never"]) == 1
    s = res.summary
    assert (s["rejected"], s["retried"], s["failed_after_retries"], s["completed"]) == (2, 2, 1, 2)
    assert "refused (503 + Retry-After) 2, retried 2, still refused after retries 1" in format_summary(s)


def test_without_retries_a_refusal_is_final_and_bad_settings_are_named():
    res, attempts = _run({"once": 1}, ClientOptions(model="m", tokenizer="unused"))
    assert [len(attempts[p]) for p in ("once", "always", "never")] == [1, 1, 1]
    assert (res.summary["rejected"], res.summary["retried"], res.summary["failed_after_retries"]) == (1, 0, 1)
    capped, attempts = _run({"once": 1}, ClientOptions(model="m", tokenizer="unused", max_retries=1,
                                                       max_retry_after_s=0.05), wait="30")
    assert capped.summary["completed"] == 3 and attempts["once"][1] - attempts["once"][0] < 5.0
    assert retry_after_s("HTTP 503: x", {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_s("HTTP 503: x", {}) is None
    for bad in ({"max_retries": -1}, {"max_retry_after_s": float("nan")}):
        try:
            ClientOptions(**bad)
        except ValueError as exc:
            assert "max_retries" in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")
