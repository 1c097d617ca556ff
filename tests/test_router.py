"""Tests of pdlab.router: policy decisions, predictors, the simulated router, the live HTTP router."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import ClientSession, web
from pdlab.metrics import SLO
from pdlab.router.policies import (
    AllColocated,
    AllDisaggregated,
    ConstantPredictor,
    Estimate,
    HistoryPredictor,
    LoadEstimator,
    RouteRequest,
    SLOAware,
    TargetLoad,
    Threshold,
    make_policy,
    make_predictor,
)
from pdlab.router.server import RouterConfig, RouterServer, make_router_app
from pdlab.sim.latency import ConstantLatency, FittedLatency
from pdlab.workloads import Request, make_requests
from pdlab.workloads.agentic import generate_agentic


def test_baseline_and_threshold_decisions():
    short, long = RouteRequest(100, 50), RouteRequest(5000, 50)
    assert AllColocated().decide(long) == "colocated"
    assert AllDisaggregated().decide(short) == "disaggregated"
    t = Threshold(prompt_threshold=1000, min_output_tokens=2)
    assert t.decide(short) == "colocated" and t.decide(long) == "disaggregated"
    assert t.decide(RouteRequest(5000, 1)) == "colocated"  # a pure prefill: nothing to protect
    with pytest.raises(ValueError):
        make_policy("nope")
    with pytest.raises(ValueError):
        Threshold(-1)


def test_slo_aware_goes_where_the_predictions_fit():
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    p = SLOAware(slo)
    req = RouteRequest(1000, 100)
    fits_c = {"colocated": Estimate(0.5, 0.04), "disaggregated": Estimate(2.0, 0.01)}
    fits_d = {"colocated": Estimate(0.5, 0.09), "disaggregated": Estimate(0.8, 0.02)}
    both = {"colocated": Estimate(0.6, 0.04), "disaggregated": Estimate(0.2, 0.01)}
    neither = {"colocated": Estimate(3.0, 0.2), "disaggregated": Estimate(2.0, 0.1)}
    assert p.decide(req, fits_c) == "colocated"
    assert p.decide(req, fits_d) == "disaggregated"
    assert p.decide(req, both) == "disaggregated"  # lower score: more headroom
    assert p.decide(req, neither) == "disaggregated"
    with pytest.raises(ValueError):
        p.decide(req, None)


def test_load_estimator_colocated_stalls_and_disaggregated_transfer():
    lm = FittedLatency((0.01, 1e-4, 0.0), (0.005, 0.0, 0.001))
    est = LoadEstimator(lm, lm, lm, transfer_s=lambda n: n * 1e-5)
    req = RouteRequest(2000, 11)
    idle = TargetLoad()
    busy = TargetLoad(queued_prefill_tokens=8000, queued_prefill_sq_tokens=8000**2, decode_batch=10,
                      decode_ctx_tokens=10000)
    c_idle, c_busy = est.colocated(req, idle), est.colocated(req, busy)
    assert c_busy.ttft_s > c_idle.ttft_s and c_busy.tpot_s > c_idle.tpot_s
    assert c_idle.ttft_s == pytest.approx(0.01 + 0.2)
    d = est.disaggregated(req, idle, busy)
    assert d.ttft_s == pytest.approx(0.21 + 0.02 + d.tpot_s)
    assert d.tpot_s == pytest.approx(0.005 + 0.011)


def test_history_predictor_learns_per_key_and_bucket_and_forgets():
    h = HistoryPredictor(window=8, default=100, min_count=2)
    assert h.predict(500) == 100
    for _ in range(3):
        h.observe(500, 20, key="agent")
        h.observe(60, 400, key="chat")
    assert h.predict(500, "agent") == 20 and h.predict(60, "chat") == 400
    assert h.predict(510) == 20  # same length bucket
    assert h.predict(70_000) == pytest.approx(210)  # nothing alike: the overall mean
    for _ in range(8):
        h.observe(500, 50, key="agent")
    assert h.predict(500, "agent") == 50 and h.predict(60, "chat") == 50  # the window moved on
    h.reset()
    assert h.predict(60) == 100
    assert ConstantPredictor(7).predict(10**6) == 7.0
    assert make_predictor("history", default=3).predict(1) == 3.0


# ---------------------------------------------------------------------------- simulated router


def _mix(n: int = 120) -> list[Request]:
    """Short chat requests and long agentic prompts interleaved at a steady rate."""
    reqs = []
    for i in range(n):
        p, o = (6000, 20) if i % 3 == 0 else (200, 300)
        reqs.append(Request(i, i * 0.25, p, o, (1000 + (i % 3 == 0),)))
    return reqs


def test_routed_simulator_runs_mixed_pools_and_routes_by_policy():
    from pdlab.router.sim import simulate_routed

    reqs = _mix()
    base = dict(tp=4, colocated=1, prefill=1, decode=1, link="ib-ndr")
    thr = simulate_routed(reqs, "h100-sxm", "llama-3-70b", policy=Threshold(4000), **base)
    routes = {r.request_id: r.extra["route"] for r in thr.records}
    assert all(routes[r.request_id] == ("disaggregated" if r.prompt_tokens >= 4000 else "colocated") for r in reqs)
    assert all(r.ok for r in thr.records) and thr.num_gpus == 12
    assert {r.instance for r in thr.records if routes[r.request_id] == "disaggregated"} == {"decode-0"}
    allc = simulate_routed(reqs, "h100-sxm", "llama-3-70b", policy="all-colocated", **base)
    assert {r.extra["route"] for r in allc.records} == {"colocated"}
    slo = SLO(ttft_s=2.0, tpot_s=0.1)
    aware = simulate_routed(reqs, "h100-sxm", "llama-3-70b", policy=SLOAware(slo), predictor="history", **base)
    assert {r.extra["route"] for r in aware.records} == {"colocated", "disaggregated"}
    # mono clusters through the same entry point
    mono = simulate_routed(reqs, "h100-sxm", "llama-3-70b", tp=4, colocated=3, prefill=0, decode=0,
                           policy="all-colocated")
    assert mono.num_gpus == 12 and all(r.ok for r in mono.records)
    # the interference the router removes: long prefills stall colocated decodes
    tpot_short = lambda res: max(r.tpot_s for r in res.records if r.prompt_tokens < 4000)  # noqa: E731
    assert tpot_short(thr) < tpot_short(allc)


def test_history_predictor_learns_inside_the_simulator():
    from pdlab.router.sim import build_routed_simulator

    sim = build_routed_simulator("h100-sxm", "llama-3-70b", tp=4, policy=Threshold(4000, min_output_tokens=100),
                                 predictor="history")
    res = sim.run(_mix())
    routes = [r.extra["route"] for r in sorted(res.records, key=lambda r: r.request_id)]
    # early on the default guess (182 ≥ 100) disaggregates long prompts; once it has learned that
    # they answer with 20 tokens, they stay colocated
    assert routes[0] == "disaggregated" and routes[-3] == "colocated"


def test_prefix_caching_in_the_simulator_cuts_ttft_on_the_agentic_trace():
    from pdlab.router.sim import simulate_routed
    from pdlab.workloads import scale_rate

    reqs = scale_rate(generate_agentic(seed=0, sessions=60).requests(), 0.5)
    kw = dict(tp=4, colocated=2, prefill=0, decode=0, policy="all-colocated")
    off = simulate_routed(reqs, "h100-sxm", "llama-3-70b", **kw)
    on = simulate_routed(reqs, "h100-sxm", "llama-3-70b", prefix_caching=True, **kw)
    ttft = lambda res: sorted(r.ttft_s for r in res.records)[len(res.records) // 2]  # noqa: E731
    assert ttft(on) < 0.7 * ttft(off)
    ratio = sum(i["prefix_hit_tokens"] for i in on.instances) / sum(r.prompt_tokens for r in reqs)
    assert 0.3 < ratio < 0.7


# ------------------------------------------------------------------------------- live HTTP router


def _fake_backend(name: str, *, status: int = 200, tokens: int = 3, delay_s: float = 0.0, die: bool = False):
    """A fake OpenAI server streaming ``tokens`` chunks (or failing) — enough to test the router."""
    seen: list[dict] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if status != 200:
            return web.json_response({"error": {"message": f"{name} says no"}}, status=status)
        await asyncio.sleep(delay_s)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(tokens):
            chunk = {"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if die and i == 0:
                request.transport.close()
                return resp
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    async def ok(request):
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/health", ok)
    app.router.add_get("/proxy/stats", ok)
    return app, seen


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    from pdlab.process import free_port

    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _body(n_words: int, stream: bool = True) -> dict:
    return {"messages": [{"role": "user", "content": "word " * n_words}], "max_tokens": 4, "stream": stream}


def test_router_http_routes_streams_and_learns():
    async def main():
        c_app, c_seen = _fake_backend("colocated", tokens=3)
        d_app, d_seen = _fake_backend("pd", tokens=7)
        runners = []
        try:
            for app in (c_app, d_app):
                runners.append(await _serve(app))
            (_, c_url), (_, d_url) = runners
            pred = HistoryPredictor(min_count=1)
            cfg = RouterConfig([c_url], d_url, Threshold(500, min_output_tokens=1), pred)
            async with RouterServer(cfg) as url, ClientSession() as s:
                async with s.post(url + "/v1/chat/completions", json=_body(100)) as r:
                    assert r.status == 200 and r.headers["X-Route"] == "colocated"
                    text = await r.text()
                    assert text.count("data:") == 5
                async with s.post(url + "/v1/chat/completions", json=_body(4000)) as r:
                    assert r.status == 200 and r.headers["X-Route"] == "disaggregated"
                    await r.read()
                async with s.post(url + "/v1/chat/completions", json=_body(4000, stream=False)) as r:
                    await r.read()
                async with s.get(url + "/router/stats") as r:
                    st = await r.json()
                assert st["routes"] == {"colocated": 1, "disaggregated": 2} and st["ok"] == 3
                assert all(f["requests"] == 0 and f["decode_batch"] == 0 for f in st["inflight"].values())
                async with s.get(url + "/health") as r:
                    assert r.status == 200
            assert len(c_seen) == 1 and len(d_seen) == 2 and c_seen[0]["max_tokens"] == 4  # forwarded unchanged
            assert pred.predict(5004) == 7.0  # learned from usage.completion_tokens (≈ 4 chars per token)
        finally:
            for runner, _ in runners:
                await runner.cleanup()

    asyncio.run(main())


def test_router_http_errors_are_clean_4xx_5xx():
    async def main():
        bad_app, _ = _fake_backend("bad", status=500)
        four_app, _ = _fake_backend("four", status=422)
        die_app, _ = _fake_backend("die", tokens=5, die=True)
        runners = [await _serve(a) for a in (bad_app, four_app, die_app)]
        (_, bad), (_, four), (_, die) = runners
        from pdlab.process import free_port

        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        try:
            async with ClientSession() as s:
                for backend, expect in ((bad, 502), (four, 422), (dead, 502)):
                    cfg = RouterConfig([backend], None, AllColocated(), ConstantPredictor())
                    async with RouterServer(cfg) as url:
                        async with s.post(url + "/v1/chat/completions", json=_body(10)) as r:
                            assert r.status == expect, backend
                            assert "error" in await r.json()
                        if backend == dead:
                            async with s.get(url + "/health") as r:
                                assert r.status == 503
                cfg = RouterConfig([die], None, AllColocated(), ConstantPredictor())
                async with RouterServer(cfg) as url:
                    async with s.post(url + "/v1/chat/completions", json=_body(10)) as r:
                        assert r.status == 200
                        text = await r.text()
                        assert '"error"' in text  # the cut stream ends with an SSE error event
                    for payload in (b"not json", json.dumps({"messages": []}).encode(),
                                    json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode()):
                        async with s.post(url + "/v1/chat/completions", data=payload) as r:
                            assert r.status == 400
                    async with s.get(url + "/router/stats") as r:
                        st = await r.json()
                    assert st["client_errors"] == 3 and st["backend_errors"] == 1
                    assert all(f["requests"] == 0 for f in st["inflight"].values())
        finally:
            for runner, _ in runners:
                await runner.cleanup()

    asyncio.run(main())


def test_router_config_validation():
    with pytest.raises(ValueError):
        make_router_app(RouterConfig([], None, AllColocated(), ConstantPredictor()))
    with pytest.raises(ValueError):  # slo-aware without latency models
        make_router_app(RouterConfig(["http://127.0.0.1:1"], None, SLOAware(SLO(ttft_s=1)), ConstantPredictor()))


def test_router_leaves_no_process_and_no_listener():
    import socket

    from pdlab.process import live_processes

    async def main():
        cfg = RouterConfig(["http://127.0.0.1:9"], None, AllColocated(), ConstantPredictor())
        server = RouterServer(cfg)
        await server.start()
        port = server.port
        await server.stop()
        return port

    port = asyncio.run(main())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # the port is free again
    assert live_processes() == []


def test_cli_router_policies(capsys):
    from pdlab.cli import main

    assert main(["router", "policies", "--json"]) == 0
    names = [r.get("policy") for r in json.loads(capsys.readouterr().out)]
    assert {"all-colocated", "all-disaggregated", "threshold", "slo-aware"} <= set(names)
    assert main(["router", "serve"]) == 2


def test_open_loop_client_against_the_router():
    from pdlab.router.client import run_open_loop

    async def main():
        app, _ = _fake_backend("c", tokens=4, delay_s=0.01)
        runner, backend = await _serve(app)
        try:
            cfg = RouterConfig([backend], None, AllColocated(), ConstantPredictor())
            async with RouterServer(cfg) as url:
                return await run_open_loop(url, [_body(5), _body(5)], [0.0, 0.05])
        finally:
            await runner.cleanup()

    recs = asyncio.run(main())
    assert all(r.ok and r.output_tokens == 4 and r.instance == "colocated" for r in recs)
    assert recs[0].ttft_s >= 0.01 and len(recs[0].token_times_s) == 4


def test_constant_latency_estimates_are_usable():
    est = LoadEstimator(ConstantLatency(0.1, 0.01), ConstantLatency(0.1, 0.01), ConstantLatency(0.1, 0.01))
    assert est.colocated(RouteRequest(10, 5), TargetLoad()).ttft_s == pytest.approx(0.1)
    assert make_requests([0.0], 10, 5)[0].prompt_tokens == 10


def test_writeup_export_holds_table_and_plot(tmp_path):
    import pandas as pd
    import plotly.express as px
    from pdlab.course.export import export_writeup, writeup_notebook

    df = pd.DataFrame({"rate": [1, 2], "goodput_rps": [0.9, 1.7]})
    fig = px.line(df, x="rate", y="goodput_rps", title="goodput")
    nb = writeup_notebook(["# Title", df, fig], tmp_path / "w.ipynb")
    html = export_writeup(nb, tmp_path / "w.html").read_text()
    assert "<table" in html and "goodput_rps" in html and "plotly" in html.lower() and "# Title" not in html
    with pytest.raises(TypeError):
        writeup_notebook([object()], tmp_path / "bad.ipynb")


def test_session_timeout_is_a_failed_record_not_an_exception():
    """A backend slower than the client session's limit gives ok=False with a message (no timeout_s given)."""
    from pdlab.router.client import run_open_loop

    async def main():
        app, _ = _fake_backend("slow", delay_s=3.0)
        runner, url = await _serve(app)
        try:
            return await run_open_loop(url, [_body(10)], [0.0], timeout_s=0.5)
        finally:
            await runner.cleanup()

    (rec,) = asyncio.run(main())
    assert not rec.ok and "timed out" in rec.error


def test_a_tracked_request_moves_prefill_to_decode_once():
    from pdlab.router.server import InFlight, TrackedRequest

    backend, pre, dec = InFlight(), InFlight(), InFlight()
    t = TrackedRequest(prefill=pre, decode=dec, backend=backend, prompt_tokens=10)
    t.start()
    t.start()
    assert (backend.requests, pre.prefill_tokens, pre.prefill_sq_tokens, dec.decode_batch) == (1, 10, 100, 0)
    t.first_token()
    t.first_token()
    assert (pre.prefill_tokens, pre.prefill_sq_tokens, dec.decode_batch, dec.decode_ctx_tokens) == (0, 0, 1, 10)
    t.done()
    t.done()
    assert (backend.requests, dec.decode_batch, dec.decode_ctx_tokens, t.phase) == (0, 0, 0, "done")
    failed = TrackedRequest(prefill=pre, decode=dec, backend=backend, prompt_tokens=7)
    failed.start()
    failed.done()  # no chunk ever came: it still leaves every count
    assert vars(pre) == vars(dec) == vars(backend) == vars(InFlight())
