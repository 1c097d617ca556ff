"""Unit tests of pdlab.simreal's stages: fitting (known coefficients recovered, bad input → clear
errors), the typed calibration and its profile file, the replay set up like the live deployments,
the run fit, and the comparisons (error table, held-out validation, host floor). No live server."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from pdlab.metrics import SLO, RequestRecord
from pdlab.sim.latency import FittedLatency, load_profile, sample_points
from pdlab.simreal.calibration import (
    Admission,
    Calibration,
    Contention,
    LinkFit,
    PrefillStall,
    RunFit,
    StepPoint,
    load_calibration,
    save_calibration,
)
from pdlab.simreal.compare import ERROR_COLUMNS, compare_runs, error_table
from pdlab.simreal.fit import fit_handoff, fit_profile, fit_row
from pdlab.simreal.probes import PROBE_PLANS, ProbePlan
from pdlab.simreal.replay import build_sim, replay, requests_from_records
from pdlab.simreal.runfit import step_gaps
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
    from pdlab.simreal.fit import merge_prefill_points

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
    from pdlab.simreal.fit import merge_prefill_points

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
    (rec,) = replay(reqs, "colocated", TRUE)
    assert math.isclose(rec.ttft_s, TRUE.prefill_time_s([300]), rel_tol=1e-9)
    steps = [TRUE.decode_time_s([300 + k]) for k in range(9)]  # the simulator reads the context before the step
    assert math.isclose(rec.finish_s - rec.first_token_s, sum(steps), rel_tol=1e-9)


def test_disaggregated_sim_follows_the_proxy_protocol():
    reqs = make_requests([0.0], 300, 10)
    link = LinkFit(latency_s=0.02, s_per_token=1e-5)
    (rec,) = replay(reqs, "disaggregated", Calibration(TRUE, kv_link=link))
    handoff = 0.02 + 300 * 1e-5
    # prefill (its token is discarded), hand-off, then decode's first step gives the first token
    expected_ttft = TRUE.prefill_time_s([300]) + handoff + TRUE.decode_time_s([300])
    assert math.isclose(rec.ttft_s, expected_ttft, rel_tol=1e-9)
    assert rec.output_tokens == 10 and len(rec.token_times_s) == 10
    with pytest.raises(ValueError, match="mode must be"):
        build_sim("pd", Calibration(TRUE))


def test_disaggregated_sim_applies_measured_contention_and_vllm_handoff():
    """The second prompt's prefill starts while the first request decodes: it takes 1 + c_p times
    as long with the measured contention; a request alone is not slowed; the physics is vLLM's."""
    reqs = make_requests([0.0, 0.05], 300, 40)
    base = {r.request_id: r for r in replay(reqs, "disaggregated", TRUE)}
    measured = Calibration(TRUE, contention=Contention.from_dict({"prefill": 0.5, "decode": 0.0}))
    slowed = {r.request_id: r for r in replay(reqs, "disaggregated", measured)}
    assert math.isclose(slowed[0].ttft_s, base[0].ttft_s, rel_tol=1e-9)   # alone: no peer busy
    prefill = TRUE.prefill_time_s([300])
    done = {k: r.extra["kv_transfer_start_s"] - r.arrival_s for k, r in (("base", base[1]), ("slowed", slowed[1]))}
    assert math.isclose(done["base"], prefill, rel_tol=1e-9)
    assert math.isclose(done["slowed"], 1.5 * prefill, rel_tol=1e-9)
    assert slowed[1].ttft_s > base[1].ttft_s
    # a fitted model whose meta holds the profile's entry is read as the same calibration
    lat = FittedLatency(TRUE.prefill, TRUE.decode, meta={"cpu_contention": {"prefill": 0.5, "decode": 0.0}})
    from_meta = {r.request_id: r for r in replay(reqs, "disaggregated", lat)}
    assert math.isclose(from_meta[1].ttft_s, slowed[1].ttft_s, rel_tol=1e-9)
    sim = build_sim("disaggregated", measured)
    pre, dec = sim.specs
    assert (pre.cpu_contention, dec.cpu_contention) == (0.5, 0.0) and pre.cpu_group == dec.cpu_group == "host"
    assert dec.handoff_reservation == "vllm" and sim.link.sharing == "fair"
    # the admission probe's F is at the CPU's noise level: recorded, charged only when passed
    admitted = dataclasses.replace(measured, admission=Admission.from_dict({"overhead_s": 0.06}))
    assert build_sim("disaggregated", admitted).specs[1].admit_overhead_s == 0.0
    assert build_sim("disaggregated", admitted, admit_overhead_s=0.01).specs[1].admit_overhead_s == 0.01


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
def test_step_gaps_read_a_run_as_decode_steps_of_the_fit():
    """Two streams whose token gaps are exactly the fitted step of the batch at that moment: every
    gap is the fitted step of batch 2 and is quiet; gaps while a third request waits for its first
    token are not quiet."""
    lat = FittedLatency((0.01, 0.0, 0.0), (0.005, 1e-5, 0.001))
    t, times = 0.0, []
    for k in range(6):                        # both streams decode together: contexts 100 + k, 200 + k
        times.append(t)
        t += lat.decode_time_s([100 + k, 200 + k])
    a = RequestRecord(0, -0.1, 100, 7, times[0], times[-1], token_times_s=list(times))
    b = RequestRecord(1, -0.1, 200, 7, times[0], times[-1], token_times_s=list(times))
    gaps = step_gaps([a, b])
    assert len(gaps) == 10 and all(g.quiet and g.batch == 2 for g in gaps)
    assert [g.gap_s / lat.step_time_s(0, 0.0, g.batch, g.context) for g in gaps] == pytest.approx([1.0] * 10)
    waiting = RequestRecord(2, times[2] - 0.001, 50, 2, times[4] + 1.0, times[4] + 1.1, token_times_s=[times[4] + 1.0,
                                                                                                      times[4] + 1.1])
    assert sum(not g.quiet for g in step_gaps([a, b, waiting])) > 1
    with pytest.raises(ValueError, match="two or more token times"):
        step_gaps([RequestRecord(0, 0.0, 10, 1, 0.1, 0.1, token_times_s=[0.1])])


def _varied_run(lat, seed=0, n=120, rate=6.0):
    """A colocated replay whose steps follow ``lat`` exactly: Poisson arrivals, prompts 32–1024,
    outputs 16–64 (batches and contexts that vary independently)."""
    from pdlab.workloads import Request

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    return replay(reqs, "colocated", lat)


def test_paired_error_is_zero_for_a_replay_of_itself_and_follows_each_request():
    """A live run that is its own model's replay: paired errors 0; a replay with a prefill twice as
    slow gives a positive paired TTFT error; pairs skip failed requests and match by send order."""
    from pdlab.simreal.compare import paired_error
    from pdlab.simreal.replay import replay_pairs

    recs = _varied_run(TRUE, rate=2.0, n=40)
    same = replay(requests_from_records(recs), "colocated", TRUE)
    assert len(replay_pairs(recs, same)) == len(recs)
    assert paired_error(recs, same, "ttft") == pytest.approx(0.0, abs=1e-9)
    assert paired_error(recs, same, "tpot") == pytest.approx(0.0, abs=1e-9)
    slow = FittedLatency(tuple(2 * c for c in TRUE.prefill), TRUE.decode)
    assert paired_error(recs, replay(requests_from_records(recs), "colocated", slow), "ttft") > 0.3
    named = [dataclasses.replace(r, request_id=f"r{i}") for i, r in enumerate(recs)]
    named[3] = dataclasses.replace(named[3], ok=False, error="boom")
    pairs = replay_pairs(named, same)
    assert len(pairs) == len(recs) - 1 and all(s.request_id == int(r.request_id[1:]) for r, s in pairs)
    with pytest.raises(ValueError, match="metric must be ttft or tpot"):
        paired_error(recs, same, "e2e")


def test_refit_decode_contention_on_run_measures_the_decode_roles_slowdown_while_prefill_works():
    """A pair whose decode steps take 1 + c as long while the prefill role works: the run's busy
    gaps over its quiet gaps give c back (the probe's value is kept in meta["fit"]); a run with
    too few gaps of either kind cannot be refitted."""
    from pdlab.simreal.runfit import refit_decode_contention_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(1 / 8.0, 150))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    probe = Calibration(TRUE, contention=Contention.from_dict({"prefill": 0.2, "decode": 0.5}))
    for c in (0.0, 0.1, 0.3):
        recs = replay(reqs, "disaggregated", Calibration(TRUE, contention=Contention.from_dict({"decode": c})))
        fitted = refit_decode_contention_on_run(probe, recs)
        assert fitted.contention.decode == pytest.approx(c, abs=1e-3)
        assert fitted.contention.prefill == 0.2 and fitted.latency.meta["fit"]["contention_decode"]["probe"] == 0.5
        assert build_sim("disaggregated", fitted).specs[1].cpu_contention == pytest.approx(c, abs=1e-3)
    with pytest.raises(ValueError, match="quiet and busy gaps"):
        refit_decode_contention_on_run(probe, recs[:3])


def test_prefill_core_load_stretches_the_pairs_prefill_by_the_co_runners_share_at_the_replayed_rate():
    """A pair whose prefill core also runs 0.1 of a core of front ends while requests are in flight
    plus 20 ms of CPU per request: at 5 req/s the co-runners take u = 0.2 of that core, so an
    unqueued prefill takes 1/(1 − 0.2) of its compute; at 10 req/s u = 0.3. The decode role and a
    colocated replay are untouched; u >= 1 and a colocated mode are errors that name the problem."""
    from pdlab.simreal.replay import arrival_rate_rps, with_prefill_core_load
    from pdlab.workloads import Request

    run = RunFit(prefill_core_base_cores=0.1, prefill_core_cpu_s_per_request=0.020)
    lat = FittedLatency(TRUE.prefill, TRUE.decode)
    for rate, u in ((5.0, 0.2), (10.0, 0.3)):
        reqs = [Request(i, i / rate, 512, 8) for i in range(11)]
        assert arrival_rate_rps(reqs) == pytest.approx(rate)
        loaded = with_prefill_core_load(lat, run, reqs)
        assert loaded.prefill_time_s([512]) == pytest.approx(TRUE.prefill_time_s([512]) / (1 - u))
        assert loaded.decode == TRUE.decode
    assert with_prefill_core_load(lat, RunFit(), [Request(0, 0.0, 8, 1), Request(1, 1.0, 8, 1)]).prefill == TRUE.prefill
    sparse = [Request(i, 1.0 * i, 512, 2) for i in range(5)]    # 1 req/s: u = 0.12, no queue at all
    plain = replay(sparse, "disaggregated", lat)
    with_load = replay(sparse, "disaggregated", Calibration(lat, run_fit=run))
    for a, b in zip(plain, with_load, strict=True):
        assert b.ttft_s - a.ttft_s == pytest.approx(TRUE.prefill_time_s([512]) * (1 / 0.88 - 1), rel=1e-6)
        assert b.tpot_s == pytest.approx(a.tpot_s)
    with pytest.raises(ValueError, match="co-runners would need 1.30 cores"):
        with_prefill_core_load(lat, run, [Request(i, i / 60.0, 8, 1) for i in range(4)])
    with pytest.raises(ValueError, match="run_fit.prefill_core: measured on a prefill/decode pair's prefill core"):
        replay(sparse, "colocated", Calibration(lat, run_fit=run))
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        RunFit(front_end_s=-1.0)


def test_arrival_rate_leaves_out_the_breaks_between_a_runs_blocks():
    """Two blocks of Poisson arrivals at 4 req/s, 60 s apart (lab 05 runs each rate in blocks):
    the rate is the blocks' own, not the span's; equal arrivals have none."""
    from pdlab.simreal.replay import arrival_rate_rps
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
    from pdlab.simreal.runfit import refit_prefill_core_load_on_run, split_co_runner_cpu

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
    fitted = refit_prefill_core_load_on_run(Calibration(TRUE), blocks, recs)
    assert fitted.run_fit.prefill_core_base_cores == split["base_cores"]
    assert fitted.run_fit.prefill_core_cpu_s_per_request == split["cpu_s_per_request"]
    assert fitted.latency.prefill == TRUE.prefill
    assert fitted.latency.meta["fit"]["prefill_core_load"]["windows"] == split["windows"]
    only = refit_prefill_core_load_on_run(Calibration(TRUE), blocks, recs, per_request_only=True)
    assert only.run_fit.prefill_core_base_cores == 0.0


def test_scaled_decode_row_takes_one_factor_from_the_run_and_the_shape_from_the_probe():
    """A slow run (batches 1–4) whose every decode step costs 1.3× TRUE's: scaling a probe fit
    that saw TRUE gives 1.3 and TRUE's row × 1.3, so it predicts batches the run never reached;
    prefill and meta are kept, the probe's fit quality moves to ``decode_probe``; a run without
    quiet steps cannot be scaled."""
    from pdlab.simreal.runfit import run_decode_points, scale_decode_on_run

    slow = FittedLatency(TRUE.prefill, tuple(1.3 * c for c in TRUE.decode))
    recs = _varied_run(slow, rate=1.0, n=60)
    assert max(p.decode_batch for p in run_decode_points(recs)) <= 4
    probe = Calibration(FittedLatency(TRUE.prefill, TRUE.decode, meta={"fit": {"decode": {"mape": 0.01}}}),
                        kv_link=LinkFit(1e-3, 0.0))
    scaled = scale_decode_on_run(probe, recs)
    info = scaled.latency.meta["fit"]["decode_run_scale"]
    assert info["scale"] == pytest.approx(1.3, rel=0.03) and info["mape"] < 0.05 and info["points"] >= 2
    assert scaled.latency.meta["fit"]["decode"] == {"mape": 0.01} and scaled.kv_link == probe.kv_link
    assert scaled.latency.prefill == TRUE.prefill
    for batch in (8, 16):
        assert scaled.latency.decode_time_s([300] * batch) == pytest.approx(slow.decode_time_s([300] * batch), rel=0.03)
    with pytest.raises(ValueError, match="no quiet decode step group"):
        scale_decode_on_run(probe, [RequestRecord(0, 0.0, 100, 3, 0.5, 0.5, token_times_s=[0.5] * 3)])


def test_chunk_token_counts_make_a_merged_gap_several_steps():
    """A server that said how many tokens each chunk held (continuous usage stats): a gap closed
    by a chunk of 3 tokens spans 3 steps, not one long step. Against the same record without the
    counts, the per-step median, the long share, the time ratio and the context all follow the
    counts; a chunk that held no token (a chat role chunk) is no step."""
    from pdlab.simreal.runfit import run_decode_points

    times = [0.0, 0.005, 0.010, 0.025, 0.030, 0.035]            # the 3rd gap is 15 ms: 3 steps merged
    blind = RequestRecord(0, -0.1, 100, 8, times[0], times[-1], token_times_s=list(times))
    told = RequestRecord(0, -0.1, 100, 8, times[0], times[-1], token_times_s=list(times),
                         chunk_tokens=[1, 1, 1, 3, 1, 1])
    role = RequestRecord(0, -0.1, 100, 8, 0.0, times[-1], token_times_s=[0.0, *times],
                         chunk_tokens=[0, 1, 1, 1, 3, 1, 1])
    gaps = step_gaps([told])
    assert [g.steps for g in gaps] == [1, 1, 3, 1, 1] and [g.steps for g in step_gaps([blind])] == [None] * 5
    assert [g.context for g in gaps] == [100, 101, 102, 105, 106]   # prompt + tokens before the midpoint − 1
    assert [dataclasses.replace(g, stream=0) for g in step_gaps([role])] == gaps
    # per step: 7 quiet steps of 5 ms with the counts
    (point,) = run_decode_points([told])
    assert point.samples == 7 and point.time_s == pytest.approx(0.005)


def test_prefill_stall_fit_keeps_the_fixed_part_within_the_lone_ttfts_and_the_profile_keeps_it():
    """Stalls of κ + b_p·P + c_p·P² give κ back; κ is kept within [0, a_p − a_d] (the raw median
    recorded) and the rest of a_p − a_d is off-engine; an empty probe is a clear error; a profile
    entry without its times reads as NaN (no split)."""
    from pdlab.simreal.fit import fit_prefill_stall

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
    from pdlab.simreal.fit import fit_prefill_stall
    from pdlab.simreal.replay import engine_latency
    from pdlab.workloads import Request

    lat = FittedLatency((0.012, 2.0e-5, 3.0e-9), (0.003, 1.0e-7, 2.0e-4))
    stall = fit_prefill_stall([{"prompt_tokens": 200, "stall_s": 0.004 + 2.0e-5 * 200 + 3.0e-9 * 200 ** 2}], lat,
                              streams=4, stream_prompt=256)
    split = Calibration(lat, prefill_stall=stall)
    engine, off = engine_latency(split)
    assert engine.prefill == pytest.approx((0.007, 2.0e-5, 3.0e-9)) and off == pytest.approx(0.005)
    assert engine_latency(Calibration(lat))[1] == 0.0
    unknown = Calibration(lat, prefill_stall=PrefillStall.from_dict({"streams": 4}))   # fixed_s NaN
    assert engine_latency(unknown) == (unknown.latency, 0.0) and unknown.terms() == []
    lone = [Request(0, 0.0, 200, 1)]
    assert replay(lone, "colocated", split)[0].ttft_s == pytest.approx(replay(lone, "colocated", lat)[0].ttft_s)
    reqs = [Request(i, 0.0, 256, 200) for i in range(4)] + [Request(4, 0.3, 200, 1)]

    def held_up(model):
        recs = replay(reqs, "colocated", model)
        gaps = np.diff(recs[0].token_times_s)[5:]  # after the streams' own prompts are in
        k = int(np.argmax(gaps))                   # the step that admitted the prompt
        return gaps[k] - gaps[k - 1]

    per_token = 2.0e-5 * 200 + 3.0e-9 * 200 ** 2
    assert held_up(split) == pytest.approx(0.004 + per_token, abs=2e-5)
    assert held_up(lat) == pytest.approx(0.012 - 0.003 + per_token, abs=2e-5)
    # on a pair the stall carries to the prefill engine: a lone prompt's TTFT is again unchanged
    pair = [Request(0, 0.0, 200, 4)]
    assert replay(pair, "disaggregated", split)[0].ttft_s == pytest.approx(replay(pair, "disaggregated", lat)[0].ttft_s)


def test_decode_matched_to_the_runs_median_tpot():
    """A pair whose every decode step costs 1.15× the fit's: matching the run's median TPOT scales
    the decode row by about 1.15 and the replay's median TPOT is the run's; the factor and both
    medians are recorded; a run slower than the highest factor allows gets that bound."""
    from pdlab.metrics import tpot_s
    from pdlab.simreal.runfit import match_decode_to_tpot_on_run
    from pdlab.workloads import Request

    rng = np.random.default_rng(6)
    arrivals = np.cumsum(rng.exponential(1 / 4.0, 80))
    reqs = [Request(i, float(a), int(rng.integers(32, 1024)), int(rng.integers(16, 64))) for i, a in enumerate(arrivals)]
    terms = dict(kv_link=LinkFit(0.010, 2e-6), contention=Contention.from_dict({"prefill": 0.1, "decode": 0.05}))
    live = replay(reqs, "disaggregated", Calibration(TRUE.derive(decode_scale=1.15), **terms))
    fit = Calibration(TRUE, **terms)
    matched = match_decode_to_tpot_on_run(fit, live, "disaggregated")
    info = matched.latency.meta["fit"]["decode_tpot_match"]
    assert info["factor"] == pytest.approx(1.15, rel=0.02)
    assert np.median(tpot_s(replay(reqs, "disaggregated", matched))) == pytest.approx(np.median(tpot_s(live)), rel=0.005)
    assert info["live_tpot_p50_s"] == pytest.approx(float(np.median(tpot_s(live))))
    assert info["replay_tpot_p50_before_s"] < info["live_tpot_p50_s"]
    assert matched.latency.prefill == fit.latency.prefill and matched.kv_link == fit.kv_link
    capped = match_decode_to_tpot_on_run(fit, live, "disaggregated", highest=1.05)
    assert capped.latency.meta["fit"]["decode_tpot_match"]["factor"] == 1.05


# ------------------------------------------------------------------ one fitting core
def test_nnls_fit_is_the_one_core_relative_or_absolute_and_checks_its_input():
    from pdlab.sim.latency import nnls_fit

    a = np.array([[1.0, 10.0], [1.0, 1000.0], [1.0, 100.0]])
    coef = np.array([0.002, 3e-5])
    assert np.allclose(nnls_fit(a, a @ coef), coef) and np.allclose(nnls_fit(a, a @ coef, relative=True), coef)
    y = a @ coef * np.array([1.0, 1.1, 1.0])            # the long point 10 % off
    rel = (a @ nnls_fit(a, y, relative=True) - y) / y
    absolute = (a @ nnls_fit(a, y) - y) / y
    assert np.abs(rel).max() < np.abs(absolute).max()   # relative residuals weigh the short points alike
    assert (nnls_fit(a, -(a @ coef)) >= 0).all()
    with pytest.raises(ValueError, match="every measured value > 0"):
        nnls_fit(a, np.zeros(3), relative=True)
    with pytest.raises(ValueError, match="one value per point"):
        nnls_fit(a, np.ones(2))


def test_derive_keeps_tp_pp_and_does_not_share_meta():
    lat = FittedLatency(TRUE.prefill, TRUE.decode, tp=2, pp=3, meta={"fit": {"x": 1}})
    d = lat.derive(decode_scale=2.0)
    assert (d.tp, d.pp, d.prefill) == (2, 3, TRUE.prefill) and d.decode == pytest.approx([2 * c for c in TRUE.decode])
    d.meta["fit"] = {}
    assert lat.meta == {"fit": {"x": 1}}


# ------------------------------------------------------------------ one calibration, CLI and replay alike
def _pair_calibration() -> Calibration:
    return Calibration(TRUE, kv_link=LinkFit(0.01, 2e-6), contention=Contention.from_dict({"prefill": 0.3, "decode": 0.1}),
                       run_fit=RunFit(front_end_s=0.004, prefill_core_base_cores=0.05,
                                      prefill_core_cpu_s_per_request=0.01))


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_cli_simulate_profile_and_the_lab_replay_give_identical_records(mode, tmp_path, capsys):
    """The same profile (every term the replay applies) and requests: `pdlab simulate --profile`
    writes exactly the records pdlab.simreal.replay.replay (lab 05's replay) returns."""
    from pdlab.cli import main
    from pdlab.metrics import read_records
    from pdlab.workloads import synthetic_requests

    if mode == "colocated":
        stall = PrefillStall.from_dict({"streams": 4, "fixed_s": 0.0004, "off_engine_s": 0.0006})
        cal = Calibration(TRUE, prefill_stall=stall, run_fit=RunFit(front_end_s=0.003))
    else:
        cal = _pair_calibration()
    path = save_calibration(cal, tmp_path / "cal.json")
    out = tmp_path / "recs.jsonl"
    rc = main(["simulate", "--synthetic", "--requests", "40", "--rate", "6", "--prompt-tokens", "300",
               "--output-tokens", "12", "--seed", "3", "--mode", mode, "--profile", str(path),
               "--kv-capacity-tokens", "50000", "--max-num-seqs", "64", "--records", str(out), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["calibrated_terms"] == cal.terms() and printed["completed"] == 40
    reqs = synthetic_requests(40, 6.0, prompt_tokens=300, output_tokens=12, seed=3)
    lab = replay(reqs, mode, load_calibration(path), kv_capacity_tokens=50000, max_num_seqs=64)
    cli = read_records(out)
    assert [r.as_dict(with_token_times=True) for r in cli] == [r.as_dict(with_token_times=True) for r in lab]
    plain = replay(reqs, mode, Calibration(TRUE), kv_capacity_tokens=50000, max_num_seqs=64)
    assert [r.ttft_s for r in plain] != [r.ttft_s for r in lab]     # the terms were applied, not dropped


def test_profile_terms_the_simulator_cannot_apply_are_errors_that_name_them(tmp_path, capsys):
    from pdlab.cli import main

    pair = save_calibration(_pair_calibration(), tmp_path / "pair.json")
    base = ["simulate", "--synthetic", "--requests", "5", "--profile"]
    assert main(base + [str(pair), "--mode", "colocated", "--instances", "2"]) == 2
    err = capsys.readouterr().err
    assert "cannot carry to 2 colocated engines (round_robin): cpu_contention: measured as a prefill role's" in err
    assert "run_fit.prefill_core: measured on a prefill/decode pair's prefill core" in err
    assert main(base + [str(pair), "--mode", "colocated", "--without", "run_fit.prefill_core"]) == 0
    out = capsys.readouterr().out
    assert "kv_link (not used): no KV hand-off between colocated engines" in out
    assert "cpu_contention (not used): one engine" in out
    assert main(base + [str(pair), "--mode", "disaggregated", "--tp", "2"]) == 2
    assert "calibrates one TP1×PP1 engine" in capsys.readouterr().err
    assert main(base + [str(pair), "--mode", "disaggregated", "--without", "admission_x"]) == 2
    assert "unknown term(s) admission_x" in capsys.readouterr().err
    data = json.loads(pair.read_text())
    data["decode_spin_s"] = 0.01
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(data))
    assert main(base + [str(odd), "--mode", "disaggregated"]) == 2
    assert "terms the simulator cannot apply: decode_spin_s" in capsys.readouterr().err
    with pytest.raises(ValueError, match="decode_spin_s"):
        load_calibration(odd)
    # an older profile: the run fit's keys at the top level still load, as a RunFit
    old = {k: v for k, v in data.items() if k not in ("run_fit", "decode_spin_s")}
    old.update(front_end_s=0.004, prefill_core_base_cores=0.05, prefill_core_cpu_s_per_request=0.01)
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load_calibration(tmp_path / "old.json").run_fit == _pair_calibration().run_fit
    # coefficients only: the roofline-free generic simulator, as before
    plain = save_calibration(Calibration(TRUE), tmp_path / "plain.json")
    assert main(base + [str(plain), "--mode", "colocated"]) == 2
    assert "--gpu and --model are needed" in capsys.readouterr().err


# ------------------------------------------------------------------ run fit, held-out validation, host floor
def _rates_run(cal, rates=(2.0, 4.0, 6.0), n=60, seed=0):
    from pdlab.workloads import Request

    rng = np.random.default_rng(seed)
    prompts, outputs = rng.integers(32, 1024, n), rng.integers(16, 64, n)
    live = {}
    for rate in rates:
        arrivals = np.cumsum(rng.exponential(1 / rate, n))
        reqs = [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs,
                                                                                          strict=True))]
        live[rate] = replay(reqs, "colocated", cal)
    return live


def test_fit_on_run_brings_a_slow_probe_to_the_run_and_held_out_rates_follow():
    """Live runs of a colocated server whose decode is 1.25× the probe's and whose front end adds
    5 ms: the run fit at any one rate recovers both, and predicts the other rates within 2 %
    (bootstrap intervals around each error); a fit that keeps the probe's decode row misses TPOT
    by about 20 % and fails the ±10 % verdict."""
    from pdlab.simreal.compare import heldout_validation
    from pdlab.simreal.runfit import fit_on_run

    truth = Calibration(TRUE.derive(decode_scale=1.25), run_fit=RunFit(front_end_s=0.005))
    live = _rates_run(truth)
    fitted = fit_on_run(Calibration(TRUE), live[4.0], "colocated")
    assert fitted.latency.decode == pytest.approx(truth.latency.decode, rel=0.02)
    assert fitted.run_fit.front_end_s == pytest.approx(0.005, abs=5e-4)
    held = heldout_validation(Calibration(TRUE), live, "colocated", boot=200)
    assert len(held.rows) == 6 and {(r["fit_rps"], r["rate_rps"]) for r in held.rows} >= {(2.0, 6.0), (6.0, 2.0)}
    assert held.ttft_mae < 0.02 and held.tpot_mae < 0.02 and held.paired_ttft_mae < 0.02 and held.met()
    assert all(r["ttft_lo"] <= r["ttft_p50_err"] <= r["ttft_hi"] for r in held.rows)
    probe_only = heldout_validation(Calibration(TRUE), live, "colocated", fit=lambda cal, rate: cal, boot=50)
    assert probe_only.tpot_mae == pytest.approx(0.2, abs=0.03) and not probe_only.met()
    with pytest.raises(ValueError, match=">= 2 rates"):
        heldout_validation(Calibration(TRUE), {2.0: live[2.0]}, "colocated")


def test_a_run_where_nearly_every_request_queues_keeps_the_front_end_delay():
    """At a rate so high that fewer than 3 requests met no prefill queue, the run fit cannot tell the
    front end's delay from the queue: it keeps the calibration's delay and says so, instead of failing
    the whole held-out loop; at a moderate rate the delay is refitted."""
    from pdlab.simreal.runfit import prefill_quiet_requests, refit_front_end_on_run

    truth = Calibration(TRUE, run_fit=RunFit(front_end_s=0.005))
    jammed = _rates_run(truth, rates=(400.0,), n=60)[400.0]
    assert len(prefill_quiet_requests(jammed)) < 3
    start = Calibration(TRUE, run_fit=RunFit(front_end_s=0.002))
    kept = refit_front_end_on_run(start, jammed, "colocated")
    assert kept.run_fit.front_end_s == 0.002
    assert kept.latency.meta["fit"]["front_end"]["source"].startswith("not refitted")
    calm = _rates_run(truth, rates=(2.0,), n=60)[2.0]
    assert refit_front_end_on_run(start, calm, "colocated").run_fit.front_end_s == pytest.approx(0.005, abs=5e-4)


def test_host_floor_from_repeated_blocks_and_a_perfect_models_chance():
    """Blocks of one rate that repeat exactly leave a perfect model no error (chance 1); blocks
    whose decode level moves by 20 % between them give a TPOT scatter of about 20 % and a chance
    well below 1; a larger scatter never raises the chance."""
    from pdlab.simreal.compare import host_floor, perfect_model_chance

    live = _rates_run(Calibration(TRUE), rates=(2.0, 4.0), n=40)
    same = {rate: [recs, recs] for rate, recs in live.items()}
    floor = host_floor(same, draws=2000)
    assert (floor.block_rms_ttft, floor.block_rms_tpot, floor.chance_met) == (0.0, 0.0, 1.0) and floor.pairs == 2
    slow = _rates_run(Calibration(TRUE.derive(decode_scale=1.2)), rates=(2.0, 4.0), n=40)
    moved = {rate: [live[rate], slow[rate]] for rate in live}
    floor = host_floor(moved, draws=4000)
    assert floor.block_rms_tpot == pytest.approx(np.log(1.2), rel=0.15) and floor.chance_met < 0.9
    assert floor.floor_tpot_p95 >= floor.floor_tpot_mae > 0
    chances = [perfect_model_chance(s, s, rates=3, blocks=2, draws=4000)[0] for s in (0.02, 0.08, 0.2)]
    assert chances[0] >= chances[1] >= chances[2]
    with pytest.raises(ValueError, match=">= 2 rates, each run in >= 2 blocks"):
        host_floor({2.0: [live[2.0], live[2.0]]})


def test_front_file_shows_the_stages_in_at_most_15_names_and_every_module_is_short():
    import pdlab.simreal as simreal
    from pdlab.paths import repo_root

    assert len(simreal.__all__) <= 15 and all(hasattr(simreal, n) for n in simreal.__all__)
    for path in (repo_root() / "helpers" / "pdlab" / "simreal").glob("*.py"):
        assert len(path.read_text().splitlines()) <= 600, path.name
