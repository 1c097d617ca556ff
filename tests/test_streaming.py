"""pdlab.serve.client.streaming: one streamed request against a scripted SSE server, and its RequestRecord."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from pdlab.serve.client.streaming import (
    StreamOutcome,
    chunk_token_counts,
    outcome_record,
    request_path,
    stream_request,
)


def _sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def _app(events: list[bytes], status: int = 200) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        if status != 200:
            return web.json_response({"error": "nope"}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Route": "decode-0"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_post("/v1/chat/completions", handle)
    return app


def _run(events: list[bytes], body: dict | None = None, status: int = 200, timeout_s: float | None = 10.0):
    async def go() -> StreamOutcome:
        async with TestServer(_app(events, status)) as server, ClientSession() as session:
            return await stream_request(session, str(server.make_url("")), body or {"prompt": "hi"},
                                        timeout_s=timeout_s)

    return asyncio.run(go())


CHUNK = {"choices": [{"text": "a"}]}
EMPTY = {"choices": [{"text": ""}]}  # counts: vllm bench serve times every chunk with a choice
USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}


def test_request_path():
    assert request_path({"messages": []}) == "/v1/chat/completions"
    assert request_path({"prompt": "x"}) == "/v1/completions"


def test_every_chunk_with_a_choice_is_timed_usage_is_kept():
    out = _run([b": keep-alive\n\n", _sse(CHUNK), _sse(EMPTY), _sse(CHUNK), _sse(USAGE), _sse("[DONE]")])
    assert out.ok and out.error is None
    assert len(out.chunk_times) == 3 and out.chunk_times == sorted(out.chunk_times)
    assert out.usage["completion_tokens"] == 5 and out.headers["X-Route"] == "decode-0"


def test_running_usage_gives_the_tokens_each_chunk_held():
    """continuous_usage_stats: each chunk's running completion_tokens → tokens per chunk (a merged
    chunk of 2, a role chunk of 0), kept on the record; one chunk without it → unknown."""
    def running(n, text="a"):
        return _sse({"choices": [{"text": text}], "usage": {"prompt_tokens": 7, "completion_tokens": n}})

    out = _run([running(0, ""), running(1), running(3), running(4), _sse(USAGE), _sse("[DONE]")])
    assert out.ok and out.chunk_tokens == [0, 1, 2, 1] and out.usage["completion_tokens"] == 5
    rec = outcome_record(out, request_id=0, sent_s=out.chunk_times[0] - 0.1)
    assert rec.chunk_tokens == [0, 1, 2, 1] and len(rec.token_times_s) == 4
    partly = _run([running(1), _sse(CHUNK), _sse(USAGE), _sse("[DONE]")])
    assert partly.ok and partly.chunk_tokens == []
    assert outcome_record(partly, request_id=1, sent_s=0.0).chunk_tokens is None


def test_chunk_token_counts_reject_what_is_not_a_running_count():
    assert chunk_token_counts([2, 3, 3, 5]) == [2, 1, 0, 2]
    assert chunk_token_counts([3, 2]) == [] and chunk_token_counts([1, None]) == [] and chunk_token_counts([]) == []


@pytest.mark.parametrize(("events", "status", "message"), [
    ([_sse(CHUNK), _sse(CHUNK)], 200, "before [DONE]"),
    ([_sse(CHUNK), _sse({"error": {"message": "engine died"}})], 200, "engine died"),
    ([_sse("[DONE]")], 200, "no token"),
    ([], 500, "HTTP 500"),
])
def test_failures_are_outcomes_not_exceptions(events, status, message):
    out = _run(events, status=status)
    assert not out.ok and message in out.error


def test_timeout_is_a_failed_outcome():
    out = _run([_sse(CHUNK)] * 40 + [_sse("[DONE]")], timeout_s=0.05)
    assert not out.ok and "timed out after 0.05 s" in out.error


def test_outcome_record_follows_vllm_bench_serve():
    out = StreamOutcome(chunk_times=[10.5, 10.7, 11.0], usage={"prompt_tokens": 9, "completion_tokens": 4},
                        headers={"X-Route": "P0"})
    rec = outcome_record(out, request_id=3, sent_s=10.0, prompt_tokens=8, clock0=10.0, extra={"k": 1})
    assert rec.ok and rec.arrival_s == 0.0
    assert rec.ttft_s == pytest.approx(0.5) and rec.e2e_s == pytest.approx(1.0)
    assert rec.output_tokens == 4 and rec.tpot_s == pytest.approx(0.5 / 3)  # usage, not the chunk count
    assert rec.prompt_tokens == 8 and rec.server_prompt_tokens == 9  # client's count, as prompt_len
    assert rec.instance == "P0" and rec.extra == {"k": 1, "route": "P0"}
    assert rec.token_times_s == pytest.approx([0.5, 0.7, 1.0])


def test_outcome_record_of_a_failure_and_without_usage():
    failed = outcome_record(StreamOutcome(chunk_times=[1.0, 2.0], error="boom"), request_id=0, sent_s=0.5)
    assert not failed.ok and failed.error == "boom" and failed.finish_s is None and failed.e2e_s is None
    assert failed.first_token_s == 1.0 and failed.output_tokens == 2  # what arrived is kept for diagnosis
    plain = outcome_record(StreamOutcome(chunk_times=[1.0, 2.0, 3.0], usage={"prompt_tokens": 6}),
                           request_id=1, sent_s=0.0)
    assert plain.ok and plain.output_tokens == 3 and plain.prompt_tokens == 6 and plain.instance == ""


def test_outcome_record_keeps_the_proxys_prefill_leg():
    """The course proxy's ``X-Prefill-Seconds`` (any header case) lands in ``extra["prefill_leg_s"]``;
    a value that is not a number is kept under its own key, not dropped or raised on."""
    out = StreamOutcome(chunk_times=[1.2, 1.3], usage={"completion_tokens": 2}, headers={"x-prefill-seconds": "0.081250"})
    assert outcome_record(out, request_id=0, sent_s=1.0).extra == {"prefill_leg_s": pytest.approx(0.08125)}
    odd = StreamOutcome(chunk_times=[1.2], headers={"X-Prefill-Seconds": "soon"})
    assert outcome_record(odd, request_id=1, sent_s=1.0).extra == {"prefill_leg_s_unreadable": "soon"}
    assert "prefill_leg_s" not in outcome_record(StreamOutcome(chunk_times=[1.2]), request_id=2, sent_s=1.0).extra
