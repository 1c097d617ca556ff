"""Unit tests of the live probes (pdlab.serve.probes, pdlab.serve.pair_probes) and of the stage that
runs and fits them (pdlab.simreal.probes) without a server: the probes' arithmetic on scripted records
(token times as a client would have seen them), the decode window, the burst retry, merging
prefill passes, and a calibration end to end. The live probes run in lab 05 and tests/test_live.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from pdlab.metrics import RequestRecord
from pdlab.serve import pair_probes, probes
from pdlab.serve.pair_probes import ContentionTimes, HandoffPoint
from pdlab.serve.probes import DecodePoint, PrefillPoint
from pdlab.simreal.calibration import Calibration, Contention, StepPoint
from pdlab.simreal.fit import admission_overhead_s, contention_factor, merge_prefill_points
from pdlab.simreal.probes import (
    ProbePlan,
    admission_from,
    calibrate,
    contention_from,
    handoff_rows,
    step_points,
)


def _stream(rid: int, prompt: int, first_s: float, step_s: float, tokens: int) -> RequestRecord:
    """A finished stream whose tokens arrived every ``step_s`` seconds from ``first_s``."""
    times = [first_s + k * step_s for k in range(tokens)]
    return RequestRecord(rid, 0.0, prompt, tokens, first_token_s=times[0], finish_s=times[-1],
                         token_times_s=times, server_prompt_tokens=prompt + 1)


def _burst(rid: int, prompt: int, at_s: float, tokens: int) -> RequestRecord:
    """A stream the client read in one burst: every token at the same instant."""
    return RequestRecord(rid, 0.0, prompt, tokens, first_token_s=at_s, finish_s=at_s,
                         token_times_s=[at_s] * tokens, server_prompt_tokens=prompt + 1)


class _ScriptedBench:
    """Stands in for probes.bench_records: returns the next scripted run and keeps what was asked."""

    def __init__(self, runs):
        self.runs, self.calls = list(runs), []

    def __call__(self, url, requests, *, seed, max_concurrency=None, **kwargs):
        self.calls.append((url, [(r.prompt_tokens, r.output_tokens) for r in requests], seed))
        return self.runs.pop(0)


def test_decode_window_is_last_first_token_to_first_finish():
    recs = [_stream(0, 32, 0.10, 0.01, 10), _stream(1, 32, 0.13, 0.01, 10)]
    assert probes.decode_window(recs) == pytest.approx((0.13, 0.19))


def test_probe_decode_reads_the_step_and_context_inside_the_window(monkeypatch):
    # two streams, 5 ms steps; the second starts 2 steps late, so the window holds 7 of its gaps
    run = [_stream(0, 32, 0.100, 0.005, 12), _stream(1, 32, 0.110, 0.005, 12)]
    bench = _ScriptedBench([run])
    monkeypatch.setattr(probes, "bench_records", bench)
    (pt,) = probes.probe_decode("http://x", [(2, 32)], output_tokens=12, repeats=1)
    assert pt.time_s == pytest.approx(0.005)
    assert isinstance(pt, DecodePoint) and pt.batch == 2 and pt.prompt_tokens == 32
    # window [0.110, 0.155]: stream 0 gaps k = 2..10, stream 1 gaps k = 0..8 (9 each); context = 33 + k
    assert pt.samples == 18
    assert pt.ctx_tokens == pytest.approx(2 * (33 + (sum(range(2, 11)) + sum(range(0, 9))) / 18))
    (row,) = step_points([pt])     # what the fit reads
    assert (row.kind, row.decode_batch, row.decode_ctx_tokens, row.prompt_tokens) == ("decode", 2, pt.ctx_tokens, 32)
    assert bench.calls[0][1] == [(32, 12), (32, 12)]


def test_probe_decode_sends_a_burst_read_run_again(monkeypatch):
    bench = _ScriptedBench([[_burst(0, 32, 0.5, 16)], [_stream(0, 32, 0.1, 0.004, 16)]])
    monkeypatch.setattr(probes, "bench_records", bench)
    (pt,) = probes.probe_decode("http://x", [(1, 32)], output_tokens=16, repeats=1)
    assert pt.time_s == pytest.approx(0.004) and pt.time_s > 0
    assert len(bench.calls) == 2 and bench.calls[0][2] != bench.calls[1][2]  # a fresh seed on the retry


def test_probe_decode_names_a_machine_that_only_ever_bursts(monkeypatch):
    monkeypatch.setattr(probes, "bench_records", _ScriptedBench([[_burst(0, 32, 0.5, 16)]] * 3))
    with pytest.raises(RuntimeError, match="one burst"):
        probes.probe_decode("http://x", [(1, 32)], output_tokens=16, repeats=1)


def test_probe_decode_too_few_steps_together_is_a_clear_error(monkeypatch):
    # the streams never overlap: the window is empty
    run = [_stream(0, 32, 0.1, 0.005, 4), _stream(1, 32, 0.5, 0.005, 4)]
    monkeypatch.setattr(probes, "bench_records", _ScriptedBench([run]))
    with pytest.raises(RuntimeError, match="fewer than 2 steps"):
        probes.probe_decode("http://x", [(2, 32)], output_tokens=4, repeats=1)


def test_probe_prefill_takes_the_median_ttft_per_server_length(monkeypatch):
    def bench(url, requests, *, seed, max_concurrency=None, **kwargs):
        assert max_concurrency == 1  # one prompt at a time
        return [RequestRecord(r.request_id, 0.0, r.prompt_tokens, 1, first_token_s=r.prompt_tokens * 1e-4 + 0.01 * (i % 3),
                              finish_s=1.0, server_prompt_tokens=r.prompt_tokens + 1)
                for i, r in enumerate(requests)]

    monkeypatch.setattr(probes, "bench_records", bench)
    pts = probes.probe_prefill("http://x", [100, 1000], repeats=3)
    assert all(isinstance(p, PrefillPoint) for p in pts) and [p.tokens for p in pts] == [101, 1001]
    assert all(p.samples == 3 and r.prefill_sq_tokens == p.tokens ** 2 and r.times_s == p.times_s
               for p, r in zip(pts, step_points(pts), strict=True))
    for p, n in zip(pts, (100, 1000), strict=True):
        assert min(p.times_s) <= p.time_s <= max(p.times_s)
        assert p.time_s >= n * 1e-4


def test_merge_prefill_points_keeps_each_pass_median_and_the_pooled_median():
    a = [StepPoint.prefill(16, 0.010, times_s=(0.009, 0.010, 0.011))]
    b = [StepPoint.prefill(16, 0.020, times_s=(0.019, 0.020, 0.021)), StepPoint.prefill(256, 0.050, times_s=(0.050,))]
    merged = {p.prefill_tokens: p for p in merge_prefill_points(a, b)}
    assert merged[16].pass_medians_s == (0.010, 0.020) and merged[16].samples == 6
    assert merged[16].time_s == pytest.approx(0.015)  # median of the six samples, not of the two medians
    assert merged[256].passes == 1 and merged[256].time_s == 0.050


# ---------------------------------------------------------------- the probes' formulas, pure
def test_contention_factor_is_busy_over_alone_minus_one_floored_at_zero():
    assert contention_factor(0.200, 0.250) == pytest.approx(0.25)
    assert contention_factor(0.010, 0.030) == pytest.approx(2.0)
    assert contention_factor(0.200, 0.200) == 0.0
    assert contention_factor(0.200, 0.150) == 0.0        # faster while busy (noise): no contention
    for alone, busy in ((0.0, 0.1), (-0.1, 0.1), (float("nan"), 0.1), (float("inf"), 0.1), (0.1, float("nan"))):
        assert math.isnan(contention_factor(alone, busy)), (alone, busy)


def test_admission_overhead_is_period_times_one_minus_alone_over_busy():
    # T = 0.4 s, m0 = 10 ms, m1 = 12.5 ms: F = 0.4·(1 − 0.8) = 0.08 s; check: m0·T/(T − F) = 0.004/0.32 = 12.5 ms
    assert admission_overhead_s(0.4, 0.010, 0.0125) == pytest.approx(0.08)
    assert 0.010 * 0.4 / (0.4 - 0.08) == pytest.approx(0.0125)
    assert admission_overhead_s(1.0, 0.010, 0.020) == pytest.approx(0.5)
    assert admission_overhead_s(0.4, 0.010, 0.010) == 0.0
    assert admission_overhead_s(0.4, 0.010, 0.008) == pytest.approx(-0.1)   # raw F is not clamped
    for m_busy in (0.0, -0.01, float("nan")):
        assert math.isnan(admission_overhead_s(0.4, 0.010, m_busy)), m_busy
    assert math.isnan(admission_overhead_s(0.4, float("nan"), 0.01))
    assert math.isnan(admission_overhead_s(float("nan"), 0.010, 0.01))


# ---------------------------------------------------------------- calibrate end to end on a scripted server
PRE = (0.010, 2e-5, 1e-9)        # prefill = a + b·l + c·l² (l: the server's prompt tokens)
DEC = (0.002, 1e-6, 5e-4)        # decode step = a + b·Σctx + c·batch


class _ScriptedEngine:
    """A server whose times follow FittedLatency's form exactly: a calibration must recover ``PRE``/``DEC``."""

    def __init__(self):
        self.calls = []

    def __call__(self, url, requests, *, seed, max_concurrency=None, **kwargs):
        self.calls.append((url, len(requests), requests[0].output_tokens, max_concurrency))
        out = []
        if any(r.arrival_s > 0 for r in requests):            # prefill stall probe: prompts among streams
            return self._stall_round(requests)
        if all(r.output_tokens == 1 for r in requests):       # prefill probe: one prompt at a time
            for r in requests:
                n = r.prompt_tokens + 1
                t = PRE[0] + PRE[1] * n + PRE[2] * n * n
                out.append(RequestRecord(r.request_id, 0.0, r.prompt_tokens, 1, first_token_s=t, finish_s=t,
                                         token_times_s=[t], server_prompt_tokens=n))
            return out
        b = len(requests)                                     # decode probe: b streams in lockstep
        times = [0.1]
        for k in range(requests[0].output_tokens - 1):       # the gap k → k + 1 reads context p + 1 + k per stream
            ctx = sum(r.prompt_tokens + 1 + k for r in requests)
            times.append(times[-1] + DEC[0] + DEC[1] * ctx + DEC[2] * b)
        for r in requests:
            out.append(RequestRecord(r.request_id, 0.0, r.prompt_tokens, r.output_tokens, first_token_s=times[0],
                                     finish_s=times[-1], token_times_s=list(times),
                                     server_prompt_tokens=r.prompt_tokens + 1))
        return out


    @staticmethod
    def _stall_round(requests):
        """Streams stepping at ``DEC`` from t = 0.1; a step that starts after a prompt was sent admits
        it and takes ``STALL_FIXED`` + its per-token prefill terms longer; its first token ends that step."""
        streams = [r for r in requests if r.output_tokens > 1]
        waiting = sorted((r for r in requests if r.output_tokens == 1), key=lambda r: r.arrival_s)
        times, first = [0.1], {}
        for k in range(streams[0].output_tokens - 1):
            step = DEC[0] + DEC[1] * sum(r.prompt_tokens + 1 + k for r in streams) + DEC[2] * len(streams)
            while waiting and waiting[0].arrival_s <= times[-1]:
                n = waiting[0].prompt_tokens + 1
                step += STALL_FIXED + PRE[1] * n + PRE[2] * n * n
                first[waiting.pop(0).request_id] = times[-1] + step
            times.append(times[-1] + step)
        out = [RequestRecord(r.request_id, 0.0, r.prompt_tokens, r.output_tokens, first_token_s=times[0],
                             finish_s=times[-1], token_times_s=list(times), server_prompt_tokens=r.prompt_tokens + 1)
               for r in streams]
        for r in requests:
            if r.request_id in first:
                t = first[r.request_id]
                out.append(RequestRecord(r.request_id, r.arrival_s, r.prompt_tokens, 1, first_token_s=t, finish_s=t,
                                         token_times_s=[t], server_prompt_tokens=r.prompt_tokens + 1))
        return out


STALL_FIXED = 0.004              # a prefill's fixed cost inside a decode step (of PRE's 0.010; DEC's a is 0.002)


def test_calibrate_recovers_the_scripted_engine(monkeypatch):
    engine = _ScriptedEngine()
    monkeypatch.setattr(probes, "bench_records", engine)
    monkeypatch.setattr(probes, "server_context_tokens", lambda url: 2048)
    res = calibrate("http://p", plan="smoke", meta={"note": "scripted"})
    assert list(res.latency.prefill) == pytest.approx(PRE, rel=1e-6)
    assert list(res.latency.decode) == pytest.approx(DEC, rel=1e-6)
    # smoke: one prefill pass over 3 lengths; decode pairs (1, 32), (1, 256), (16, 32), (16, 256), once each
    assert [p.prefill_tokens for p in res.prefill_points] == [17, 257, 1025]
    assert [(p.decode_batch, p.prompt_tokens) for p in res.decode_points] == [(1, 32), (1, 256), (16, 32),
                                                                                   (16, 256)]
    # then one stall round: 4 streams, 16- and 128-token prompts twice each, streams long enough to span them
    assert [c[1:] for c in engine.calls[:5]] == [(3, 1, 1), (1, 16, None), (1, 16, None), (16, 16, None), (16, 16, None)]
    (stall_call,) = engine.calls[5:]
    assert stall_call[1] == 4 + 4 and stall_call[2] > 64
    assert res.kv_link is None and res.contention is None and res.admission is None
    # the stall's fixed part is recovered; a_p − a_d splits into it and what the engine never ran
    stall = res.prefill_stall
    assert (stall.streams, stall.injections, stall.stream_prompt) == (4, 4, 256)
    assert stall.fixed_s == pytest.approx(STALL_FIXED, abs=2e-4)
    assert stall.fixed_s + stall.off_engine_s == pytest.approx(PRE[0] - DEC[0], rel=1e-6)
    assert Calibration.from_latency(res.latency).prefill_stall == stall   # it rides in the profile
    assert res.latency.meta["note"] == "scripted" and res.latency.meta["fit"]["prefill"]["r2"] == pytest.approx(1.0)
    # one 1,024-token prompt from the fitted model: 0.010 + 2e-5·1024 + 1e-9·1024²
    assert res.latency.prefill_time_s([1024]) == pytest.approx(0.010 + 2e-5 * 1024 + 1e-9 * 1024 ** 2, rel=1e-6)


def test_calibrate_two_servers_probes_decode_there_and_records_contention(monkeypatch):
    engine = _ScriptedEngine()
    monkeypatch.setattr(probes, "bench_records", engine)
    times = ContentionTimes(prompt_tokens=1024, decode_streams=16, prefill_alone_s=0.2, prefill_busy_s=0.22,
                            decode_alone_s=0.01, decode_busy_s=0.012, prefill_background="16 streams decoding")
    monkeypatch.setattr(pair_probes, "probe_contention", lambda url, decode_url, **kw: times)
    plan = ProbePlan(prefill_lengths=(16, 256, 1024), decode_batches=(1, 8), decode_prompts=(32, 128),
                     decode_tokens=16, repeats=1, decode_repeats=1, max_probe_tokens=2048, prefill_passes=2,
                     warmup_passes=0)
    res = calibrate("http://p", plan=plan, decode_url="http://d")
    measured = contention_from(times)
    assert (measured.prefill, measured.decode) == pytest.approx((0.1, 0.2))
    assert measured.prefill_alone_s == 0.2 and measured.prefill_background == "16 streams decoding"
    assert [c[0] for c in engine.calls] == ["http://p"] + ["http://d"] * 4 + ["http://p"]   # second prefill pass last
    assert all(p.passes == 2 and p.samples == 2 for p in res.prefill_points)
    assert isinstance(res, Calibration) and res.contention == measured
    assert res.latency.meta["cpu_contention"] == measured.to_dict()   # the profile form rides in meta
    assert Calibration.from_latency(res.latency).contention == measured
    assert list(res.latency.prefill) == pytest.approx(PRE, rel=1e-6)
    with pytest.raises(ValueError, match="unknown probe plan"):
        calibrate("http://p", plan="nope")


def test_calibrate_warms_up_untimed_before_it_probes(monkeypatch):
    """A warm-up pass sends the plan's prefill lengths and decode pairs first, with other prompt
    text, and leaves the fit as it was without it."""
    plan = ProbePlan(prefill_lengths=(16, 256, 1024), decode_batches=(1, 8), decode_prompts=(32, 128),
                     decode_tokens=16, repeats=1, decode_repeats=1, max_probe_tokens=2048, prefill_passes=1,
                     stall_rounds=0, warmup_passes=0)
    monkeypatch.setattr(pair_probes, "probe_contention", lambda url, decode_url, **kw: ContentionTimes(
        prompt_tokens=1024, decode_streams=16, prefill_alone_s=0.2, prefill_busy_s=0.2, decode_alone_s=0.01,
        decode_busy_s=0.01, prefill_background="16 streams decoding"))
    fits = {}
    for warm in (0, 1):
        engine, seeds = _ScriptedEngine(), []
        monkeypatch.setattr(probes, "bench_records", lambda url, reqs, *, seed, engine=engine, seeds=seeds, **kw: (
            seeds.append(seed), engine(url, reqs, seed=seed, **kw))[1])
        fits[warm] = calibrate("http://p", plan=replace(plan, warmup_passes=warm), decode_url="http://d")
        timed = ["http://p"] + ["http://d"] * 4
        assert [c[0] for c in engine.calls] == timed * (1 + warm)
        if warm:   # other prompt text: a prompt seen before would hit the prefix cache
            assert not set(seeds[:5]) & set(seeds[5:])
    assert list(fits[1].latency.prefill) == pytest.approx(list(fits[0].latency.prefill), rel=1e-9)
    assert list(fits[1].latency.decode) == pytest.approx(list(fits[0].latency.decode), rel=1e-9)
    with pytest.raises(ValueError, match="warmup_passes must be >= 0"):
        replace(plan, warmup_passes=-1).check()


def _admission_engine(monkeypatch, *, cold_step_s: float, step_s: float, context: int | None):
    """Scripted decode server for probe_admission: streams step every ``step_s`` (the first,
    48-token run every ``cold_step_s``); side requests through the proxy answer at once."""
    calls = []

    def bench(url, requests, *, seed, max_concurrency=None, **kwargs):
        calls.append((url, len(requests), requests[0].output_tokens))
        if url == "proxy":
            return [RequestRecord(r.request_id, r.arrival_s, r.prompt_tokens, 1, first_token_s=r.arrival_s + 0.01,
                                  finish_s=r.arrival_s + 0.01, token_times_s=[r.arrival_s + 0.01],
                                  server_prompt_tokens=r.prompt_tokens) for r in requests]
        step = cold_step_s if requests[0].output_tokens == 48 else step_s
        return [_stream(r.request_id, r.prompt_tokens, 0.05, step, r.output_tokens) for r in requests]

    monkeypatch.setattr(probes, "bench_records", bench)
    monkeypatch.setattr(probes, "server_context_tokens", lambda url: context)
    return calls


def test_admission_probe_streams_outlast_the_side_traffic_when_the_first_run_overstates_the_step(monkeypatch):
    """The 48-token sizing run read 10 ms a step, the engine steps in 4 ms: sized on the first run
    alone the streams ended at 2.6 s, before the side traffic (0.5–5.3 s): "the decode streams ended
    before the side traffic" in a fresh clone's lab 05 on a fast machine. The first full run is timed
    and the streams lengthened; the context caps them, and then fewer side requests are sent."""
    calls = _admission_engine(monkeypatch, cold_step_s=0.010, step_s=0.004, context=2128)
    adm = pair_probes.probe_admission("proxy", "decode")
    streams = [c for c in calls if c[0] == "decode"]
    assert streams[0][2] == 48 and streams[-1][2] == 2128 - 256 - 8, "lengthened to what the context holds"
    assert adm.side_requests == 12 and adm.itl_busy_s == pytest.approx(0.004)
    assert admission_from(adm).raw_overhead_s == pytest.approx(0.0) and admission_from(adm).overhead_s == 0.0
    assert all(t <= 2128 - 256 for _, _, t in streams), "no stream asks for more than the context holds"

    calls = _admission_engine(monkeypatch, cold_step_s=0.004, step_s=0.004, context=1024)
    adm = pair_probes.probe_admission("proxy", "decode")
    assert max(t for u, _, t in calls if u == "decode") == 1024 - 256 - 8
    assert adm.side_requests == 3, "a short context: fewer side requests, inside the streams' span"
    assert [n for u, n, _ in calls if u == "proxy"] == [3]


class _PairWithProxy:
    """A CPU pair behind the course proxy, for probe_contention: a prefill's leg (``X-Prefill-Seconds``)
    takes ``leg_s`` alone and 1.3 × as long while background streams run through the proxy; decode
    streams step every 10 ms alone and every 12 ms while prompts are prefilled at the prefill server."""

    def __init__(self, leg_s: float = 0.1):
        import threading

        self.leg_s, self.calls, self.lock = leg_s, [], threading.Lock()
        self.streaming = self.prefilling = 0

    def __call__(self, url, requests, *, seed, max_concurrency=None, **kwargs):
        import time

        with self.lock:
            self.calls.append((url, [(r.prompt_tokens, r.output_tokens) for r in requests], max_concurrency))
        if url == "http://proxy" and requests[0].output_tokens > 1:   # renewed streams: busy for a while
            self.streaming += 1
            time.sleep(0.05)
            self.streaming -= 1
            return [_stream(r.request_id, r.prompt_tokens, 0.01, 0.01, r.output_tokens) for r in requests]
        if requests[0].output_tokens == 1:                             # prefills, through the proxy or not
            self.prefilling += url == "http://p"
            leg = self.leg_s * (1.3 if self.streaming else 1.0)
            out = []
            for r in requests:
                rec = RequestRecord(r.request_id, 0.0, r.prompt_tokens, 1, first_token_s=leg + 0.02, finish_s=leg + 0.02,
                                    token_times_s=[leg + 0.02], server_prompt_tokens=r.prompt_tokens + 1)
                if url == "http://proxy":
                    rec.extra["prefill_leg_s"] = leg
                out.append(rec)
            time.sleep(0.01)
            self.prefilling -= url == "http://p"
            return out
        step = 0.012 if self.prefilling else 0.010                      # decode streams at the decode server
        return [_stream(r.request_id, r.prompt_tokens, 0.1, step, r.output_tokens) for r in requests]


def test_contention_through_the_proxy_times_legs_while_streams_start_and_end(monkeypatch):
    pair = _PairWithProxy()
    monkeypatch.setattr(probes, "bench_records", pair)
    c = pair_probes.probe_contention("http://p", "http://d", proxy_url="http://proxy", repeats=3)
    assert c.prefill_alone_s == pytest.approx(0.1) and c.prefill_busy_s == pytest.approx(0.13)
    assert contention_from(c).prefill == pytest.approx(0.3) and c.prefill_background == "1 renewed stream through the proxy"
    renewed = [call for call in pair.calls if call[0] == "http://proxy" and call[1][0][1] > 1]
    assert renewed and all(call[1] == [(16, 64)] * 8 and call[2] == 1 for call in renewed)
    assert c.decode_streams == 16 and c.decode_alone_s == pytest.approx(0.010)
    # without the proxy: TTFT at the prefill server while 16 streams decode, as before
    pair.calls.clear()
    plain = pair_probes.probe_contention("http://p", "http://d", repeats=3)
    assert plain.prefill_background == "16 streams decoding" and contention_from(plain).prefill == 0.0
    assert not any(call[0] == "http://proxy" for call in pair.calls)
    term = contention_from(c)
    assert Contention.from_dict(term.to_dict()) == term and Contention.from_dict({"prefill": 0.2}).prefill_background == ""


def test_contention_through_a_proxy_without_the_leg_header_is_a_clear_error(monkeypatch):
    pair = _PairWithProxy()

    def no_header(url, requests, **kw):
        recs = pair(url, requests, **kw)
        for r in recs:
            r.extra.pop("prefill_leg_s", None)
        return recs

    monkeypatch.setattr(probes, "bench_records", no_header)
    with pytest.raises(RuntimeError, match="X-Prefill-Seconds"):
        pair_probes.probe_contention("http://p", "http://d", proxy_url="http://proxy", repeats=1)
    with pytest.raises(ValueError, match="renewed_streams"):
        pair_probes.probe_contention("http://p", "http://d", proxy_url="http://proxy", renewed_streams=0)


def test_while_running_measures_during_the_background_and_names_its_failure():
    import threading

    seen, running = [], threading.Event()

    def background(tag):
        seen.append(tag)
        running.set()

    assert pair_probes.while_running(background, lambda: running.is_set(), settle_s=0.05, first_tag=7) is True
    count = len(seen)
    assert seen[:2] == [7, 8]
    import time

    time.sleep(0.05)
    assert len(seen) == count   # the loop ended with the measurement

    def broken(tag):
        raise OSError("connection refused")

    with pytest.raises(RuntimeError, match="contention probe: background load failed: connection refused"):
        pair_probes.while_running(broken, lambda: 1.0, settle_s=0.01, label="contention probe")


def test_prefill_stalls_subtract_the_local_step_and_count_merged_chunks():
    """Two streams stepping 5 ms, a prompt sent at 0.1025 s whose first token comes at 0.125 s, the
    step it joined 15 ms long (10 ms of stall): each stream's span around it less its steps at 5 ms
    is 10 ms, even where the API server sent two of a stream's tokens in one chunk; a stream that
    ended before the window is left out; a prompt that no stream spans has no row."""
    times = [0.005 * k for k in range(41)]
    times = times[:22] + [t + 0.010 for t in times[22:]]            # the step 0.105 → 0.120 (+10 ms)
    a = RequestRecord(0, 0.0, 32, 41, times[0], times[-1], token_times_s=list(times), server_prompt_tokens=33)
    merged_t = times[:24] + times[25:]                               # one chunk of 2 tokens at times[25]
    b = RequestRecord(1, 0.0, 32, 41, merged_t[0], merged_t[-1], token_times_s=merged_t,
                      chunk_tokens=[1] * 24 + [2] + [1] * 15, server_prompt_tokens=33)
    short = RequestRecord(2, 0.0, 32, 10, 0.0, 0.045, token_times_s=[0.005 * k for k in range(10)],
                          server_prompt_tokens=33)
    inj = RequestRecord(9, 0.1025, 100, 1, 0.125, 0.125, token_times_s=[0.125], server_prompt_tokens=101)
    late = RequestRecord(10, 5.0, 100, 1, 5.01, 5.01, token_times_s=[5.01], server_prompt_tokens=101)
    (row,) = probes.prefill_stalls([a, b, short, inj, late], [9, 10])
    assert row.stall_s == pytest.approx(0.010) and row.prompt_tokens == 101
    assert row.ttft_s == pytest.approx(0.0225)


def test_prefill_stall_probe_needs_streams_that_outlast_the_prompts(monkeypatch):
    """Streams that end before the first prompt is sent leave nothing to time: a clear error; bad
    settings are a ValueError, and the plan checks its own."""
    bench = _ScriptedBench([[_stream(0, 256, 0.1, 0.005, 20), RequestRecord(4, 1.0, 16, 1, 1.01, 1.01,
                                                                            token_times_s=[1.01])]])
    monkeypatch.setattr(probes, "bench_records", bench)
    with pytest.raises(RuntimeError, match="raise stream_tokens"):
        probes.probe_prefill_stall("http://x", [16], streams=1, stream_tokens=20, rounds=1)
    assert bench.calls[0][1] == [(256, 20), (16, 1)]
    with pytest.raises(ValueError, match="streams >= 1"):
        probes.probe_prefill_stall("http://x", [16], streams=0)
    with pytest.raises(ValueError, match="prefill stall probe"):
        ProbePlan(stall_streams=0).check()
    ProbePlan(stall_rounds=0, stall_streams=0).check()    # no stall probe: nothing to check


def test_handoff_points_become_the_fit_rows_with_the_leg_only_where_the_proxy_timed_it():
    rows = handoff_rows([HandoffPoint(33, 0.05, 3, 0.03), HandoffPoint(513, 0.2, 3)])
    assert rows == [{"tokens": 33, "ttft_s": 0.05, "samples": 3, "prefill_leg_s": 0.03},
                    {"tokens": 513, "ttft_s": 0.2, "samples": 3}]
    with pytest.raises(TypeError, match="probe_prefill or probe_decode"):
        step_points([HandoffPoint(33, 0.05, 3)])


def test_probe_handoff_warms_up_untimed_with_other_text(monkeypatch):
    """The warm-up pass sends each length once before the timed ones; its slow answers are not in
    the points, and its prompt text differs from theirs."""
    calls = []

    def bench(url, requests, *, seed, max_concurrency=None, **kwargs):
        calls.append((seed, sorted(r.prompt_tokens for r in requests)))
        ttft = 1.0 if len(calls) == 1 else 0.02   # a cold pair's first hand-offs are slow
        return [RequestRecord(r.request_id, 0.0, r.prompt_tokens, 1, first_token_s=ttft, finish_s=ttft,
                              token_times_s=[ttft], server_prompt_tokens=r.prompt_tokens) for r in requests]

    monkeypatch.setattr(probes, "bench_records", bench)
    points = pair_probes.probe_handoff("http://proxy", [32, 512], repeats=3, warmup=1, seed=5)
    assert calls[0][1] == [32, 512] and calls[1][1] == [32, 32, 32, 512, 512, 512]
    assert calls[0][0] != calls[1][0]
    assert [p.ttft_s for p in points] == [0.02, 0.02] and [p.samples for p in points] == [3, 3]
    calls.clear()
    pair_probes.probe_handoff("http://proxy", [32, 512], repeats=3, seed=5)
    assert len(calls) == 1
