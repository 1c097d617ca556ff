"""The TTFT admission policy (pdlab.sched.admission, the proxy's and the simulator's), with a fake clock."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pdlab.sched.admission import (
    EngineState,
    PrefillModel,
    TTFTAdmission,
    replay_admission,
    simulate_admission,
)

MODEL = PrefillModel(0.010, 0.001)  # 10 ms + 1 ms per token


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_idle_server_admits_what_meets_the_slo_alone():
    policy = TTFTAdmission(MODEL, ttft_slo_s=0.5, handoff_s=0.02, clock=Clock())
    ok = policy.decide(400)
    assert ok.admit and ok.wait_s == 0 and ok.predicted_ttft_s == pytest.approx(0.010 + 0.400 + 0.020)
    too_long = policy.decide(600)  # 0.63 s alone
    assert not too_long.admit and too_long.retry_after_s == 1 and policy.rejected == 1


def test_the_queue_grows_with_admitted_prompts_and_shrinks_when_legs_return():
    clock = Clock()
    policy = TTFTAdmission(MODEL, ttft_slo_s=0.5, clock=clock, learn=0.0)  # the model as fitted
    for key in "abc":
        assert policy.decide(140).admit
        policy.start(key, 140)  # 0.15 s each
    assert policy.decide(0).wait_s == pytest.approx(0.45)
    assert not policy.decide(140).admit  # 0.45 + 0.15 > 0.5
    clock.t += 0.10
    policy.done("a")  # came back early: what is left is b and c
    assert policy.decide(140).wait_s == pytest.approx(0.30)
    policy.done("zzz")  # unknown keys are ignored
    assert policy.state()["in_flight"] == 2 and policy.admitted == 3


def test_slow_legs_teach_a_slowdown_that_lengthens_the_predicted_queue():
    clock = Clock()
    policy = TTFTAdmission(MODEL, ttft_slo_s=2.0, clock=clock, learn=0.5, tail_quantile=None)  # the mean
    policy.start("a", 140)  # predicted 0.15 s
    clock.t += 0.45         # came back 3x slower than predicted
    policy.done("a")
    assert policy.slowdown == pytest.approx(0.5 * 1.0 + 0.5 * 3.0)
    assert policy.state()["slowdown"] == pytest.approx(2.0)
    assert policy.prefill_s(140) == pytest.approx(0.30)
    assert policy.decide(140).predicted_ttft_s == pytest.approx(0.30)
    policy.start("b", 140)
    clock.t += 100.0        # a hung leg: the ratio is clamped, the slowdown stays finite
    policy.done("b")
    assert policy.slowdown == pytest.approx(0.5 * 2.0 + 0.5 * 20.0)
    with pytest.raises(ValueError, match="learn"):
        TTFTAdmission(MODEL, ttft_slo_s=1.0, learn=1.5)


def test_the_slowdown_covers_the_tail_of_the_legs_not_their_mean():
    clock = Clock()
    policy = TTFTAdmission(MODEL, ttft_slo_s=5.0, clock=clock, tail_quantile=0.9, tail_window=10)
    ratios = [1.0] * 8 + [3.0, 4.0]  # most legs as predicted, two much slower
    for i, ratio in enumerate(ratios):
        took = policy.prefill_s(140) * ratio  # this many times the leg's prediction, one leg at a time
        policy.start(str(i), 140)
        clock.t += took
        policy.done(str(i))
    assert policy.slowdown == pytest.approx(np.percentile(ratios, 90))
    assert policy.slowdown > np.mean(ratios)
    for i in range(10, 20):  # the window forgets the slow legs
        took = policy.prefill_s(140)
        policy.start(str(i), 140)
        clock.t += took
        policy.done(str(i))
    assert policy.slowdown == pytest.approx(1.0)


def test_retry_after_counts_whole_seconds_to_the_slo():
    clock = Clock()
    policy = TTFTAdmission(MODEL, ttft_slo_s=1.0, clock=clock)
    policy.start("x", 3990)  # 4.0 s of prefill queued
    verdict = policy.decide(90)  # 4.0 + 0.1 > 1.0
    assert not verdict.admit and verdict.retry_after_s == 4


def test_replay_rejects_a_burst_beyond_the_slo_and_recovers_after_it():
    arrivals = [0.0, 0.01, 0.02, 0.03, 0.04, 2.0]
    flags = replay_admission(arrivals, [190] * 6, MODEL, ttft_slo_s=0.5)  # 0.2 s each
    assert flags == [True, True, False, False, False, True]


def test_bad_settings_and_inputs_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="TTFT SLO"):
        TTFTAdmission(MODEL, ttft_slo_s=0)
    with pytest.raises(ValueError, match="coefficients"):
        PrefillModel(-1.0, 0.0)
    with pytest.raises(ValueError, match="time order"):
        replay_admission([1.0, 0.0], [1, 1], MODEL, 1.0)
    with pytest.raises(ValueError, match="does not exist"):
        PrefillModel.from_profile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"decode": [1, 2, 3]}))
    with pytest.raises(ValueError, match="'prefill'"):
        PrefillModel.from_profile(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"prefill": [0.01, 0.001, 0.0], "decode": [0, 0, 0]}))
    assert PrefillModel.from_profile(good) == MODEL


def test_headroom_admits_only_below_a_share_of_the_slo():
    clock = Clock()
    full = TTFTAdmission(MODEL, ttft_slo_s=0.5, clock=clock, learn=0.0)
    tight = TTFTAdmission(MODEL, ttft_slo_s=0.5, clock=clock, learn=0.0, headroom=0.5)
    assert tight.target_s == pytest.approx(0.25)
    assert full.decide(290).admit          # 0.30 s ≤ 0.5 s
    verdict = tight.decide(290)             # 0.30 s > 0.25 s
    assert not verdict.admit and verdict.retry_after_s == 1
    assert replay_admission([0.0], [290], MODEL, 0.5, headroom=0.5) == [False]
    with pytest.raises(ValueError, match="headroom"):
        TTFTAdmission(MODEL, ttft_slo_s=0.5, headroom=0.0)


# ---------------------------------------------------------------- the engines' own state
def _state(at, waiting=0, running=0, usage=0.0, kv_tokens=None):
    return EngineState(at, waiting, running, usage, kv_tokens)


def test_the_engines_queue_counts_what_the_bookkeeping_does_not_see():
    clock = Clock()
    reading = [_state(100.0, waiting=4, running=1)]
    policy = TTFTAdmission(MODEL, ttft_slo_s=0.5, clock=clock, learn=0.0, engine_state=lambda: reading[0])
    verdict = policy.decide(140)  # 5 requests queued on the engine × 0.15 s (the arriving prompt's own time)
    assert not verdict.admit and verdict.source == "engine" and verdict.wait_s == pytest.approx(0.75)
    reading[0] = _state(99.9)  # the engine was empty; a leg sent since counts on top of its reading
    policy.start("a", 140)
    clock.t += 0.01
    verdict = policy.decide(140)  # engine: 0 + 1 leg × 0.15 s; bookkeeping: 0.15 − 0.01 s
    assert verdict.admit and verdict.source == "engine" and verdict.wait_s == pytest.approx(0.15)
    policy.done("a")
    verdict = policy.decide(140)  # the leg came back after the reading too: nothing queued
    assert verdict.wait_s == 0


def test_decode_kv_headroom_refuses_what_decode_could_not_hold():
    clock = Clock()
    policy = TTFTAdmission(MODEL, ttft_slo_s=5.0, clock=clock, kv_limit=0.9,
                           engine_state=lambda: _state(100.0, usage=0.80, kv_tokens=10_000))
    assert policy.decide(400, output_tokens=500).admit              # 0.80 + 0.09 ≤ 0.9
    verdict = policy.decide(400, output_tokens=700)                 # 0.80 + 0.11 > 0.9
    assert not verdict.admit and verdict.reason == "decode_kv" and verdict.retry_after_s == 1


def test_a_stale_or_failing_reading_falls_back_to_the_bookkeeping_with_a_warning(caplog):
    clock = Clock()

    def broken():
        raise OSError("connection refused")

    for source in (broken, lambda: None, lambda: _state(90.0, waiting=50)):  # failing, none yet, 10 s old
        policy = TTFTAdmission(MODEL, ttft_slo_s=0.5, clock=clock, engine_state=source, max_state_age_s=1.0)
        with caplog.at_level("WARNING", logger="pdlab.sched.admission"):
            caplog.clear()
            verdict = policy.decide(140)
        assert verdict.admit and verdict.source == "bookkeeping" and policy.state_fallbacks == 1
        assert "falls back to the proxy's bookkeeping" in caplog.text


def test_the_simulator_and_the_proxy_decide_alike_on_the_same_arrivals(tmp_path):
    """One arrival pattern through the simulator and through the live proxy's decision path (its
    ``admit``), with the same engine-state readings and leg returns: the same decisions."""
    from aiohttp.test_utils import make_mocked_request
    from pdlab.serve.proxy import ProxyConfig
    from pdlab.serve.proxy.server import PDProxy, ProxyState

    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(0.08, 120)).tolist()  # ~12 req/s into a ~0.1-0.4 s prefill
    tokens = rng.integers(50, 300, 120).tolist()
    sim = simulate_admission(arrivals, tokens, TTFTAdmission(MODEL, 0.8, 0.02), engine_slowdown=1.8, poll_s=0.25)
    flags = sim.admitted()
    assert 0 < sum(flags) < len(flags), "the pattern must both admit and refuse to test anything"
    assert {d.source for d in sim.decisions} == {"engine", "bookkeeping"}

    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"prefill": [MODEL.a_s, MODEL.b_s_per_token, 0.0]}))
    state = ProxyState(ProxyConfig(["http://p"], ["http://d"], admission_profile=str(profile), ttft_slo_s=0.8,
                                   handoff_s=0.02))
    now, current = [0.0], [None]
    state.admission.clock, state.admission.engine_state = (lambda: now[0]), (lambda: current[0])
    proxy = PDProxy(state.config, state)
    live = []
    for kind, t, i in sim.events:
        now[0] = t
        if kind == "done":
            state.admission.done(str(i))  # what PDProxy.handle does when a prefill leg returns
            continue
        current[0] = sim.states[i]
        request = make_mocked_request("POST", "/v1/completions", headers={"X-Request-Id": str(i)})
        job = proxy.admit(request, {"model": "m", "prompt": [7] * tokens[i], "max_tokens": 0}, t)
        live.append(getattr(job, "status", 200) != 503)
    assert live == flags
    def run(poll_s, tail_quantile):
        policy = TTFTAdmission(MODEL, 0.8, 0.02, tail_quantile=tail_quantile)
        return simulate_admission(arrivals, tokens, policy, engine_slowdown=1.8, poll_s=poll_s)

    def p90(run):
        return np.percentile([t for t, ok in zip(run.ttft_s, run.admitted(), strict=True) if ok], 90)

    # on an engine 1.8x slower than the fit, a policy that learns the mean slowdown admits less and
    # misses by less when it reads the engine's queue; learning the tail (the default) lowers the p90 of
    # the admitted requests further, with or without the engine's state
    mean_engine, mean_bookkeeping = run(0.25, None), run(None, None)
    assert sum(mean_engine.admitted()) < sum(mean_bookkeeping.admitted())
    assert p90(mean_engine) < p90(mean_bookkeeping)
    assert p90(sim) < p90(mean_engine) and p90(run(None, 0.9)) < p90(mean_bookkeeping)


def test_simulator_bad_inputs_name_the_problem():
    policy = TTFTAdmission(MODEL, 1.0)
    with pytest.raises(ValueError, match="engine_slowdown"):
        simulate_admission([0.0], [1], policy, engine_slowdown=0.0)
    with pytest.raises(ValueError, match="poll_s"):
        simulate_admission([0.0], [1], policy, poll_s=0.0)
    with pytest.raises(ValueError, match="prefill_batch"):
        simulate_admission([0.0], [1], policy, prefill_batch=0)
    with pytest.raises(ValueError, match="tail_quantile"):
        TTFTAdmission(MODEL, 1.0, tail_quantile=1.5)
    with pytest.raises(ValueError, match="KV-cache usage"):
        _state(0.0, usage=1.5)


# ---------------------------------------------------------------- live /metrics: good, down, slow, malformed
_GOOD = ("vllm:num_requests_waiting{model_name=\"m\"} 3.0\nvllm:num_requests_running{model_name=\"m\"} 1.0\n"
         "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"
         "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"512\"} 1.0\n")


@pytest.fixture
def metrics_server():
    """A real HTTP server on 127.0.0.1 whose ``/metrics`` answers as ``mode[0]`` says."""
    import http.server
    import threading
    import time as _time

    mode = ["good"]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — http.server's name
            if mode[0] == "slow":
                _time.sleep(1.0)
            body = (_GOOD if mode[0] != "garbage" else "vllm:num_requests_waiting{{{ not prometheus\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", mode
    server.shutdown()
    server.server_close()


def _free_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


def test_metrics_poller_reads_vllm_names_and_a_bad_endpoint_never_blocks_a_decision(metrics_server, caplog):
    import time as _time

    from pdlab.serve.proxy.admission import MetricsPoller

    url, mode = metrics_server
    clock = Clock()
    poller = MetricsPoller(url, url, timeout_s=0.3, clock=clock)
    state = poller.poll()
    assert state == EngineState(100.0, 3, 1, 0.25, 16 * 512)
    policy = TTFTAdmission(MODEL, ttft_slo_s=0.5, clock=clock, learn=0.0, engine_state=poller, max_state_age_s=1.0)
    assert policy.decide(140).source == "engine"  # 4 queued × 0.15 s: refused
    for bad, where in (("slow", url), ("garbage", url), ("good", _free_port_url())):
        mode[0] = bad
        bad_poller = MetricsPoller(where, where, timeout_s=0.3, clock=clock)
        with caplog.at_level("WARNING"):
            caplog.clear()
            assert bad_poller.poll() is None and bad_poller.failures == 1
        assert "unreadable" in caplog.text, bad
        clock.t += 5.0  # the good reading ages out; the bad scrape left nothing newer
        policy.engine_state = bad_poller.start()
        t0 = _time.monotonic()
        with caplog.at_level("WARNING"):
            verdict = policy.decide(140)
        took = _time.monotonic() - t0
        bad_poller.stop()
        assert verdict.admit and verdict.source == "bookkeeping" and took < 0.05, (bad, took)
    assert policy.state_fallbacks == 3


def test_a_learned_handoff_lengthens_predictions_only_when_asked_and_never_below_the_measured_one():
    fixed = TTFTAdmission(MODEL, ttft_slo_s=0.5, handoff_s=0.05, clock=Clock(), learn=0.5)
    learning = TTFTAdmission(MODEL, ttft_slo_s=0.5, handoff_s=0.05, clock=Clock(), learn=0.5, learn_handoff=True)
    for policy in (fixed, learning):
        policy.observe_handoff(0.45)  # decode busy: the first token came 0.45 s after the prefill leg
        policy.observe_handoff(float("nan"))  # ignored
    assert fixed.handoff_now_s == 0.05 and fixed.decide(250).admit  # 0.26 + 0.05
    assert learning.handoff_now_s == pytest.approx(0.25)
    assert not learning.decide(250).admit  # 0.26 + 0.25 > 0.5
    learning.observe_handoff(0.0)
    learning.observe_handoff(0.0)
    learning.observe_handoff(0.0)
    assert learning.handoff_now_s == 0.05  # the measured idle hand-off is the floor
