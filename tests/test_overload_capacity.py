"""Capacity as the highest rate whose requests meet the SLO (pdlab.serve.experiments.overload.slo_capacity),
against a stand-in server that serves one request at a time (0.1 s each: 10 req/s at most)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pdlab.metrics import SLO
from pdlab.serve.experiments.overload import DESIGNS, AdmissionSettings, overload_matrix, slo_capacity
from pdlab.workloads import make_requests


def _serial_server(service_s: float):
    lock = asyncio.Lock()

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.json()
        async with lock:  # one "prefill" at a time: a queue forms above 1 / service_s
            await asyncio.sleep(service_s)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {json.dumps({'choices': [{'text': 'x', 'index': 0}]})}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def models(request):
        return web.json_response({"data": [{"id": "m", "root": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


def _evenly(rate: float, n: int):
    return make_requests([i / rate for i in range(n)], [4] * n, [1] * n)


def _recorded(workload):
    """``workload`` and the list of the (rate, n) it is called with, in order."""
    calls: list[tuple[float, int]] = []

    def recording(rate: float, n: int):
        calls.append((rate, n))
        return workload(rate, n)

    return recording, calls


class _StopAtTheFirstRun(Exception):
    pass


class _NoProxy:
    """A deployment whose proxy restart ends the matrix before its first run is sent."""

    def restart_proxy(self, args=None):
        raise _StopAtTheFirstRun


def _matrix_calls(capacity_rps: float, duration_s: float) -> list[tuple[float, int]]:
    """The (rate, n) the overload matrix asks the workload for at 1x ``capacity_rps``."""
    workload, calls = _recorded(_evenly)
    admission = AdmissionSettings(model=None, handoff_s=0.0, profile_path="p.json", tokenizer="t")
    with pytest.raises(_StopAtTheFirstRun):
        overload_matrix(_NoProxy(), workload, SLO(ttft_s=0.25), admission, capacity_rps=capacity_rps, loads=[1.0],
                        duration_s=duration_s)
    return calls


def test_capacity_is_the_highest_rate_that_meets_the_slo_after_a_bisection_step(tiny_model):
    workload, calls = _recorded(_evenly)

    async def go():
        server = TestServer(_serial_server(0.1), host="127.0.0.1")
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            return await asyncio.to_thread(slo_capacity, url, workload, SLO(ttft_s=0.25, tpot_s=1.0), upper_rps=20.0,
                                           duration_s=1.5, fractions=(1.0, 0.7, 0.35), tokenizer=tiny_model.path)
        finally:
            await server.close()

    rate, probes = asyncio.run(go())
    winner = [c for c in calls if c[0] == pytest.approx(rate)]
    assert len(winner) == 1  # the capacity is a rate that was probed
    # the overload matrix's 1x run at that capacity draws the same arrivals (same rate, same count)
    assert _matrix_calls(rate, duration_s=1.5) == winner
    # 20 and 14 req/s outrun a 10 req/s server (the queue grows past the 0.25 s SLO); 7 req/s does not;
    # one bisection step then probes halfway between 0.35 and 0.7 of the upper rate, 10.5 req/s
    assert [p["share_of_upper"] for p in probes] == pytest.approx([1.0, 0.7, 0.35, 0.525])
    assert [p["bisection"] for p in probes] == [False, False, False, True]
    assert probes[0]["attainment"] < 0.9 <= probes[2]["attainment"] and probes[0]["ttft_p90_s"] > 0.25
    bisected_meets = probes[-1]["attainment"] >= 0.9
    assert rate == pytest.approx(10.5 if bisected_meets else 7.0)


def test_bad_capacity_settings_and_designs_are_named():
    with pytest.raises(ValueError, match="upper_rps"):
        slo_capacity("http://127.0.0.1:9", _evenly, SLO(ttft_s=1.0), upper_rps=0.0, duration_s=1.0)
    with pytest.raises(ValueError, match="bisect_steps"):
        slo_capacity("http://127.0.0.1:9", _evenly, SLO(ttft_s=1.0), upper_rps=1.0, duration_s=1.0, bisect_steps=-1)
    with pytest.raises(ValueError, match="unknown designs"):
        overload_matrix(None, _evenly, SLO(ttft_s=1.0), None, capacity_rps=1.0, loads=[1.0], duration_s=1.0,
                        designs=["no admission", "magic"])
    assert DESIGNS == ("no admission", "bookkeeping", "engine state")


def test_loaded_slowdown_is_the_bursts_first_token_span_over_the_fitted_prefills():
    from pdlab.metrics import RequestRecord
    from pdlab.sched.admission import PrefillModel
    from pdlab.serve.experiments.overload import loaded_slowdown

    model = PrefillModel(0.0, 0.001)  # 0.1 s per 100 tokens
    # four prompts sent at once; first tokens 0.2 s apart where the fit says 0.1 s: twice as slow
    recs = [RequestRecord(i, 0.0, 100, 4, first_token_s=0.1 + 0.2 * i, finish_s=1.0 + i) for i in range(4)]
    recs.append(RequestRecord(9, 0.0, 100, 4, ok=False, error="HTTP 500"))  # failures are left out
    assert loaded_slowdown(recs, model) == pytest.approx(2.0)
    fast = [RequestRecord(i, 0.0, 100, 4, first_token_s=0.05 * i, finish_s=1.0) for i in range(4)]
    assert loaded_slowdown(fast, model) == 1.0  # never below the idle fit
    with pytest.raises(ValueError, match="≥ 2 answered"):
        loaded_slowdown(recs[:1], model)


def test_replay_agreement_reads_a_saved_run_and_counts_equal_decisions(tmp_path):
    import json as _json

    from pdlab.metrics import RequestRecord, write_records
    from pdlab.sched.admission import PrefillModel, TTFTAdmission, simulate_admission
    from pdlab.serve.experiments.overload import replay_agreement

    model = PrefillModel(0.0, 0.001)  # 0.1 s per 100 tokens
    arrivals, tokens = [0.047 * i for i in range(12)], [100] * 12
    cal = {"prefill": [0.0, 0.001, 0.0], "handoff_s": 0.0, "engine_slowdown": 1.0, "headroom": 1.0, "ttft_slo_s": 0.35}
    (tmp_path / "calibration.json").write_text(_json.dumps(cal))
    replayed = simulate_admission(arrivals, tokens, TTFTAdmission(model, 0.35, 0.0), poll_s=None).admitted()
    assert 0 < sum(replayed) < len(replayed)
    live = list(replayed)
    live[-1] = not live[-1]  # the proxy decided one request the other way

    def recs(flags):
        return [RequestRecord(i, t, n, 1, first_token_s=t + 0.2, finish_s=t + 0.3) if ok else
                RequestRecord(i, t, n, 1, ok=False, error="HTTP 503: rejected on arrival")
                for i, (t, n, ok) in enumerate(zip(arrivals, tokens, flags, strict=True))]

    write_records(recs(live), tmp_path / "records_bookkeeping_3x.jsonl")
    write_records(recs([True] * 12), tmp_path / "records_no_admission_3x.jsonl")  # no policy: left out
    (row,) = replay_agreement(tmp_path)
    assert row["design"] == "bookkeeping" and row["load_x"] == 3.0 and row["requests"] == 12
    assert row["agree"] == pytest.approx(11 / 12)
    wrong_on = "agree_on_admitted" if live[-1] else "agree_on_refused"
    n_side = sum(live) if live[-1] else len(live) - sum(live)
    assert row[wrong_on] == pytest.approx((n_side - 1) / n_side)
    with pytest.raises(ValueError, match="calibration.json"):
        replay_agreement(tmp_path / "missing")
