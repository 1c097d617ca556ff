"""pdlab.sim: conservation, determinism, schedulers, KV limit, disaggregation, latency models, CLI."""

import json

import numpy as np
import pdlab.sim.engine as engine
import pytest
from pdlab.cli import main
from pdlab.metrics import SLO
from pdlab.sim import (
    ConstantLatency,
    FittedLatency,
    InstanceSpec,
    Simulator,
    fit_latency,
    kv_capacity_tokens,
    load_profile,
    roofline_latency,
    sample_points,
    save_profile,
    simulate,
)
from pdlab.workloads import Request, synthetic_requests

REQS = synthetic_requests(300, 4.0, lengths="sharegpt", seed=5)


def _key(res):
    return [(r.request_id, r.ok, r.first_token_s, r.finish_s, r.preemptions) for r in res.records]


@pytest.mark.parametrize("mode,kw", [("colocated", dict(instances=2)), ("chunked", dict(instances=2)),
                                     ("disaggregated", dict(prefill=1, decode=1, link="ib-hdr"))])
def test_conservation_and_determinism(mode, kw):
    a = simulate(REQS, mode, "a100-80gb", "opt-13b", **kw)
    b = simulate(REQS, mode, "a100-80gb", "opt-13b", **kw)
    assert len(a.records) == len(REQS)
    assert all(r.ok or r.error for r in a.records)          # every request finishes or is reported
    assert all(r.ok for r in a.records)
    assert _key(a) == _key(b)
    for r in a.records:
        assert len(r.token_times_s) == r.output_tokens
        assert r.first_token_s >= r.arrival_s and r.finish_s >= r.first_token_s
        assert np.all(np.diff(np.asarray(r.token_times_s)) >= 0)


@pytest.mark.parametrize("mode", ["colocated", "chunked", "disaggregated"])
def test_multi_step_decode_plans_equal_step_by_step(monkeypatch, mode):
    kw = dict(prefill=1, decode=1, link="ib-hdr") if mode == "disaggregated" else dict(instances=2)
    fast = simulate(REQS[:150], mode, "a100-80gb", "opt-13b", **kw)
    monkeypatch.setattr(engine, "_MAX_PLAN_STEPS", 1)
    slow = simulate(REQS[:150], mode, "a100-80gb", "opt-13b", **kw)
    for f, s in zip(fast.records, slow.records, strict=True):
        assert f.first_token_s == pytest.approx(s.first_token_s, rel=1e-9)
        assert f.finish_s == pytest.approx(s.finish_s, rel=1e-9)


def test_kv_limit_preempts_and_oversized_prompt_fails():
    lat = ConstantLatency(0.01, 0.01)
    reqs = [Request(i, 0.0, 100, 200) for i in range(4)] + [Request(4, 0.0, 5000, 2)]
    res = Simulator([InstanceSpec(lat, kv_capacity_tokens=700)]).run(reqs)
    ok = [r for r in res.records if r.ok]
    bad = [r for r in res.records if not r.ok]
    assert len(ok) == 4 and len(bad) == 1 and "exceeds the KV capacity" in bad[0].error
    assert sum(r.preemptions for r in ok) > 0


def test_chunked_prefill_keeps_decodes_flowing():
    lat = roofline_latency("a100-80gb", "opt-13b")
    cap = kv_capacity_tokens("a100-80gb", "opt-13b")
    reqs = [Request(0, 0.0, 100, 400), Request(1, 1.0, 1900, 5)]
    worst = {}
    for sched in ("vllm", "chunked"):
        res = Simulator([InstanceSpec(lat, cap, scheduler=sched, token_budget=256)]).run(reqs)
        worst[sched] = float(np.max(np.diff(np.asarray(res.records[0].token_times_s))))
    assert worst["chunked"] < worst["vllm"]      # a long prefill stalls decodes without chunking


def test_disaggregated_transfer_and_overlap():
    reqs = synthetic_requests(20, 1.0, prompt_tokens=1024, output_tokens=8, seed=0)
    slow = simulate(reqs, "disaggregated", "a100-80gb", "opt-13b", link="eth-10g")
    fast = simulate(reqs, "disaggregated", "a100-80gb", "opt-13b", link="eth-10g", layerwise_overlap=True)
    r = slow.records[0]
    xfer = r.extra["kv_transfer_end_s"] - r.extra["kv_transfer_start_s"]
    assert xfer == pytest.approx(1024 * 819200 / 1.25e9, rel=1e-6)
    assert r.token_times_s[1] - r.token_times_s[0] > xfer
    assert np.mean([x.tpot_s for x in fast.records]) < np.mean([x.tpot_s for x in slow.records])


def test_pipeline_parallel_admits_a_batch_every_stage():
    reqs = [Request(i, 0.0, 100, 1) for i in range(4)]
    spec = InstanceSpec(ConstantLatency(1.0, pp=2), 10**6, max_batched_tokens=100, max_num_seqs=1)
    res = Simulator([spec]).run(reqs)
    assert [r.first_token_s for r in res.records] == pytest.approx([1.0, 1.5, 2.0, 2.5])


def test_fitted_model_profile_roundtrip(tmp_path):
    base = roofline_latency("a100-80gb", "opt-13b")
    fit = fit_latency(sample_points(base))
    assert fit.prefill_time_s([512]) == pytest.approx(base.prefill_time_s([512]), rel=0.15)
    assert fit.decode_time_s([600] * 16) == pytest.approx(base.decode_time_s([600] * 16), rel=0.15)
    path = save_profile(FittedLatency((0.01, 1e-4, 1e-8), (0.012, 1e-7, 1e-4), meta={"model": "x"}), tmp_path / "p.json")
    loaded = load_profile(path)
    assert loaded.prefill == (0.01, 1e-4, 1e-8) and loaded.meta["model"] == "x"
    with pytest.raises(ValueError, match="no profile for tp=2"):
        load_profile(path, tp=2)
    (tmp_path / "bad.json").write_text('{"prefill": [1, 2], "decode": [1, 2, 3]}')
    with pytest.raises(ValueError, match="three numbers"):
        load_profile(tmp_path / "bad.json")


def test_model_that_does_not_fit_is_a_clear_error():
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_tokens("a100-80gb", "llama-3-70b", tp=1)


def test_cli_simulate_json_records_and_errors(tmp_path, capsys):
    out = tmp_path / "rec.jsonl"
    args = ["simulate", "--synthetic", "--rate", "2", "--requests", "50", "--mode", "chunked", "--gpu", "a100-80gb",
            "--model", "opt-13b", "--slo-ttft", "0.5", "--slo-tpot", "0.1", "--records", str(out), "--json"]
    assert main(args) == 0
    payload = json.loads(capsys.readouterr().out)
    for key in ("requests", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "slo_attainment",
                "goodput_rps", "sim_wall_s"):
        assert key in payload
    assert len(out.read_text().splitlines()) == 50
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": []}\n{oops\n')
    assert main(["simulate", "--trace", str(bad), "--mode", "colocated", "--gpu", "h100-sxm",
                 "--model", "llama-3-8b"]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    assert main(args[:-1] + ["--slo-ttft", "0"]) == 2
    assert "SLO" in capsys.readouterr().err


def test_summary_reports_goodput_per_gpu():
    res = simulate(REQS[:100], "colocated", "a100-80gb", "opt-13b", instances=2)
    s = res.summary(SLO(ttft_s=1.0, tpot_s=0.1))
    assert s["num_gpus"] == 2
    assert s["per_gpu_goodput_rps"] == pytest.approx(s["goodput_rps"] / 2)
