"""The TTFT admission policy of the P/D proxy (pdlab.serve.proxy.admission), with a fake clock."""

from __future__ import annotations

import json

import pytest
from pdlab.serve.proxy.admission import PrefillModel, TTFTAdmission, replay_admission

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
    policy = TTFTAdmission(MODEL, ttft_slo_s=2.0, clock=clock, learn=0.5)
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
