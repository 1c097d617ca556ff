"""Unit tests of pdlab.simreal.calibrate: fitting (known coefficients recovered, bad input → clear errors),
profiles readable by the simulator, simulator set-ups, and the error table. No live server."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from pdlab.metrics import SLO, RequestRecord
from pdlab.serve.probes import PROBE_PLANS, ProbePlan
from pdlab.sim.latency import FittedLatency, load_profile, sample_points
from pdlab.simreal.calibrate import (
    ERROR_COLUMNS,
    TTFT_PHASES,
    build_sim,
    compare_runs,
    decode_steps_vs_model,
    error_table,
    fit_handoff,
    fit_profile,
    fit_row,
    live_ttft_phases,
    load_calibration,
    offered_prefill_load,
    requests_from_records,
    save_calibration,
    sim_ttft_phases,
    simulate_like_live,
)
from pdlab.simreal.records import Admission, Calibration, Contention, LinkFit, StepPoint
from pdlab.workloads import make_requests

TRUE = FittedLatency((0.004, 2.0e-5, 3.0e-9), (0.003, 1.0e-7, 2.0e-4))


def _points(noise: float = 0.0, seed: int = 0):
    return sample_points(TRUE, prefill_lengths=(16, 128, 512, 1024, 1536), prefill_batches=(1,),
                         decode_batches=(1, 4, 16, 32), decode_contexts=(64, 512), noise=noise, seed=seed)


# ------------------------------------------------------------------ fitting recovers known coefficients
def test_fit_recovers_exact_coefficients():
    lat = fit_profile(_points())
    assert np.allclose(lat.prefill, TRUE.prefill, rtol=1e-6)
    assert np.allclose(lat.decode, TRUE.decode, rtol=1e-6)
    assert lat.meta["fit"]["prefill"]["mape"] < 1e-9 and lat.meta["fit"]["decode"]["r2"] > 0.999999


@pytest.mark.parametrize("relative", [True, False])
def test_fit_with_noise_is_close_and_predicts_within_noise(relative):
    lat = fit_profile(_points(noise=0.02, seed=3), relative=relative)
    for n in (64, 700, 1500):
        assert math.isclose(lat.prefill_time_s([n]), TRUE.prefill_time_s([n]), rel_tol=0.05)
    for b, ctx in ((1, 100), (8, 300), (32, 500)):
        assert math.isclose(lat.decode_time_s([ctx] * b), TRUE.decode_time_s([ctx] * b), rel_tol=0.05)
    assert lat.meta["fit"]["prefill"]["mape"] < 0.05


def test_fit_separate_prefill_and_decode_points_and_coefficients_non_negative():
    pts = _points()
    pre = [p for p in pts if p["prefill_tokens"] > 0]
    dec = [p for p in pts if p["decode_batch"] > 0]
    lat = fit_profile(pre, decode_points=dec)
    assert np.allclose(lat.decode, TRUE.decode, rtol=1e-6)
    # a decode time that falls with batch would need a negative coefficient: NNLS clips it at 0
    odd = [dict(p, time_s=0.01 / p["decode_batch"] + 1e-3) for p in dec]
    coef, _ = fit_row(odd, "decode")
    assert min(coef) >= 0.0


def test_fit_row_quality_fields():
    coef, q = fit_row(_points(), "prefill")
    assert set(q) == {"r2", "mape", "max_rel_err", "points"} and q["points"] == 5
    assert np.allclose(coef, TRUE.prefill, rtol=1e-6)


# ------------------------------------------------------------------ bad input → clear errors
@pytest.mark.parametrize("points, match", [
    ([], "need >= 3 prefill points"),
    ([{"prefill_tokens": 10}], "lacks prefill_sq_tokens"),
    (["not a dict"], "must be a mapping"),
    ([{"prefill_tokens": 10, "prefill_sq_tokens": 100, "decode_batch": 0, "decode_ctx_tokens": 0,
       "time_s": float("nan")}], "time_s must be a finite number"),
    ([{"prefill_tokens": 10, "prefill_sq_tokens": 100, "decode_batch": 0, "decode_ctx_tokens": 0,
       "time_s": 0.0}], "time_s must be > 0"),
    ([{"prefill_tokens": -1, "prefill_sq_tokens": 1, "decode_batch": 0, "decode_ctx_tokens": 0,
       "time_s": 0.1}], "prefill_tokens must be >= 0"),
    ([{"prefill_tokens": 10, "prefill_sq_tokens": 100, "decode_batch": 2, "decode_ctx_tokens": 20,
       "time_s": 0.1}], "mixes prefill and decode"),
    ([{"prefill_tokens": 0, "prefill_sq_tokens": 0, "decode_batch": 0, "decode_ctx_tokens": 0,
       "time_s": 0.1}], "neither prefill tokens nor a decode batch"),
    ([{"prefill_tokens": "10", "prefill_sq_tokens": 100, "decode_batch": 0, "decode_ctx_tokens": 0,
       "time_s": 0.1}], "must be a finite number"),
])
def test_fit_rejects_bad_points(points, match):
    with pytest.raises(ValueError, match=match):
        fit_row(points, "prefill")


def test_fit_rejects_points_that_cannot_separate_coefficients():
    one_length = [{"prefill_tokens": 256, "prefill_sq_tokens": 256.0**2, "decode_batch": 0, "decode_ctx_tokens": 0,
                   "time_s": 0.02 + 0.001 * i} for i in range(4)]
    with pytest.raises(ValueError, match="cannot separate the three coefficients.*distinct prompt lengths"):
        fit_row(one_length, "prefill")
    one_batch = [{"prefill_tokens": 0, "prefill_sq_tokens": 0.0, "decode_batch": 4, "decode_ctx_tokens": c,
                  "time_s": 0.005 + c * 1e-7} for c in (100, 400, 800)]
    with pytest.raises(ValueError, match="cannot separate"):
        fit_row(one_batch, "decode")
    with pytest.raises(ValueError, match="kind must be"):
        fit_row(_points(), "mixed")
    with pytest.raises(ValueError, match="need >= 3 decode points"):
        fit_profile([p for p in _points() if p["prefill_tokens"] > 0])


def test_probe_plans_are_identifiable_and_bad_plans_rejected():
    for plan in PROBE_PLANS.values():
        plan.check()
        assert all(b * p <= plan.max_probe_tokens for b, p in plan.decode_pairs())
    with pytest.raises(ValueError, match="distinct lengths"):
        ProbePlan(prefill_lengths=(16, 16, 32)).check()
    with pytest.raises(ValueError, match="decode probes need"):
        ProbePlan(decode_batches=(1,)).check()


def test_merge_prefill_points_takes_the_median_over_every_pass():
    from pdlab.simreal.calibrate import merge_prefill_points

    a = [StepPoint.prefill(256, 0.05, samples=3, times_s=(0.04, 0.05, 0.09))]
    b = [StepPoint.prefill(256, 0.07, samples=3, times_s=(0.07, 0.07, 0.08)),
         StepPoint.prefill(512, 0.1, samples=1, times_s=(0.1,))]
    merged = merge_prefill_points(a, b)
    assert [p.prefill_tokens for p in merged] == [256, 512]
    assert merged[0].time_s == pytest.approx(0.07) and merged[0].samples == 6 and merged[0].passes == 2
    assert merged[0].pass_medians_s == pytest.approx((0.05, 0.07))
    assert merged[1].time_s == pytest.approx(0.1) and merged[1].passes == 1
    with pytest.raises(ValueError, match="prefill_passes"):
        ProbePlan(prefill_passes=3).check()


# ------------------------------------------------------------------ KV hand-off
def test_fit_handoff_recovers_latency_and_per_token_time():
    pts = [{"tokens": n, "ttft_s": TRUE.prefill_time_s([n]) + TRUE.decode_time_s([n]) + 0.012 + 2e-6 * n}
           for n in (32, 256, 1024)]
    link = fit_handoff(pts, TRUE)
    assert isinstance(link, LinkFit)
    assert math.isclose(link.latency_s, 0.012, rel_tol=1e-6)
    assert math.isclose(link.s_per_token, 2e-6, rel_tol=1e-6)
    assert link.mae_s < 1e-9 and link.points == 3
    # a proxy path faster than the model (residuals clipped to 0) gives a finite error, not a ratio over 0
    fast = fit_handoff([{**p, "ttft_s": p["ttft_s"] - 0.5} for p in pts], TRUE)
    assert fast.latency_s == 0.0 and fast.mae_s < 1e-9
    with pytest.raises(ValueError, match=">= 2 hand-off points"):
        fit_handoff(pts[:1], TRUE)
    with pytest.raises(ValueError, match="distinct prompt lengths"):
        fit_handoff([pts[0], pts[0]], TRUE)


def test_fit_handoff_subtracts_the_proxys_prefill_leg_when_every_point_has_one():
    """The leg the proxy timed replaces the fitted prefill: a leg 5 ms longer than the fit stays out of the hand-off."""
    pts = [{"tokens": n, "prefill_leg_s": TRUE.prefill_time_s([n]) + 0.005,
            "ttft_s": TRUE.prefill_time_s([n]) + 0.005 + TRUE.decode_time_s([n]) + 0.012 + 2e-6 * n}
           for n in (32, 256, 1024)]
    link = fit_handoff(pts, TRUE)
    assert math.isclose(link.latency_s, 0.012, rel_tol=1e-6) and math.isclose(link.s_per_token, 2e-6, rel_tol=1e-6)
    # one point without a leg: all points use the fitted prefill, and the 5 ms land in the hand-off
    mixed = fit_handoff([pts[0], pts[1], {k: v for k, v in pts[2].items() if k != "prefill_leg_s"}], TRUE)
    assert math.isclose(mixed.latency_s, 0.017, rel_tol=1e-6)


# ------------------------------------------------------------------ profile files
def _measured_calibration() -> Calibration:
    lat = fit_profile(_points(), meta={"source": "test"})
    pts = _points()
    return Calibration(
        lat, [p for p in pts if p["prefill_tokens"] > 0], [p for p in pts if p["decode_batch"] > 0],
        [{"tokens": 32, "ttft_s": 0.05, "samples": 3}, {"tokens": 512, "ttft_s": 0.2, "samples": 3}],
        kv_link=LinkFit(latency_s=0.01, s_per_token=2e-6, mae_s=1e-4, points=2),
        contention=Contention(prompt_tokens=1024, decode_streams=16, prefill_alone_s=0.2, prefill_busy_s=0.25,
                              decode_alone_s=0.01, decode_busy_s=0.011, prefill=0.25, decode=0.1),
        admission=Admission(streams=8, stream_prompt=256, side_prompt=16, side_requests=12, period_s=0.4,
                            itl_alone_s=0.01, itl_busy_s=0.009, gaps_busy=300, raw_overhead_s=-0.04,
                            overhead_s=0.0),
        seconds=12.5)


def test_saved_calibration_round_trips_its_values(tmp_path):
    cal = _measured_calibration()
    path = save_calibration(cal, tmp_path / "p.json")
    data = json.loads(path.read_text())
    # the on-disk keys are the profile's, as before the typed records
    assert data["format"] == "pdlab-latency-profile/1" and data["prefill"] == list(cal.latency.prefill)
    assert data["kv_link"] == {"latency_s": 0.01, "s_per_token": 2e-6, "mae_s": 1e-4, "points": 2}
    assert data["cpu_contention"]["prefill"] == 0.25 and data["cpu_contention"]["decode_busy_s"] == 0.011
    assert data["admission"]["raw_overhead_s"] == -0.04 and data["calibration_s"] == 12.5
    assert data["source"] == "test" and len(data["points"]) == len(_points()) and len(data["handoff_points"]) == 2
    back = load_calibration(path)
    assert (back.kv_link, back.contention, back.admission) == (cal.kv_link, cal.contention, cal.admission)
    assert back.seconds == 12.5 and back.handoff_points == cal.handoff_points
    assert back.prefill_points == cal.prefill_points and back.decode_points == cal.decode_points
    assert back.latency.prefill == cal.latency.prefill and back.latency.decode == cal.latency.decode
    assert back.latency.meta["fit"] == cal.latency.meta["fit"]
    assert Calibration.from_dict(cal.to_dict()).contention == cal.contention
    plain = load_profile(path)   # the simulator's reader sees the same model, the records in its meta
    assert plain.prefill == cal.latency.prefill and plain.meta["kv_link"]["latency_s"] == 0.01
    with pytest.raises(TypeError, match="needs a Calibration"):
        save_calibration(cal.latency, tmp_path / "q.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"prefill": [1, 2], "decode": [1, 2, 3]}')
    with pytest.raises(ValueError, match="three numbers"):
        load_calibration(bad)


def test_step_points_keep_the_profile_keys_of_the_probes_dicts():
    """A StepPoint writes the keys the probes' dicts had (profiles written before it still load)."""
    pre = StepPoint.prefill(257, 0.03, samples=3, times_s=(0.02, 0.03, 0.04))
    assert list(pre.to_dict()) == ["prefill_tokens", "prefill_sq_tokens", "decode_batch", "decode_ctx_tokens", "time_s",
                                   "samples", "kind", "times_s"]
    assert pre.prefill_sq_tokens == 257.0 ** 2 and pre.kind == "prefill"
    dec = StepPoint.decode(8, 8 * 300.0, 0.012, samples=70, prompt_tokens=256)
    assert set(dec.to_dict()) == {"prefill_tokens", "prefill_sq_tokens", "decode_batch", "decode_ctx_tokens", "time_s",
                                  "samples", "kind", "prompt_tokens"}
    from pdlab.simreal.calibrate import merge_prefill_points

    (merged,) = merge_prefill_points([pre], [pre])
    assert list(merged.to_dict())[-2:] == ["passes", "pass_medians_s"] and merged.to_dict()["passes"] == 2
    for p in (pre, dec, merged):
        assert StepPoint.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    old = {"prefill_tokens": 17, "prefill_sq_tokens": 289.0, "decode_batch": 0, "decode_ctx_tokens": 0,
           "time_s": 0.01, "samples": 3, "kind": "prefill", "times_s": [0.01, 0.01, 0.02]}
    assert StepPoint.from_dict(old).to_dict() == old
    bare = StepPoint.from_dict({"decode_batch": 4, "decode_ctx_tokens": 400, "time_s": 0.005})
    assert (bare.kind, bare.samples, bare.prefill_tokens) == ("decode", 1, 0)
    with pytest.raises(KeyError, match="time_s"):
        StepPoint.from_dict({"decode_batch": 4})
    with pytest.raises(ValueError, match="mixes prefill and decode"):
        fit_row([StepPoint(prefill_tokens=4, prefill_sq_tokens=16.0, decode_batch=1, time_s=0.1)], "prefill")


def test_records_read_hand_written_and_older_profile_entries():
    """Profiles written before the typed records, or by hand, keep their keys; a partial entry reads."""
    link = LinkFit.from_dict({"latency_s": 1e-3})
    assert (link.latency_s, link.s_per_token, link.points) == (1e-3, 0.0, 0) and math.isnan(link.mae_s)
    c = Contention.from_dict({"prefill": 0.5})
    assert (c.prefill, c.decode) == (0.5, 0.0) and math.isnan(c.prefill_alone_s)
    a = Admission.from_dict({"overhead_s": 0.06})
    assert a.overhead_s == 0.06 and a.raw_overhead_s == 0.06 and a.streams == 0
    lat = fit_profile(_points(), meta={"kv_link": {"latency_s": 0.01, "s_per_token": 0.0}})
    cal = Calibration.from_latency(lat)
    assert cal.kv_link.latency_s == 0.01 and cal.contention is None and cal.admission is None
    assert cal.prefill_points == () and cal.latency.meta["kv_link"]["latency_s"] == 0.01


def test_pdlab_simulate_accepts_the_profile(tmp_path, capsys):
    from pdlab.cli import main

    path = save_calibration(Calibration(fit_profile(_points())), tmp_path / "p.json")
    rc = main(["simulate", "--synthetic", "--requests", "50", "--rate", "5", "--mode", "chunked",
               "--gpu", "h100-sxm", "--model", "llama-3-8b", "--profile", str(path), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] == 50


def test_cli_calibrate_rejects_bad_plan(capsys):
    from pdlab.cli import main

    rc = main(["sim", "calibrate", "--url", "http://127.0.0.1:9", "--out", "x.json", "--prefill-lengths", "16,16"])
    assert rc == 2
    assert "prefill_lengths needs >= 3 distinct lengths" in capsys.readouterr().err


# ------------------------------------------------------------------ simulator set-ups
def test_colocated_sim_single_request_matches_the_model():
    reqs = make_requests([0.0], 300, 10)
    (rec,) = simulate_like_live(reqs, "colocated", TRUE)
    assert math.isclose(rec.ttft_s, TRUE.prefill_time_s([300]), rel_tol=1e-9)
    steps = [TRUE.decode_time_s([300 + k]) for k in range(9)]  # the simulator reads the context before the step
    assert math.isclose(rec.finish_s - rec.first_token_s, sum(steps), rel_tol=1e-9)


def test_disaggregated_sim_follows_the_proxy_protocol():
    reqs = make_requests([0.0], 300, 10)
    link = {"latency_s": 0.02, "s_per_token": 1e-5}
    (rec,) = simulate_like_live(reqs, "disaggregated", TRUE, kv_link=link)
    handoff = 0.02 + 300 * 1e-5
    # prefill (its token is discarded), hand-off, then decode's first step gives the first token
    expected_ttft = TRUE.prefill_time_s([300]) + handoff + TRUE.decode_time_s([300])
    assert math.isclose(rec.ttft_s, expected_ttft, rel_tol=1e-9)
    assert rec.output_tokens == 10 and len(rec.token_times_s) == 10
    with pytest.raises(ValueError, match="mode must be"):
        build_sim("chunked", TRUE)


def test_disaggregated_sim_applies_measured_contention_and_vllm_handoff():
    """The second prompt's prefill starts while the first request decodes: it takes 1 + c_p times
    as long with the measured contention; a request alone is not slowed; the physics is vLLM's."""
    reqs = make_requests([0.0, 0.05], 300, 40)
    base = {r.request_id: r for r in simulate_like_live(reqs, "disaggregated", TRUE, cpu_contention={})}
    slowed = {r.request_id: r for r in simulate_like_live(reqs, "disaggregated", TRUE,
                                                          cpu_contention={"prefill": 0.5, "decode": 0.0})}
    assert math.isclose(slowed[0].ttft_s, base[0].ttft_s, rel_tol=1e-9)   # alone: no peer busy
    prefill = TRUE.prefill_time_s([300])
    done = {k: r.extra["kv_transfer_start_s"] - r.arrival_s for k, r in (("base", base[1]), ("slowed", slowed[1]))}
    assert math.isclose(done["base"], prefill, rel_tol=1e-9)
    assert math.isclose(done["slowed"], 1.5 * prefill, rel_tol=1e-9)
    assert slowed[1].ttft_s > base[1].ttft_s
    # the contention probe's result rides in the profile's meta and is the default
    lat = FittedLatency(TRUE.prefill, TRUE.decode, meta={"cpu_contention": {"prefill": 0.5, "decode": 0.0}})
    from_meta = {r.request_id: r for r in simulate_like_live(reqs, "disaggregated", lat)}
    assert math.isclose(from_meta[1].ttft_s, slowed[1].ttft_s, rel_tol=1e-9)
    sim = build_sim("disaggregated", lat)
    pre, dec = sim.specs
    assert (pre.cpu_contention, dec.cpu_contention) == (0.5, 0.0) and pre.cpu_group == dec.cpu_group == "host"
    assert dec.handoff_reservation == "vllm" and sim.link.sharing == "fair"
    # the admission probe's F is at the CPU's noise level: kept in meta, used only when passed
    lat.meta["admission"] = {"overhead_s": 0.06}
    assert build_sim("disaggregated", lat).specs[1].admit_overhead_s == 0.0
    assert build_sim("disaggregated", lat, admit_overhead_s=0.01).specs[1].admit_overhead_s == 0.01


def test_requests_from_records_uses_send_times_and_server_tokens():
    recs = [RequestRecord(0, 100.5, 64, 8, 100.6, 101.0, extra={"target_output_tokens": 8}, server_prompt_tokens=65),
            RequestRecord(1, 100.0, 32, 4, 100.1, 100.4)]
    reqs = requests_from_records(recs)
    assert [r.arrival_s for r in reqs] == [0.0, 0.5]
    assert reqs[1].prompt_tokens == 65 and reqs[1].output_tokens == 8 and reqs[0].prompt_tokens == 32
    with pytest.raises(ValueError, match="no records"):
        requests_from_records([])


# ------------------------------------------------------------------ the error table
def _rec(i: int, ttft: float, tpot: float, n_out: int = 11) -> RequestRecord:
    return RequestRecord(i, 0.0, 100, n_out, ttft, ttft + tpot * (n_out - 1))


def test_compare_runs_relative_errors_and_attainment_difference():
    live = [_rec(i, t, 0.010) for i, t in enumerate([0.1, 0.2, 0.3, 0.4, 0.5])]
    sim = [_rec(i, t * 1.1, 0.009) for i, t in enumerate([0.1, 0.2, 0.3, 0.4, 0.5])]
    slo = SLO(ttft_s=0.35, tpot_s=0.0095)
    row = compare_runs(live, sim, slo, setup="colocated", rate_rps=2.0)
    assert row["setup"] == "colocated" and row["rate_rps"] == 2.0 and row["requests"] == 5
    assert math.isclose(row["ttft_p50_live_s"], 0.3) and math.isclose(row["ttft_p50_sim_s"], 0.33)
    assert math.isclose(row["ttft_p50_err"], 0.1, rel_tol=1e-9)
    assert math.isclose(row["tpot_p50_err"], -0.1, rel_tol=1e-9)
    assert math.isclose(row["tpot_p99_err"], -0.1, rel_tol=1e-9)
    # live: TPOT 10 ms misses 9.5 ms for everyone → 0 %; sim: TTFT ≤ 0.35 for 0.11, 0.22, 0.33 → 60 %
    assert row["attainment_live"] == 0.0 and math.isclose(row["attainment_sim"], 0.6)
    assert math.isclose(row["attainment_diff_pp"], 60.0)


def test_compare_runs_counts_failures_and_handles_empty_metrics():
    live = [_rec(0, 0.1, 0.01), RequestRecord(1, 0.0, 10, 0, ok=False, error="boom")]
    sim = [_rec(0, 0.1, 0.01), _rec(1, 0.1, 0.01)]
    row = compare_runs(live, sim, SLO(ttft_s=1.0))
    assert row["attainment_live"] == 0.5 and row["attainment_sim"] == 1.0 and row["attainment_diff_pp"] == 50.0
    one_token = [_rec(0, 0.1, 0.01, n_out=1)]
    row = compare_runs(one_token, one_token, SLO(ttft_s=1.0))
    assert math.isnan(row["tpot_p50_err"]) and row["ttft_p50_err"] == 0.0
    with pytest.raises(ValueError, match="both runs need records"):
        compare_runs([], sim, SLO(ttft_s=1.0))


def test_error_table_orders_columns():
    live = [_rec(i, 0.1 * (i + 1), 0.01) for i in range(4)]
    rows = [compare_runs(live, live, SLO(ttft_s=1.0), setup=s, rate_rps=r)
            for s in ("colocated", "disaggregated") for r in (1.0, 2.0)]
    df = error_table(rows)
    assert list(df.columns) == list(ERROR_COLUMNS) and len(df) == 4
    assert (df["ttft_p50_err"] == 0).all()
    with pytest.raises(ValueError, match="no comparison rows"):
        error_table([])


# ------------------------------------------------------------------ lab 05 checks
def test_lab05_checks_pass_fail_and_not_attempted(monkeypatch):
    from pdlab.exercises import FAILED, NOT_ATTEMPTED, PASSED
    from pdlab.exercises.lab05 import check_attainment_diff, check_max_decode_batch, max_decode_batch

    monkeypatch.delenv("PDLAB_STRICT_CHECKS", raising=False)
    a, b, c = TRUE.decode
    budget = a + 20 * (b * 400 + c) + 1e-6  # a batch of 20 just fits
    assert max_decode_batch(TRUE, 400, budget) == 20
    assert max_decode_batch(TRUE, 400, a) == 0  # not even one request fits
    assert check_max_decode_batch(20, TRUE, 400, budget).status == PASSED
    assert check_max_decode_batch(21, TRUE, 400, budget).status == FAILED
    assert check_max_decode_batch(None, TRUE, 400, budget).status == NOT_ATTEMPTED
    flat = dataclasses.replace(TRUE, decode=(a, 0.0, 0.0))
    with pytest.raises(ValueError, match="does not grow with the batch"):
        max_decode_batch(flat, 400, budget)
    live = [_rec(i, 0.1 * (i + 1), 0.01) for i in range(4)]
    sim = [_rec(i, 0.05, 0.01) for i in range(4)]
    slo = SLO(ttft_s=0.25)
    assert check_attainment_diff(50.0, live, sim, slo).status == PASSED
    assert check_attainment_diff(0.5, live, sim, slo).status == FAILED
    assert check_attainment_diff("x", live, sim, slo).status == FAILED
    assert check_attainment_diff(None, live, sim, slo).status == NOT_ATTEMPTED
    monkeypatch.setenv("PDLAB_STRICT_CHECKS", "1")
    with pytest.raises(AssertionError):
        check_attainment_diff(0.5, live, sim, slo)


def test_ttft_phases_live_and_simulated_add_up_and_load_is_work_over_span():
    parts = {"proxy": 0.001, "prefill front end": 0.01, "prefill queue": 0.02, "prefill compute": 0.1,
             "decode front end": 0.03, "decode queue": 0.005, "KV transfer": 0.004, "decode first step": 0.02}
    live = live_ttft_phases(parts)
    assert list(live) == list(TTFT_PHASES)
    assert math.isclose(live["prefill side"], 0.131) and math.isclose(live["hand-off to first token"], 0.059)
    assert math.isclose(sum(live.values()), sum(parts.values()))
    with pytest.raises(KeyError):
        live_ttft_phases({"proxy": 0.0})
    reqs = make_requests([0.0, 0.05], 300, 12)
    link = {"latency_s": 0.02, "s_per_token": 1e-5}
    recs = simulate_like_live(reqs, "disaggregated", TRUE, kv_link=link, cpu_contention={})
    sim = sim_ttft_phases(recs)
    assert math.isclose(sum(sim.values()), float(np.mean([r.ttft_s for r in recs])), rel_tol=1e-9)
    assert math.isclose(sim["prefill side"], float(np.mean([TRUE.prefill_time_s([300])] * 2)), rel_tol=1e-9)
    assert sim["hand-off to first token"] > 0.02 + 300 * 1e-5   # the link, then decode's first step
    with pytest.raises(ValueError, match="hand-off"):
        sim_ttft_phases(simulate_like_live(reqs, "colocated", TRUE))
    # two requests 0.05 s apart: rate 1/0.05 = 20 req/s, each prefill TRUE.prefill_time_s([300])
    assert math.isclose(offered_prefill_load(reqs, TRUE), 20 * TRUE.prefill_time_s([300]), rel_tol=1e-9)
    with pytest.raises(ValueError, match="at once"):
        offered_prefill_load(make_requests([0.0, 0.0], 10, 2), TRUE)


def test_decode_steps_vs_model_is_one_where_the_steps_follow_the_fit():
    """Two streams whose token gaps are exactly the fitted step of the batch at that moment give a
    ratio of 1; gaps while a third request waits for its first token are not quiet."""
    lat = FittedLatency((0.01, 0.0, 0.0), (0.005, 1e-5, 0.001))
    t, times = 0.0, []
    for k in range(6):                        # both streams decode together: contexts 100 + k, 200 + k
        times.append(t)
        t += lat.decode_time_s([100 + k, 200 + k])
    a = RequestRecord(0, -0.1, 100, 7, times[0], times[-1], token_times_s=list(times))
    b = RequestRecord(1, -0.1, 200, 7, times[0], times[-1], token_times_s=list(times))
    rows = decode_steps_vs_model([a, b], lat)
    assert [r["batch"] for r in rows] == ["1-3"] and rows[0]["gaps"] == 10 and rows[0]["quiet gaps"] == 10
    assert rows[0]["live / fitted, quiet"] == pytest.approx(1.0)
    waiting = RequestRecord(2, times[2] - 0.001, 50, 2, times[4] + 1.0, times[4] + 1.1, token_times_s=[times[4] + 1.0,
                                                                                                      times[4] + 1.1])
    rows = decode_steps_vs_model([a, b, waiting], lat)
    assert rows[0]["quiet gaps"] < rows[0]["gaps"] - 1
    with pytest.raises(ValueError, match="two or more token times"):
        decode_steps_vs_model([RequestRecord(0, 0.0, 10, 1, 0.1, 0.1, token_times_s=[0.1])], lat)


def _varied_run(lat, seed=0, n=120, rate=6.0):
    """A colocated replay whose steps follow ``lat`` exactly: Poisson arrivals, prompts 32–1024,
    outputs 16–64 (batches and contexts that vary independently)."""
    from pdlab.workloads import Request

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    return simulate_like_live(reqs, "colocated", lat)


def test_run_decode_points_and_refit_recover_the_decode_row_from_the_run_itself():
    """Observe then predict: the quiet steps of a run that follows TRUE give back TRUE's decode row
    (a probe-fitted latency whose decode row is 2× off is corrected; prefill and meta are kept)."""
    from pdlab.simreal.calibrate import refit_decode_on_run, run_decode_points

    recs = _varied_run(TRUE)
    pts = run_decode_points(recs)
    assert len(pts) >= 5 and all(p.time_s > 0 and p.samples >= 5 and p.kind == "decode" for p in pts)
    assert len({p.decode_batch for p in pts}) >= 3
    for p in pts:   # each point is TRUE's step at its batch and mean context, within the bucket's spread
        assert p.time_s == pytest.approx(TRUE.step_time_s(0, 0.0, p.decode_batch, p.decode_ctx_tokens), rel=0.05)
    off = FittedLatency(TRUE.prefill, tuple(2 * c for c in TRUE.decode), meta={"kv_link": {"latency_s": 1e-3},
                                                                               "fit": {"decode": {"mape": 0.01}}})
    fixed = refit_decode_on_run(off, recs)
    assert fixed.prefill == TRUE.prefill and fixed.meta["kv_link"] == {"latency_s": 1e-3}
    assert fixed.meta["fit"]["decode_probe"] == {"mape": 0.01} and fixed.meta["fit"]["decode"]["mape"] < 0.05
    for b, ctx in ((1, 300), (4, 2000), (8, 4000)):
        assert fixed.decode_time_s([ctx // b] * b) == pytest.approx(TRUE.decode_time_s([ctx // b] * b), rel=0.05)
        assert off.decode_time_s([ctx // b] * b) == pytest.approx(2 * TRUE.decode_time_s([ctx // b] * b), rel=1e-9)


def test_quiet_step_ratio_is_one_for_the_true_model_and_halves_for_a_model_twice_as_slow():
    """The gap-weighted quiet-step ratio of a run that follows TRUE: 1 against TRUE, ½ against a
    decode row twice TRUE's."""
    from pdlab.simreal.calibrate import quiet_step_ratio

    recs = _varied_run(TRUE)
    assert quiet_step_ratio(recs, TRUE) == pytest.approx(1.0, rel=0.02)
    slow = FittedLatency(TRUE.prefill, tuple(2 * c for c in TRUE.decode))
    assert quiet_step_ratio(recs, slow) == pytest.approx(0.5, rel=0.02)


def test_quiet_ttft_ratio_is_one_for_the_true_model_and_above_one_for_a_fast_prefill_row():
    """A run that follows TRUE: its unqueued requests' TTFT is TRUE's replay of them (ratio 1);
    against a prefill row half TRUE's, the live TTFT is longer than the replay's; an empty run is NaN."""
    from pdlab.simreal.calibrate import quiet_ttft_ratio

    recs = _varied_run(TRUE)
    assert quiet_ttft_ratio(TRUE, recs, "colocated") == pytest.approx(1.0, abs=1e-9)
    fast = FittedLatency(tuple(0.5 * c for c in TRUE.prefill), TRUE.decode)
    assert 1.3 < quiet_ttft_ratio(fast, recs, "colocated") < 2.01
    assert np.isnan(quiet_ttft_ratio(TRUE, [], "colocated"))


def test_refit_prefill_on_run_brings_a_slow_probe_fit_to_the_runs_level():
    """A run that follows TRUE, replayed with a prefill row 1.5× TRUE's: the prefill-quiet requests
    set a scale near 1/1.5, which brings the row back to TRUE's; decode and meta are kept."""
    from pdlab.simreal.calibrate import prefill_quiet_requests, refit_prefill_on_run

    recs = _varied_run(TRUE, rate=2.0)
    quiet = prefill_quiet_requests(recs)
    assert 3 <= len(quiet) < len(recs)
    for r in quiet:
        assert not any(o is not r and o.arrival_s < r.first_token_s and o.first_token_s > r.arrival_s for o in recs)
    slow = FittedLatency(tuple(1.5 * c for c in TRUE.prefill), TRUE.decode, meta={"fit": {"prefill": {"mape": 0.02}}})
    fixed = refit_prefill_on_run(slow, recs, "colocated")
    assert fixed.decode == TRUE.decode and fixed.meta["fit"]["prefill_probe"] == {"mape": 0.02}
    assert fixed.meta["fit"]["prefill"]["scale"] == pytest.approx(1 / 1.5, rel=0.05)
    assert fixed.meta["fit"]["prefill"]["requests"] == len(quiet)
    for tokens in (64, 512, 1024):
        assert fixed.prefill_time_s([tokens]) == pytest.approx(TRUE.prefill_time_s([tokens]), rel=0.05)
    with pytest.raises(ValueError, match="met no prefill queue"):
        refit_prefill_on_run(slow, recs[:2], "colocated", min_requests=3)


def test_run_decode_points_ignore_zero_gaps_and_noisy_steps():
    """Burst reads (0 s gaps) do not make a point; a run without steps that vary cannot be refitted."""
    from pdlab.simreal.calibrate import refit_decode_on_run, run_decode_points

    t = [0.1 + 0.01 * k for k in range(10)]
    burst = RequestRecord(0, 0.0, 100, 10, 0.5, 0.5, token_times_s=[0.5] * 10)
    steady = RequestRecord(1, 0.0, 100, 10, t[0], t[-1], token_times_s=t)
    assert run_decode_points([burst]) == []
    (pt,) = run_decode_points([steady])
    assert pt.decode_batch == 1 and pt.time_s == pytest.approx(0.01) and pt.samples == 9
    with pytest.raises(ValueError, match="need >= 3 decode points"):
        refit_decode_on_run(TRUE, [steady])


def test_joint_decode_fit_takes_the_level_from_a_slow_run_and_the_slopes_from_the_probe():
    """A run at low load (batches 1–3) whose steps cost TRUE's plus 2 ms, with a probe that saw
    TRUE over batches 1–16: the joint fit gives the run's level (a + 2 ms) and TRUE's slopes, so it
    predicts batches the run never reached; the run's points alone cannot pin the slopes that well."""
    from pdlab.simreal.calibrate import fit_decode_joint, refit_decode_on_run, run_decode_points

    busy = FittedLatency(TRUE.prefill, (TRUE.decode[0] + 0.002, *TRUE.decode[1:]))
    recs = _varied_run(busy, rate=1.0, n=60)
    assert max(p.decode_batch for p in run_decode_points(recs)) <= 4
    probe = [StepPoint.from_dict(p) for p in sample_points(TRUE, prefill_lengths=(), decode_batches=(1, 2, 4, 8, 16))]
    (a, b, c), q = fit_decode_joint(run_decode_points(recs), probe)
    assert a == pytest.approx(TRUE.decode[0] + 0.002, rel=0.05)
    assert b == pytest.approx(TRUE.decode[1], rel=0.1) and c == pytest.approx(TRUE.decode[2], rel=0.1)
    assert q["probe_level_s"] == pytest.approx(TRUE.decode[0], rel=0.05) and q["probe_points"] == len(probe)
    joint = refit_decode_on_run(TRUE, recs, probe_points=probe)
    assert joint.decode == pytest.approx((a, b, c)) and "probe's points" in joint.meta["fit"]["decode"]["source"]
    for batch in (8, 16):
        assert joint.decode_time_s([300] * batch) == pytest.approx(busy.decode_time_s([300] * batch), rel=0.02)
    with pytest.raises(ValueError, match=">= 2 run decode points"):
        fit_decode_joint(run_decode_points(recs)[:1], probe)
    with pytest.raises(ValueError, match="cannot separate"):
        fit_decode_joint([p for p in run_decode_points(recs) if p.decode_batch == 1],
                         [p for p in probe if p.decode_batch == 1])   # one batch size: B is the intercepts' sum


def test_step_ratio_windows_follow_the_run_over_time():
    """A run that follows TRUE is at 1 in every window; against a decode row twice TRUE's, at ½; a
    run whose steps double halfway shows the doubling in its later windows."""
    from pdlab.simreal.calibrate import step_ratio_windows

    recs = _varied_run(TRUE, rate=4.0, n=80)
    rows = step_ratio_windows(recs, TRUE, window_s=4.0)
    assert len(rows) >= 3 and all(r["gaps"] >= 20 for r in rows)
    assert [r["start_s"] for r in rows] == sorted(r["start_s"] for r in rows)
    assert all(r["ratio"] == pytest.approx(1.0, rel=0.03) for r in rows)
    slow = FittedLatency(TRUE.prefill, tuple(2 * c for c in TRUE.decode))
    assert all(r["ratio"] == pytest.approx(0.5, rel=0.03) for r in step_ratio_windows(recs, slow, window_s=4.0))
    t = [0.01 * k for k in range(400)]
    doubling = [0.0] + [x if x < 2.0 else 2.0 + 2 * (x - 2.0) for x in t[1:]]   # steps of 10 ms, then 20 ms
    rec = RequestRecord(0, -0.001, 100, len(doubling), doubling[0], doubling[-1], token_times_s=doubling)
    one = FittedLatency(TRUE.prefill, (0.01, 0.0, 0.0))
    rows = step_ratio_windows([rec], one, window_s=1.0)
    assert rows[0]["ratio"] == pytest.approx(1.0) and rows[-1]["ratio"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two or more token times"):
        step_ratio_windows([RequestRecord(0, 0.0, 10, 1, 0.1, 0.1, token_times_s=[0.1])], TRUE)


def test_window_memory_tells_a_slow_drift_from_jitter():
    """A speed that drifts slowly is told by the window before (small error from the previous,
    large from the median, r near 1); one that alternates has no memory (the previous window is
    the worst guess); gaps in the windows are no pair; one window is an error."""
    from pdlab.simreal.calibrate import window_memory

    drift = [{"start_s": 5.0 * k, "ratio": 1.0 + 0.05 * k} for k in range(8)]
    m = window_memory(drift, 5.0)
    assert m["pairs"] == 7 and m["from previous"] < 0.05 < m["from median"] and m["lag-1 r"] > 0.99
    jitter = [{"start_s": 5.0 * k, "ratio": 1.2 if k % 2 else 0.8} for k in range(8)]
    j = window_memory(jitter, 5.0)
    assert j["from previous"] > j["from median"] and j["lag-1 r"] == pytest.approx(-1.0)
    holes = [{"start_s": 0.0, "ratio": 1.0}, {"start_s": 10.0, "ratio": 2.0}, {"start_s": 15.0, "ratio": 1.0}]
    assert window_memory(holes, 5.0)["pairs"] == 1 and math.isnan(window_memory(holes, 5.0)["lag-1 r"])
    with pytest.raises(ValueError, match="no two consecutive 5-s windows"):
        window_memory(drift[:1], 5.0)


def test_paired_error_is_zero_for_a_replay_of_itself_and_follows_each_request():
    """A live run that is its own model's replay: paired errors 0; a replay with a prefill twice as
    slow gives a positive paired TTFT error; pairs skip failed requests and match by send order."""
    from pdlab.simreal.calibrate import paired_error, replay_pairs

    recs = _varied_run(TRUE, rate=2.0, n=40)
    same = simulate_like_live(requests_from_records(recs), "colocated", TRUE)
    assert len(replay_pairs(recs, same)) == len(recs)
    assert paired_error(recs, same, "ttft") == pytest.approx(0.0, abs=1e-9)
    assert paired_error(recs, same, "tpot") == pytest.approx(0.0, abs=1e-9)
    slow = FittedLatency(tuple(2 * c for c in TRUE.prefill), TRUE.decode)
    assert paired_error(recs, simulate_like_live(requests_from_records(recs), "colocated", slow), "ttft") > 0.3
    named = [dataclasses.replace(r, request_id=f"r{i}") for i, r in enumerate(recs)]
    named[3] = dataclasses.replace(named[3], ok=False, error="boom")
    pairs = replay_pairs(named, same)
    assert len(pairs) == len(recs) - 1 and all(s.request_id == int(r.request_id[1:]) for r, s in pairs)
    with pytest.raises(ValueError, match="metric must be ttft or tpot"):
        paired_error(recs, same, "e2e")


def test_refit_front_end_on_run_recovers_a_delay_outside_the_engine():
    """A run whose requests each reach the engine 25 ms after they are sent (a busy front end):
    the prefill-quiet requests give the delay back, the prefill and decode rows stay the probe's,
    and the replay with the fit reproduces every request's TTFT and its token gaps; the scale
    refit instead stretches prefill compute."""
    from pdlab.simreal.calibrate import refit_front_end_on_run, refit_prefill_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / 2.0, 80))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    live = simulate_like_live(reqs, "colocated", TRUE, front_end_s=0.025)
    base = simulate_like_live(reqs, "colocated", TRUE)
    assert all(a.ttft_s > b.ttft_s for a, b in zip(live, base, strict=True))
    fitted = refit_front_end_on_run(TRUE, live, "colocated")
    assert fitted.meta["front_end_s"] == pytest.approx(0.025, abs=1e-6)
    assert fitted.prefill == TRUE.prefill and fitted.decode == TRUE.decode
    again = simulate_like_live(reqs, "colocated", fitted)            # read from meta
    assert [r.ttft_s for r in again] == pytest.approx([r.ttft_s for r in live], abs=1e-9)
    assert refit_prefill_on_run(TRUE, live, "colocated").meta["fit"]["prefill"]["scale"] > 1.05
    with pytest.raises(ValueError, match="front_end_s"):
        simulate_like_live(reqs, "colocated", TRUE, front_end_s=-0.01)
    with pytest.raises(ValueError, match="met no prefill queue"):
        refit_front_end_on_run(TRUE, live[:2], "colocated", min_requests=3)


def test_refit_decode_contention_on_run_measures_the_decode_roles_slowdown_while_prefill_works():
    """A pair whose decode steps take 1 + c as long while the prefill role works: the run's busy
    gaps over its quiet gaps give c back (the probe's value is kept in meta["fit"]); a run with
    too few gaps of either kind cannot be refitted."""
    from pdlab.simreal.calibrate import refit_decode_contention_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(1 / 8.0, 150))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    probe = FittedLatency(TRUE.prefill, TRUE.decode, meta={"cpu_contention": {"prefill": 0.2, "decode": 0.5}})
    for c in (0.0, 0.1, 0.3):
        recs = simulate_like_live(reqs, "disaggregated", TRUE, cpu_contention={"prefill": 0.0, "decode": c})
        fitted = refit_decode_contention_on_run(probe, recs)
        assert fitted.meta["cpu_contention"]["decode"] == pytest.approx(c, abs=1e-3)
        assert fitted.meta["cpu_contention"]["prefill"] == 0.2 and fitted.meta["fit"]["contention_probe"] == 0.5
        assert build_sim("disaggregated", fitted).specs[1].cpu_contention == pytest.approx(c, abs=1e-3)
    with pytest.raises(ValueError, match="quiet and busy gaps"):
        refit_decode_contention_on_run(probe, recs[:3])


def test_refit_handoff_on_run_recovers_the_hand_off_level_and_the_prefill_roles_contention():
    """A pair whose live hand-off takes 10 ms and whose prefill steps take 1.15× while the decode
    role streams, fitted from a probe that said 25 ms and 0.34: the run's prefill-quiet requests
    give both back (idle decode → the hand-off, busy → the contention), the probe's values stay in
    meta["fit"]; a part with too few requests keeps the probe's value."""
    from pdlab.simreal.calibrate import refit_handoff_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1 / 2.0, 120))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(8, 48))) for i, a in enumerate(arrivals)]
    meta = {"kv_link": {"latency_s": 0.010, "s_per_token": 2e-6}, "cpu_contention": {"prefill": 0.15, "decode": 0.05}}
    live = simulate_like_live(reqs, "disaggregated", FittedLatency(TRUE.prefill, TRUE.decode, meta=meta))
    probe = FittedLatency(TRUE.prefill, TRUE.decode, meta={"kv_link": {"latency_s": 0.025, "s_per_token": 2e-6},
                                                            "cpu_contention": {"prefill": 0.34, "decode": 0.05}})
    fitted = refit_handoff_on_run(probe, live)
    assert fitted.meta["kv_link"]["latency_s"] == pytest.approx(0.010, abs=1e-3)
    assert fitted.meta["kv_link"]["s_per_token"] == 2e-6
    assert fitted.meta["cpu_contention"] == pytest.approx({"prefill": 0.15, "decode": 0.05}, abs=0.02)
    info = fitted.meta["fit"]["handoff"]
    assert info["latency_probe_s"] == 0.025 and info["prefill_contention_probe"] == 0.34
    assert info["idle_requests"] >= 3 and info["busy_requests"] >= 3
    assert fitted.prefill == probe.prefill and fitted.decode == probe.decode
    assert info["prefill_contention_run"] == pytest.approx(0.15, abs=0.02)
    few = refit_handoff_on_run(probe, live, min_requests=10_000)     # neither part has enough requests
    assert few.meta["kv_link"]["latency_s"] == 0.025 and few.meta["cpu_contention"]["prefill"] == 0.34
    assert few.meta["fit"]["handoff"]["prefill_contention_run"] is None
    # a probe that saw less contention than the run caps the run's value (unless told not to)
    low = FittedLatency(TRUE.prefill, TRUE.decode, meta={**probe.meta, "cpu_contention": {"prefill": 0.08, "decode": 0.05}})
    capped = refit_handoff_on_run(low, live)
    assert capped.meta["cpu_contention"]["prefill"] == 0.08
    assert capped.meta["fit"]["handoff"]["prefill_contention_run"] == pytest.approx(0.15, abs=0.02)
    assert refit_handoff_on_run(low, live, cap_at_probe=False).meta["cpu_contention"]["prefill"] == pytest.approx(0.15, abs=0.02)
    # shrunk toward the probe by the requests that set each part: n0 = n lands halfway
    info = fitted.meta["fit"]["handoff"]
    idle, busy, run_shift = info["idle_requests"], info["busy_requests"], info["latency_shift_run_s"]
    assert run_shift == pytest.approx(-0.015, abs=1e-3)
    half = refit_handoff_on_run(probe, live, prior_requests=busy).meta
    assert half["cpu_contention"]["prefill"] == pytest.approx(0.5 * (info["prefill_contention_run"] + 0.34))
    assert half["fit"]["handoff"]["prior_requests"] == busy
    assert half["kv_link"]["latency_s"] == pytest.approx(0.025 + run_shift * idle / (idle + busy))
    far = refit_handoff_on_run(probe, live, prior_requests=1e9).meta   # a prior that outweighs any run
    assert far["kv_link"]["latency_s"] == pytest.approx(0.025) and far["cpu_contention"]["prefill"] == pytest.approx(0.34)
    # an infinite prior: exactly the probe's values, the run's still recorded
    probe_only = refit_handoff_on_run(probe, live, prior_requests=math.inf).meta
    assert probe_only["kv_link"]["latency_s"] == 0.025 and probe_only["cpu_contention"]["prefill"] == 0.34
    assert probe_only["fit"]["handoff"]["latency_shift_run_s"] == run_shift
    assert probe_only["fit"]["handoff"]["prefill_contention_run"] == info["prefill_contention_run"]
    for bad in (-1, math.nan):
        with pytest.raises(ValueError, match="prior_requests must be >= 0"):
            refit_handoff_on_run(probe, live, prior_requests=bad)


def test_prefill_core_load_stretches_the_pairs_prefill_by_the_co_runners_share_at_the_replayed_rate():
    """A pair whose prefill core also runs 0.1 of a core of front ends while requests are in flight
    plus 20 ms of CPU per request: at 5 req/s the co-runners take u = 0.2 of that core, so an
    unqueued prefill takes 1/(1 − 0.2) of its compute; at 10 req/s u = 0.3. The decode role and a
    colocated replay are untouched; u >= 1 and a colocated mode are errors that name the problem."""
    from pdlab.simreal.calibrate import arrival_rate_rps, with_prefill_core_load
    from pdlab.workloads import Request

    lat = FittedLatency(TRUE.prefill, TRUE.decode,
                        meta={"prefill_core_base_cores": 0.1, "prefill_core_cpu_s_per_request": 0.020})
    for rate, u in ((5.0, 0.2), (10.0, 0.3)):
        reqs = [Request(i, i / rate, 512, 8) for i in range(11)]
        assert arrival_rate_rps(reqs) == pytest.approx(rate)
        loaded = with_prefill_core_load(lat, reqs)
        assert loaded.prefill_time_s([512]) == pytest.approx(TRUE.prefill_time_s([512]) / (1 - u))
        assert loaded.decode == TRUE.decode and loaded.meta["prefill_core_share_taken"] == pytest.approx(u)
    assert with_prefill_core_load(FittedLatency(TRUE.prefill, TRUE.decode), [Request(0, 0.0, 8, 1),
                                                                         Request(1, 1.0, 8, 1)]).prefill == TRUE.prefill
    sparse = [Request(i, 1.0 * i, 512, 2) for i in range(5)]    # 1 req/s: u = 0.12, no queue at all
    plain = simulate_like_live(sparse, "disaggregated", FittedLatency(TRUE.prefill, TRUE.decode))
    with_load = simulate_like_live(sparse, "disaggregated", lat)
    for a, b in zip(plain, with_load, strict=True):
        assert b.ttft_s - a.ttft_s == pytest.approx(TRUE.prefill_time_s([512]) * (1 / 0.88 - 1), rel=1e-6)
        assert b.tpot_s == pytest.approx(a.tpot_s)
    with pytest.raises(ValueError, match="co-runners would need 1.30 cores"):
        with_prefill_core_load(lat, [Request(i, i / 60.0, 8, 1) for i in range(4)])
    with pytest.raises(ValueError, match="no prefill role"):
        simulate_like_live(sparse, "colocated", lat)


def test_arrival_rate_leaves_out_the_breaks_between_a_runs_blocks():
    """Two blocks of Poisson arrivals at 4 req/s, 60 s apart (lab 05 runs each rate in blocks):
    the rate is the blocks' own, not the span's; equal arrivals have none."""
    from pdlab.simreal.calibrate import arrival_rate_rps
    from pdlab.workloads import Request

    rng = np.random.default_rng(5)
    first = np.cumsum(rng.exponential(1 / 4.0, 200))
    times = np.concatenate([first, first[-1] + 60.0 + np.cumsum(rng.exponential(1 / 4.0, 200))])
    assert arrival_rate_rps([Request(i, float(t), 8, 1) for i, t in enumerate(times)]) == pytest.approx(4.0, rel=0.1)
    with pytest.raises(ValueError, match="at once"):
        arrival_rate_rps([Request(i, 1.0, 8, 1) for i in range(3)])


def test_split_co_runner_cpu_recovers_a_base_rate_and_a_cost_per_request():
    """Two blocks of Poisson arrivals; the co-runners burn 0.12 of a core while any request is in
    flight plus 27 ms per request spread over its life, sampled every 0.25 s (with 10 ms ticks, as
    /proc counts): the split gives both back; too few windows is an error."""
    from pdlab.simreal.calibrate import refit_prefill_core_load_on_run, split_co_runner_cpu

    rng = np.random.default_rng(11)
    recs, blocks = [], []
    for start, rate in ((100.0, 3.0), (200.0, 9.0)):
        sends = start + np.cumsum(rng.exponential(1 / rate, 60))
        lives = rng.uniform(0.3, 1.2, 60)
        recs += [dataclasses.replace(_rec(len(recs) + i, 0.05, 0.01), arrival_s=float(s),
                                     first_token_s=float(s) + 0.05, finish_s=float(s + d))
                 for i, (s, d) in enumerate(zip(sends, lives, strict=True))]
        ts = np.arange(start - 2.0, sends[-1] + 3.0, 0.25)
        grid = np.linspace(ts[0], ts[-1], 20_000)
        busy = np.zeros_like(grid)
        per_req = np.zeros_like(grid)
        for s, d in zip(sends, lives, strict=True):
            on = (grid >= s) & (grid < s + d)
            busy[on] = 1.0
            per_req[on] += 0.027 / d
        rate_cores = 0.12 * busy + per_req
        cum = np.concatenate([[0.0], np.cumsum(rate_cores[1:] * np.diff(grid))])
        blocks.append([(float(t), float(np.floor(np.interp(t, grid, cum) * 100) / 100)) for t in ts])
    split = split_co_runner_cpu(blocks, recs)
    assert split["base_cores"] == pytest.approx(0.12, abs=0.02)
    assert split["cpu_s_per_request"] == pytest.approx(0.027, abs=0.005)
    assert split["windows"] >= 20 and split["r2"] > 0.5
    with pytest.raises(ValueError, match="need >= 4 windows"):
        split_co_runner_cpu([blocks[0][:3]], recs)
    fitted = refit_prefill_core_load_on_run(FittedLatency(TRUE.prefill, TRUE.decode), blocks, recs)
    assert fitted.meta["prefill_core_base_cores"] == split["base_cores"]
    assert fitted.meta["prefill_core_cpu_s_per_request"] == split["cpu_s_per_request"]
    assert fitted.prefill == TRUE.prefill and fitted.meta["fit"]["prefill_core_load"]["windows"] == split["windows"]
    only = refit_prefill_core_load_on_run(FittedLatency(TRUE.prefill, TRUE.decode), blocks, recs, per_request_only=True)
    assert only.meta["prefill_core_base_cores"] == 0.0


def test_matched_prefill_contention_reproduces_the_runs_median_ttft():
    """A pair whose prefill steps take 1.6× while decode streams: from a fit that says 2.0 (too slow)
    or 0 (too fast), matching the run's own median TTFT gives the contention back (within 0.15:
    the median is flat over a range of it) and the replay's median TTFT the run's; a fit already
    too slow at 0 (a 2-s hand-off) gets 0, with both values recorded."""
    from pdlab.metrics import ttft_s
    from pdlab.simreal.calibrate import match_prefill_contention_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(1 / 4.0, 100))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(8, 48))) for i, a in enumerate(arrivals)]
    meta = {"kv_link": {"latency_s": 0.010, "s_per_token": 2e-6}, "cpu_contention": {"prefill": 0.6, "decode": 0.05}}
    live = simulate_like_live(reqs, "disaggregated", FittedLatency(TRUE.prefill, TRUE.decode, meta=meta))
    for start in (2.0, 0.0):
        fit = FittedLatency(TRUE.prefill, TRUE.decode, meta={**meta, "cpu_contention": {"prefill": start, "decode": 0.05}})
        matched = match_prefill_contention_on_run(fit, live)
        assert matched.meta["cpu_contention"] == pytest.approx({"prefill": 0.6, "decode": 0.05}, abs=0.15)
        replay = simulate_like_live(reqs, "disaggregated", matched)
        assert np.median(ttft_s(replay)) == pytest.approx(np.median(ttft_s(live)), rel=0.02)
        assert matched.meta["fit"]["prefill_contention_match"]["before"] == start
        assert matched.decode == TRUE.decode and matched.meta["kv_link"] == meta["kv_link"]
    slow = FittedLatency(TRUE.prefill, TRUE.decode, meta={**meta, "kv_link": {"latency_s": 2.0, "s_per_token": 0.0}})
    zero = match_prefill_contention_on_run(slow, live)
    assert zero.meta["cpu_contention"]["prefill"] == 0.0
    info = zero.meta["fit"]["prefill_contention_match"]
    assert (info["before"], info["after"]) == (0.6, 0.0)
    assert info["live_ttft_p50_s"] == pytest.approx(float(np.median(ttft_s(live))))


def test_scaled_decode_row_takes_one_factor_from_the_run_and_the_shape_from_the_probe():
    """A slow run (batches 1–4) whose every decode step costs 1.3× TRUE's: scaling a probe fit
    that saw TRUE gives 1.3 and TRUE's row × 1.3, so it predicts batches the run never reached;
    prefill and meta are kept, the probe's fit quality moves to ``decode_probe``; a run without
    quiet steps cannot be scaled."""
    from pdlab.simreal.calibrate import run_decode_points, scale_decode_on_run

    slow = FittedLatency(TRUE.prefill, tuple(1.3 * c for c in TRUE.decode))
    recs = _varied_run(slow, rate=1.0, n=60)
    assert max(p.decode_batch for p in run_decode_points(recs)) <= 4
    probe = FittedLatency(TRUE.prefill, TRUE.decode, meta={"kv_link": {"latency_s": 1e-3},
                                                           "fit": {"decode": {"mape": 0.01}}})
    scaled = scale_decode_on_run(probe, recs)
    info = scaled.meta["fit"]["decode"]
    assert info["scale"] == pytest.approx(1.3, rel=0.03) and info["mape"] < 0.05 and info["points"] >= 2
    assert scaled.meta["fit"]["decode_probe"] == {"mape": 0.01} and scaled.meta["kv_link"] == {"latency_s": 1e-3}
    assert scaled.prefill == TRUE.prefill
    for batch in (8, 16):
        assert scaled.decode_time_s([300] * batch) == pytest.approx(slow.decode_time_s([300] * batch), rel=0.03)
    with pytest.raises(ValueError, match="no quiet decode step group"):
        scale_decode_on_run(probe, [RequestRecord(0, 0.0, 100, 3, 0.5, 0.5, token_times_s=[0.5] * 3)])


def test_decode_gap_tail_finds_one_stall_shared_by_two_streams_and_merged_chunks():
    """Two streams stepping exactly at the fit, then one stall of 10 fitted steps that both see:
    the stall counts once in wall-clock time, its gaps carry all the excess, and a token the
    server counted but no chunk was timed for is a shared-chunk token whose step the time ratio counts."""
    from pdlab.simreal.calibrate import decode_gap_tail

    lat = FittedLatency((0.01, 0.0, 0.0), (0.005, 0.0, 0.0))   # every step 5 ms
    times = [0.005 * k for k in range(10)]
    times = times[:5] + [t + 0.045 for t in times[5:]]          # the 5th gap is 50 ms: 10 steps
    a = RequestRecord(0, -0.1, 100, 10, times[0], times[-1], token_times_s=list(times))
    b = RequestRecord(1, -0.1, 100, 11, times[0], times[-1], token_times_s=list(times))   # one merged token
    tail = decode_gap_tail([a, b], lat)
    assert tail["gaps"] == 18 and tail["median ratio"] == pytest.approx(1.0)
    assert tail["long share"] == pytest.approx(2 / 18) and tail["long excess share"] == pytest.approx(1.0)
    # b took 10 steps in 9 gaps: its fitted time counts 10 steps
    assert tail["time ratio"] == pytest.approx((18 * 0.005 + 2 * 0.045) / (9 * 0.005 + 10 * 0.005))
    assert tail["stall s per request"] == pytest.approx(0.045 / 2)
    assert tail["shared chunk tokens"] == pytest.approx(1 / 21)
    # nobody waited for a first token: every gap is quiet
    assert tail["quiet time ratio"] == pytest.approx(tail["time ratio"]) and tail["waiting share"] == 0.0
    assert np.isnan(tail["waiting time ratio"])
    # a third request waits for its first token over the stall and the gap after it: those four
    # gaps are waiting gaps (two streams; b's fitted steps count 10 ÷ 9 each), the others quiet
    c = RequestRecord(2, times[4] + 0.001, 100, 2, times[6] + 0.001, times[6] + 0.006,
                      token_times_s=[times[6] + 0.001, times[6] + 0.006])
    split = decode_gap_tail([a, b, c], lat)
    assert split["waiting share"] == pytest.approx(4 / 19)
    assert split["waiting time ratio"] == pytest.approx((2 * 0.05 + 2 * 0.005) / (2 * 0.005 + 2 * 0.005 * 10 / 9))
    assert split["quiet time ratio"] == pytest.approx(15 * 0.005 / (7 * 0.005 + 7 * 0.005 * 10 / 9 + 0.005))
    with pytest.raises(ValueError, match="two or more token times"):
        decode_gap_tail([RequestRecord(0, 0.0, 10, 1, 0.1, 0.1, token_times_s=[0.1])], lat)


def test_chunk_token_counts_make_a_merged_gap_several_steps():
    """A server that said how many tokens each chunk held (continuous usage stats): a gap closed
    by a chunk of 3 tokens spans 3 steps, not one long step. Against the same record without the
    counts, the per-step median, the long share, the time ratio and the context all follow the
    counts; a chunk that held no token (a chat role chunk) is no step."""
    from pdlab.simreal.calibrate import (
        _run_step_gaps,
        decode_gap_tail,
        decode_steps_vs_model,
        run_decode_points,
    )

    lat = FittedLatency((0.01, 0.0, 0.0), (0.005, 0.0, 0.0))   # every step 5 ms
    times = [0.0, 0.005, 0.010, 0.025, 0.030, 0.035]            # the 3rd gap is 15 ms: 3 steps merged
    blind = RequestRecord(0, -0.1, 100, 8, times[0], times[-1], token_times_s=list(times))
    told = RequestRecord(0, -0.1, 100, 8, times[0], times[-1], token_times_s=list(times),
                         chunk_tokens=[1, 1, 1, 3, 1, 1])
    role = RequestRecord(0, -0.1, 100, 8, 0.0, times[-1], token_times_s=[0.0, *times],
                         chunk_tokens=[0, 1, 1, 1, 3, 1, 1])
    gaps = _run_step_gaps([told])
    assert [g.steps for g in gaps] == [1, 1, 3, 1, 1] and [g.steps for g in _run_step_gaps([blind])] == [None] * 5
    assert [g.context for g in gaps] == [100, 101, 102, 105, 106]   # prompt + tokens before the midpoint − 1
    assert [dataclasses.replace(g, stream=0) for g in _run_step_gaps([role])] == gaps
    for rec, long_share, median in ((blind, 1 / 5, 1.0), (told, 0.0, 1.0)):
        tail = decode_gap_tail([rec], lat)
        assert tail["long share"] == pytest.approx(long_share) and tail["median ratio"] == pytest.approx(median)
        assert tail["time ratio"] == pytest.approx(0.035 / (7 * 0.005))     # 7 steps either way
        assert tail["shared chunk tokens"] == pytest.approx(2 / 8)
    # per step: 7 quiet steps of 5 ms with the counts; 5 gaps, one of 15 ms, without
    (row,) = decode_steps_vs_model([told], lat)
    assert row["quiet gaps"] == 7 and row["live / fitted, quiet"] == pytest.approx(1.0)
    assert decode_steps_vs_model([blind], lat)[0]["quiet gaps"] == 5
    (point,) = run_decode_points([told])
    assert point.samples == 7 and point.time_s == pytest.approx(0.005)


def test_every_public_function_of_calibrate_is_exported():
    """Lab 05 imports the run-fit helpers by name: each public top-level function and class of the
    module is in its ``__all__`` (scale_decode_on_run and match_prefill_contention_on_run were not)."""
    import inspect

    import pdlab.simreal.calibrate as cal

    public = {name for name, obj in vars(cal).items() if not name.startswith("_")
              and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == cal.__name__}
    assert public - set(cal.__all__) == set()
    assert {"scale_decode_on_run", "match_prefill_contention_on_run"} <= set(cal.__all__)


def test_fit_on_run_chains_the_run_refits_of_each_set_up():
    """Lab 05's run fit: colocated, the decode row scaled to the run and the front-end delay; a
    pair, also the decode role's contention, the prefill core's co-runners when their samples are
    given, the hand-off with the prefill contention uncapped, both the probe's (an infinite
    prior) unless told otherwise, and the decode row's level matched to the run's median TPOT;
    the prefill row stays the probe's."""
    from pdlab.simreal.calibrate import (
        fit_on_run,
        match_decode_to_tpot_on_run,
        refit_decode_contention_on_run,
        refit_front_end_on_run,
        refit_handoff_on_run,
        scale_decode_on_run,
    )
    from pdlab.workloads import Request

    rng = np.random.default_rng(4)
    arrivals = np.cumsum(rng.exponential(1 / 3.0, 100))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    meta = {"kv_link": {"latency_s": 0.010, "s_per_token": 2e-6}, "cpu_contention": {"prefill": 0.15, "decode": 0.05}}
    probe = FittedLatency(TRUE.prefill, [1.2 * c for c in TRUE.decode], meta={
        "kv_link": {"latency_s": 0.025, "s_per_token": 2e-6}, "cpu_contention": {"prefill": 0.05, "decode": 0.0}})
    for mode in ("colocated", "disaggregated"):
        live = simulate_like_live(reqs, mode, FittedLatency(TRUE.prefill, TRUE.decode, meta=meta), front_end_s=0.02)
        for prior, kw in ((math.inf, {}), (10.0, {"prior_requests": 10.0}), (0.0, {"prior_requests": 0.0})):
            fit = fit_on_run(probe, live, mode, **kw)
            step = scale_decode_on_run(probe, live)
            if mode == "disaggregated":
                step = refit_handoff_on_run(refit_decode_contention_on_run(step, live), live, cap_at_probe=False,
                                            prior_requests=prior)
                probe_c_p = probe.meta["cpu_contention"]["prefill"]
                if math.isinf(prior):   # the probe's values, the run's (uncapped, above the probe's) recorded
                    assert fit.meta["cpu_contention"]["prefill"] == probe_c_p
                    assert fit.meta["kv_link"]["latency_s"] == probe.meta["kv_link"]["latency_s"]
                    assert fit.meta["fit"]["handoff"]["prefill_contention_run"] > probe_c_p
                else:
                    assert fit.meta["cpu_contention"]["prefill"] > probe_c_p   # uncapped
                assert fit.meta["fit"]["handoff"]["prior_requests"] == prior
                step = match_decode_to_tpot_on_run(step, live, mode)
                assert "decode_tpot_match" in fit.meta["fit"]
            step = refit_front_end_on_run(step, live, mode)
            assert fit.prefill == probe.prefill and fit.decode == pytest.approx(step.decode)
            assert fit.meta["front_end_s"] == pytest.approx(step.meta["front_end_s"])
            assert fit.meta["cpu_contention"] == step.meta["cpu_contention"]
            assert fit.meta.get("kv_link") == step.meta.get("kv_link")


def test_ttft_sides_split_each_request_by_the_proxys_prefill_leg():
    """Live prefill leg against the replay's arrival → KV pull; the rest against KV pull → first token."""
    from pdlab.simreal.calibrate import streams_on_arrival, ttft_sides

    live = [RequestRecord(0, 0.0, 100, 4, 0.100, 0.400, extra={"prefill_leg_s": 0.070}),
            RequestRecord(1, 0.2, 100, 4, 0.330, 0.600, extra={"prefill_leg_s": 0.095}),
            RequestRecord(2, 0.3, 100, 4, 0.420, 0.700)]            # no prefill leg: left out
    sims = [RequestRecord(0, 0.0, 100, 4, 0.090, 0.400, extra={"kv_transfer_start_s": 0.060}),
            RequestRecord(1, 0.2, 100, 4, 0.300, 0.600, extra={"kv_transfer_start_s": 0.270}),
            RequestRecord(2, 0.3, 100, 4, 0.400, 0.700, extra={"kv_transfer_start_s": 0.360})]
    assert streams_on_arrival(live) == {0: 0, 1: 1, 2: 1}
    rows = ttft_sides(live, sims)
    assert [r["streams"] for r in rows] == [0, 1] and [r["request_id"] for r in rows] == [0, 1]
    assert rows[0]["prefill_side_s"] == pytest.approx(0.070 - 0.060)           # live leg − replayed arrival → pull
    assert rows[0]["handoff_side_s"] == pytest.approx((0.100 - 0.070) - (0.090 - 0.060))
    assert rows[1]["prefill_side_s"] == pytest.approx(0.095 - 0.070)
    assert rows[1]["handoff_side_s"] == pytest.approx((0.130 - 0.095) - (0.100 - 0.070))
    assert ttft_sides([dataclasses.replace(r, extra={}) for r in live], sims) == []


def test_load_saved_run_reads_what_lab_05_writes_for_offline_refits(tmp_path):
    """Calibration, KV capacity, each rate's records (ascending), completed requests and CPU samples."""
    from pdlab.metrics import write_records
    from pdlab.simreal.calibrate import load_saved_run

    lat = FittedLatency((0.01, 1e-5, 0.0), (0.004, 1e-7, 1e-4))
    save_calibration(Calibration.from_latency(lat), tmp_path / "disaggregated_profile.json")
    (tmp_path / "kv_capacity.json").write_text(json.dumps({"colocated": 1000, "disaggregated": 4096}))
    late, early = RequestRecord(1, 0.5, 10, 4, 0.6, 0.9), RequestRecord(0, 0.1, 10, 4, 0.2, 0.5)
    failed = dataclasses.replace(RequestRecord(2, 0.3, 10, 4, None, None), ok=False, error="500")
    write_records([late, failed, early], tmp_path / "disaggregated_8.8rps_records.jsonl")
    write_records([early], tmp_path / "disaggregated_2.9rps_records.jsonl")
    (tmp_path / "disaggregated_8.8rps_cpu_samples.json").write_text(json.dumps([[[0.0, 1.0]], [[1.0, 2.0]]]))

    run = load_saved_run(tmp_path, "disaggregated")
    assert list(run.records) == [2.9, 8.8] and run.kv_capacity_tokens == 4096
    assert run.calibration.latency.prefill == pytest.approx(lat.prefill)
    assert len(run.records[8.8]) == 3                                   # as written, the failure too
    assert [r.request_id for r in run.completed(8.8)] == [0, 1]        # completed, in arrival order
    assert run.cpu_samples(8.8) == [[[0.0, 1.0]], [[1.0, 2.0]]]
    with pytest.raises(ValueError, match="no colocated_<rate>rps_records.jsonl"):
        load_saved_run(tmp_path, "colocated")


def test_prefill_stall_fit_keeps_the_fixed_part_within_the_lone_ttfts_and_the_profile_keeps_it():
    """Stalls of κ + b_p·P + c_p·P² give κ back; κ is kept within [0, a_p − a_d] (the raw median
    recorded) and the rest of a_p − a_d is off-engine; an empty probe is a clear error; a profile
    entry without its times reads as NaN (no split)."""
    from pdlab.simreal.calibrate import fit_prefill_stall
    from pdlab.simreal.records import PrefillStall

    (ap, bp, cp), ad = TRUE.prefill, TRUE.decode[0]          # a_p − a_d = 1 ms
    rows = [{"prompt_tokens": p, "stall_s": 0.0004 + bp * p + cp * p * p + e}
            for p, e in ((17, 1e-4), (17, -1e-4), (129, 0.0), (129, 5e-5), (129, -5e-5))]
    stall = fit_prefill_stall(rows, TRUE, streams=4, stream_prompt=256)
    assert stall.fixed_s == pytest.approx(0.0004) and stall.off_engine_s == pytest.approx(ap - ad - 0.0004)
    assert (stall.injections, stall.median_prompt, stall.streams) == (5, 129, 4)
    high = fit_prefill_stall([{**r, "stall_s": r["stall_s"] + 0.003} for r in rows], TRUE, streams=4, stream_prompt=256)
    assert high.fixed_s == pytest.approx(ap - ad) and high.off_engine_s == 0.0 and high.raw_fixed_s == pytest.approx(0.0034)
    low = fit_prefill_stall([{**r, "stall_s": r["stall_s"] - 0.003} for r in rows], TRUE, streams=4, stream_prompt=256)
    assert low.fixed_s == 0.0 and low.off_engine_s == pytest.approx(ap - ad)
    with pytest.raises(ValueError, match="no prefill stall measured"):
        fit_prefill_stall([], TRUE, streams=4, stream_prompt=256)
    assert PrefillStall.from_dict(stall.to_dict()) == stall
    assert math.isnan(PrefillStall.from_dict({"streams": 4}).fixed_s)


def test_colocated_replay_charges_a_prefill_the_engine_part_and_keeps_a_lone_ttft():
    """With a measured stall, a colocated replay runs the engine's model (a_d + fixed_s for a
    prefill) and delays each request by the rest: one prompt alone has the same TTFT as without;
    four streams stepping together are held up by fixed_s + the per-token terms when a prompt joins
    them, not by a_p − a_d + those; a pair's replay and a stall of unknown size change nothing."""
    from pdlab.simreal.calibrate import engine_latency, fit_prefill_stall
    from pdlab.workloads import Request

    lat = FittedLatency((0.012, 2.0e-5, 3.0e-9), (0.003, 1.0e-7, 2.0e-4))
    stall = fit_prefill_stall([{"prompt_tokens": 200, "stall_s": 0.004 + 2.0e-5 * 200 + 3.0e-9 * 200 ** 2}], lat,
                              streams=4, stream_prompt=256)
    split = FittedLatency(lat.prefill, lat.decode, meta={"prefill_stall": stall.to_dict()})
    engine, off = engine_latency(split)
    assert engine.prefill == pytest.approx((0.007, 2.0e-5, 3.0e-9)) and off == pytest.approx(0.005)
    assert engine_latency(lat) == (lat, 0.0)
    unknown = FittedLatency(lat.prefill, lat.decode, meta={"prefill_stall": {"streams": 4}})   # fixed_s NaN
    assert engine_latency(unknown) == (unknown, 0.0)
    lone = [Request(0, 0.0, 200, 1)]
    assert simulate_like_live(lone, "colocated", split)[0].ttft_s == pytest.approx(
        simulate_like_live(lone, "colocated", lat)[0].ttft_s)
    reqs = [Request(i, 0.0, 256, 200) for i in range(4)] + [Request(4, 0.3, 200, 1)]

    def held_up(model):
        recs = simulate_like_live(reqs, "colocated", model)
        gaps = np.diff(recs[0].token_times_s)[5:]  # after the streams' own prompts are in
        k = int(np.argmax(gaps))                   # the step that admitted the prompt
        return gaps[k] - gaps[k - 1]

    per_token = 2.0e-5 * 200 + 3.0e-9 * 200 ** 2
    assert held_up(split) == pytest.approx(0.004 + per_token, abs=2e-5)
    assert held_up(lat) == pytest.approx(0.012 - 0.003 + per_token, abs=2e-5)
    pair = [Request(0, 0.0, 200, 4)]
    assert simulate_like_live(pair, "disaggregated", split)[0].ttft_s == simulate_like_live(pair, "disaggregated", lat)[0].ttft_s


def test_decode_matched_to_the_runs_median_tpot():
    """A pair whose every decode step costs 1.15× the fit's: matching the run's median TPOT scales
    the decode row by about 1.15 and the replay's median TPOT is the run's; the factor and both
    medians are recorded; a run slower than the highest factor allows gets that bound."""
    from pdlab.metrics import tpot_s
    from pdlab.simreal.calibrate import match_decode_to_tpot_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(6)
    arrivals = np.cumsum(rng.exponential(1 / 4.0, 80))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    meta = {"kv_link": {"latency_s": 0.010, "s_per_token": 2e-6}, "cpu_contention": {"prefill": 0.1, "decode": 0.05}}
    live = simulate_like_live(reqs, "disaggregated", FittedLatency(TRUE.prefill, [1.15 * c for c in TRUE.decode], meta=meta))
    fit = FittedLatency(TRUE.prefill, TRUE.decode, meta=meta)
    matched = match_decode_to_tpot_on_run(fit, live, "disaggregated")
    info = matched.meta["fit"]["decode_tpot_match"]
    assert info["factor"] == pytest.approx(1.15, rel=0.02)
    assert np.median(tpot_s(simulate_like_live(reqs, "disaggregated", matched))) == pytest.approx(
        np.median(tpot_s(live)), rel=0.005)
    assert info["live_tpot_p50_s"] == pytest.approx(float(np.median(tpot_s(live))))
    assert info["replay_tpot_p50_before_s"] < info["live_tpot_p50_s"]
    assert matched.prefill == fit.prefill and matched.meta["kv_link"] == meta["kv_link"]
    capped = match_decode_to_tpot_on_run(fit, live, "disaggregated", highest=1.05)
    assert capped.meta["fit"]["decode_tpot_match"]["factor"] == 1.05
