"""pdlab.sim: conservation, determinism, schedulers, KV limit, disaggregation, latency models, CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pdlab.sim.state as sim_state
import pytest
from pdlab.cli import main
from pdlab.metrics import SLO
from pdlab.sim import (
    ConstantLatency,
    FittedLatency,
    InstanceSpec,
    Simulator,
    build_simulator,
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


def test_deterministic_across_processes():
    """Two interpreters with different str-hash seeds give the same records, and the same as this one
    (no hash() of strings, no set order, no global state carried between runs)."""
    code = ("import json\n"
            "from pdlab.sim import simulate\n"
            "from pdlab.workloads import synthetic_requests\n"
            "reqs = synthetic_requests(300, 4.0, lengths='sharegpt', seed=5)\n"
            "out = []\n"
            "for mode, kw in (('chunked', dict(instances=2)), ('disaggregated', dict(prefill=1, decode=1, link='ib-hdr'))):\n"
            "    res = simulate(reqs, mode, 'a100-80gb', 'opt-13b', **kw)\n"
            "    out.append([(r.request_id, r.ok, r.first_token_s, r.finish_s, r.preemptions) for r in res.records])\n"
            "print(json.dumps(out))\n")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                                      check=True, capture_output=True, text=True).stdout) for seed in ("1", "2")]
    here = [[list(k) for k in _key(simulate(REQS, mode, "a100-80gb", "opt-13b", **kw))]
            for mode, kw in (("chunked", dict(instances=2)), ("disaggregated", dict(prefill=1, decode=1, link="ib-hdr")))]
    assert runs[0] == runs[1] == here
    assert len(here[0]) == len(REQS) and here[0] != here[1]


@pytest.mark.parametrize("mode,kw", [("colocated", dict(instances=2)), ("chunked", dict(instances=2)),
                                     ("disaggregated", dict(prefill=1, decode=1, link="ib-hdr"))])
def test_conservation(mode, kw):
    a = simulate(REQS, mode, "a100-80gb", "opt-13b", **kw)
    assert len(a.records) == len(REQS)
    assert all(r.ok or r.error for r in a.records)          # every request finishes or is reported
    assert all(r.ok for r in a.records)
    for r in a.records:
        assert len(r.token_times_s) == r.output_tokens
        assert r.first_token_s >= r.arrival_s and r.finish_s >= r.first_token_s
        assert np.all(np.diff(np.asarray(r.token_times_s)) >= 0)


@pytest.mark.parametrize("mode", ["colocated", "chunked", "disaggregated"])
def test_multi_step_decode_plans_equal_step_by_step(monkeypatch, mode):
    kw = dict(prefill=1, decode=1, link="ib-hdr") if mode == "disaggregated" else dict(instances=2)
    fast = simulate(REQS[:150], mode, "a100-80gb", "opt-13b", **kw)
    monkeypatch.setattr(sim_state, "MAX_PLAN_STEPS", 1)
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


def test_cli_sim_group_run_alias_and_compare(tmp_path, capsys):
    """`pdlab sim run` and its alias `pdlab simulate` give the same run; `pdlab sim compare` reads two record files."""
    common = ["--synthetic", "--rate", "4", "--requests", "40", "--mode", "colocated", "--gpu", "a100-80gb",
              "--model", "opt-13b", "--json"]
    sim_a, sim_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["sim", "run", *common, "--records", str(sim_a)]) == 0
    via_group = json.loads(capsys.readouterr().out)
    assert main(["simulate", *common, "--records", str(sim_b), "--seed", "1"]) == 0
    via_alias = json.loads(capsys.readouterr().out)
    assert via_group["requests"] == via_alias["requests"] == 40
    assert main(["sim", "compare", "--sim", str(sim_a), "--real", str(sim_a), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert [r["metric"] for r in same] == ["ttft_s", "tpot_s"]
    assert all(r["median_err_pct"] == 0 and r["equivalent"] for r in same)
    assert main(["sim", "compare", "--sim", str(sim_a), "--real", str(sim_b), "--metrics", "e2e_s", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other[0]["n_sim"] == other[0]["n_real"] == 40 and other[0]["median_err_pct"] != 0
    assert main(["sim", "compare", "--sim", str(sim_a), "--real", str(sim_b), "--margin", "2"]) == 2
    assert "--margin" in capsys.readouterr().err
    assert "alias of `pdlab sim run`" in main_help(["simulate", "--help"], capsys)


def main_help(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


def test_summary_reports_goodput_per_gpu():
    res = simulate(REQS[:100], "colocated", "a100-80gb", "opt-13b", instances=2)
    s = res.summary(SLO(ttft_s=1.0, tpot_s=0.1))
    assert s["num_gpus"] == 2
    assert s["per_gpu_goodput_rps"] == pytest.approx(s["goodput_rps"] / 2)


# -- the fast engine against the reference (the engine before closed-form plans) ------------------

def _reference_sim(specs, **kw):
    import sim_reference_engine as ref

    return ref.Simulator(specs, **kw)


def _assert_same_records(new, old, rel=1e-9):
    assert len(new.records) == len(old.records)
    for a, b in zip(new.records, old.records, strict=True):
        assert (a.request_id, a.ok, a.error, a.preemptions, a.instance) == \
            (b.request_id, b.ok, b.error, b.preemptions, b.instance)
        if not a.ok:
            continue
        assert a.ttft_s == pytest.approx(b.ttft_s, rel=rel, abs=1e-12)
        assert a.finish_s == pytest.approx(b.finish_s, rel=rel, abs=1e-12)
        if a.output_tokens > 1:
            assert a.tpot_s == pytest.approx(b.tpot_s, rel=rel, abs=1e-12)
        if a.token_times_s is not None:
            assert np.asarray(a.token_times_s) == pytest.approx(np.asarray(b.token_times_s), rel=rel, abs=1e-12)


def _mooncake(n, scale):
    from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl, scale_rate

    return scale_rate(read_mooncake_jsonl(mooncake_trace_path("conversation"), limit=n), scale)


@pytest.mark.parametrize("case", ["colocated", "chunked", "disaggregated", "overlap", "fitted", "pp2",
                                  "tight_kv", "tight_decode", "constant"])
def test_fast_engine_matches_reference(case):
    from pdlab.models import get_model, kv_bytes_per_token
    from pdlab.sim import KVLink

    lat = roofline_latency("h100-sxm", "llama-3-8b")
    cap = kv_capacity_tokens("h100-sxm", "llama-3-8b")
    reqs = _mooncake(250, 8.0)
    link = KVLink(kv_bytes_per_token(get_model("llama-3-8b")), 25e9, 32)
    kw = {}
    if case in ("colocated", "fitted", "constant"):
        if case == "fitted":
            lat = fit_latency(sample_points(lat))
        if case == "constant":
            lat, reqs = ConstantLatency(0.05, 0.013), REQS
        specs = [InstanceSpec(lat, cap) for _ in range(3)]
    elif case == "chunked":
        specs = [InstanceSpec(lat, cap, scheduler="chunked", token_budget=1024) for _ in range(3)]
    elif case == "pp2":
        lat2 = roofline_latency("h100-sxm", "llama-3-8b", pp=2)
        specs = [InstanceSpec(lat2, 2 * cap) for _ in range(2)]
    elif case == "tight_kv":   # preemption by recompute on colocated instances
        reqs = synthetic_requests(200, 20.0, prompt_tokens=900, output_tokens=300, seed=1)
        specs = [InstanceSpec(lat, 20_000), InstanceSpec(lat, 30_000, scheduler="chunked", token_budget=512)]
    else:
        if case == "overlap":
            link = KVLink(link.kv_bytes_per_token, 5e9, 32, layerwise_overlap=True, latency_s=0.002)
        dcap = 60_000 if case == "tight_decode" else cap
        if case == "tight_decode":
            reqs = synthetic_requests(200, 30.0, prompt_tokens=1500, output_tokens=400, seed=2)
        specs = [InstanceSpec(lat, cap, role="prefill") for _ in range(2)] + \
            [InstanceSpec(lat, dcap, role="decode") for _ in range(2)]
        kw = dict(dispatch="shortest_queue", link=link)
    new = Simulator(specs, **kw).run(reqs)
    old = _reference_sim(specs, **kw).run(reqs)
    _assert_same_records(new, old)
    if case == "tight_kv":
        assert sum(r.preemptions for r in new.records) > 0
    if case == "tight_decode":
        assert any(r.extra["kv_transfer_start_s"] > r.first_token_s + 1e-3 for r in new.records)
    for a, b in zip(new.instances, old.instances, strict=True):
        assert a["iterations"] == b["iterations"]
        assert a["busy_s"] == pytest.approx(b["busy_s"], rel=1e-9)


def test_plans_without_token_times_give_the_same_metrics():
    reqs = _mooncake(300, 8.0)
    a = simulate(reqs, "colocated", "h100-sxm", "llama-3-8b", instances=2)
    b = simulate(reqs, "colocated", "h100-sxm", "llama-3-8b", instances=2, record_token_times=False)
    assert [r.first_token_s for r in a.records] == [r.first_token_s for r in b.records]
    assert [r.finish_s for r in a.records] == [r.finish_s for r in b.records]


# -- prefix caching -------------------------------------------------------------------------------

def test_prefix_caching_skips_cached_blocks_and_counts_hits():
    lat = FittedLatency((0.001, 1e-5, 0.0), (0.01, 0.0, 0.0))
    shared = tuple(range(4))                       # 4 blocks of 512 tokens in common
    reqs = [Request(0, 0.0, 2100, 2, shared + (100,)), Request(1, 1.0, 2100, 2, shared + (101,))]
    spec = InstanceSpec(lat, 100_000, prefix_caching=True)
    res = Simulator([spec]).run(reqs)
    ttft = [r.ttft_s for r in res.records]
    assert ttft[0] == pytest.approx(0.001 + 1e-5 * 2100)
    assert ttft[1] == pytest.approx(0.001 + 1e-5 * (2100 - 4 * 512))
    info = res.instances[0]
    assert info["prefix_hit_tokens"] == 4 * 512
    assert info["prefix_hit_ratio"] == pytest.approx(2048 / 4200)
    off = Simulator([InstanceSpec(lat, 100_000)]).run(reqs)
    assert off.records[1].ttft_s == pytest.approx(ttft[0])


def test_prefix_cache_is_filled_only_when_a_prompt_is_admitted():
    """A prompt that waits for the token budget must not find its own blocks when it is admitted."""
    lat = FittedLatency((0.001, 1e-5, 0.0), (0.01, 0.0, 0.0))
    reqs = [Request(0, 0.0, 1500, 2, (1, 2, 3)), Request(1, 0.0, 1500, 2, (7, 8, 9))]
    spec = InstanceSpec(lat, 100_000, prefix_caching=True, max_batched_tokens=2000)
    res = Simulator([spec]).run(reqs)
    assert res.instances[0]["prefix_hit_tokens"] == 0


def test_build_simulator_prefix_caching_on_the_mooncake_trace():
    reqs = _mooncake(600, 4.0)
    on = simulate(reqs, "colocated", "h100-sxm", "llama-3-70b", instances=2, tp=4, prefix_caching=True)
    off = simulate(reqs, "colocated", "h100-sxm", "llama-3-70b", instances=2, tp=4)
    assert sum(i["prefix_hit_tokens"] for i in on.instances) > 0
    assert np.median([r.ttft_s for r in on.records]) < np.median([r.ttft_s for r in off.records])


# -- hand-off physics -----------------------------------------------------------------------------

def _pd(dcap=100_000, reservation="prompt", max_num_seqs=256, link=None, **extra):
    lat = FittedLatency((0.01, 0.0, 0.0), (0.01, 0.0, 0.0))
    specs = [InstanceSpec(lat, 100_000, role="prefill", max_batched_tokens=100_000, **extra),
             InstanceSpec(lat, dcap, role="decode", handoff_reservation=reservation, max_num_seqs=max_num_seqs,
                          **extra)]
    return Simulator(specs, dispatch="shortest_queue", link=link)


def test_handoff_reservation_bounds_concurrent_transfers():
    from pdlab.sim import KVLink

    link = KVLink(1000.0, 1e6, sharing="fair")            # 1 ms per token on the wire
    reqs = [Request(i, 0.0, 1000, 20) for i in range(3)]
    # prefills end at 0.01 s (the first request alone) and 0.02 s (the other two); the decode
    # instance holds 2,100 tokens: two prompts reserved at once, the third waits for a finish
    res = _pd(2100, link=link).run(reqs)
    starts = sorted(r.extra["kv_transfer_start_s"] for r in res.records)
    assert starts[:2] == pytest.approx([0.01, 0.02]) and starts[2] > 0.2
    # without reservation (KV staged in host memory) all three transfers start at once
    res = _pd(2100, "none", link=link).run(reqs)
    assert [r.extra["kv_transfer_start_s"] for r in res.records] == pytest.approx([0.01, 0.02, 0.02])
    assert all(r.ok for r in res.records)
    # vLLM also starts no hand-off while max_num_seqs requests run: the second waits for the first
    fast = KVLink(1000.0, 1e8)                            # 10 ms per prompt
    reqs = [Request(0, 0.0, 1000, 20), Request(1, 0.05, 1000, 20)]
    starts = {mode: [r.extra["kv_transfer_start_s"] for r in _pd(100_000, mode, max_num_seqs=1, link=fast).run(reqs).records]
              for mode in ("prompt", "vllm")}
    assert starts["prompt"] == pytest.approx([0.01, 0.06])
    assert starts["vllm"][1] == pytest.approx(0.02 + 19 * 0.01)     # when request 0 finishes


def test_fair_link_sharing_versus_fifo():
    from pdlab.sim import KVLink

    # two 1,000-token prompts (1 s each on the wire at 1 MB/s), prefilled by 0.01 s and 0.02 s
    reqs = [Request(0, 0.0, 1000, 2), Request(1, 0.0, 1000, 2)]
    fifo = _pd(link=KVLink(1000.0, 1e6)).run(reqs)
    fair = _pd(link=KVLink(1000.0, 1e6, sharing="fair")).run(reqs)
    ends_fifo = [r.extra["kv_transfer_end_s"] for r in fifo.records]
    ends_fair = [r.extra["kv_transfer_end_s"] for r in fair.records]
    assert ends_fifo == pytest.approx([1.01, 2.01])
    # fair: the first runs alone for 0.01 s, then both at half speed: 0.99 s left → 0.02 + 1.98
    assert ends_fair == pytest.approx([2.0, 2.01])
    # a short transfer joining a long one: 1,000 + 250 tokens; the short one gets half the link
    reqs = [Request(0, 0.0, 1000, 2), Request(1, 0.5, 250, 2)]
    fair = _pd(link=KVLink(1000.0, 1e6, sharing="fair")).run(reqs)
    e = {r.request_id: r.extra["kv_transfer_end_s"] for r in fair.records}
    # the first (from 0.01 s) has 0.5 s done when the second starts at 0.51; both run at half speed
    # until the second is done (0.25 s of work in 0.5 s), then the first finishes its last 0.25 s alone
    assert e[1] == pytest.approx(0.51 + 2 * 0.25)
    assert e[0] == pytest.approx(e[1] + (1.0 - 0.5 - 0.25))


def test_transfer_setup_cost_is_paid_per_transfer():
    from pdlab.sim import KVLink

    reqs = [Request(0, 0.0, 1000, 2), Request(1, 0.0, 1000, 2)]
    for sharing in ("fifo", "fair"):
        base = _pd(link=KVLink(1000.0, 1e6, sharing=sharing)).run(reqs)
        slow = _pd(link=KVLink(1000.0, 1e6, sharing=sharing, setup_s=0.05)).run(reqs)
        a = sorted(r.extra["kv_transfer_end_s"] for r in base.records)
        b = sorted(r.extra["kv_transfer_end_s"] for r in slow.records)
        assert b[1] - a[1] == pytest.approx(0.10 if sharing == "fifo" else 0.05, abs=0.011)
        assert b[0] > a[0] + 0.04
    assert KVLink(1000.0, 1e6, setup_s=0.05).transfer_s(1000) == pytest.approx(1.05)


def test_cpu_contention_slows_iterations_of_instances_sharing_cores():
    lat = ConstantLatency(0.1, 0.01)
    reqs = [Request(0, 0.0, 100, 50), Request(1, 0.0, 100, 50)]

    def run(factor):
        specs = [InstanceSpec(lat, 10_000, cpu_group="host", cpu_contention=factor) for _ in range(2)]
        return Simulator(specs).run(reqs)

    alone = run(0.0)
    shared = run(0.5)
    assert [r.ttft_s for r in alone.records] == pytest.approx([0.1, 0.1])
    # the second instance starts while the first is busy: 1.5× its prefill
    assert sorted(r.ttft_s for r in shared.records) == pytest.approx([0.1, 0.15])
    assert all(s.tpot_s > a.tpot_s for s, a in zip(shared.records, alone.records, strict=True))
    # same answer as a step-by-step simulation (the plans are re-cut when a peer's state changes)
    old = sim_state.MAX_PLAN_STEPS
    try:
        sim_state.MAX_PLAN_STEPS = 1
        step = run(0.5)
    finally:
        sim_state.MAX_PLAN_STEPS = old
    _assert_same_records(shared, step)
    with pytest.raises(ValueError, match="cpu_contention"):
        InstanceSpec(lat, 10, cpu_contention=-1)


def test_admit_overhead_stretches_the_decode_step_that_admits_a_handoff():
    """Each handed-off request adds admit_overhead_s to the one decode step that admits it: the
    stream already decoding loses exactly that much, once; nothing else changes."""
    lat = FittedLatency((0.01, 0.0, 0.0), (0.01, 0.0, 0.0))

    def run(overhead):
        specs = [InstanceSpec(lat, 100_000, role="prefill", max_batched_tokens=100_000),
                 InstanceSpec(lat, 100_000, role="decode", admit_overhead_s=overhead)]
        return {r.request_id: r for r in Simulator(specs, dispatch="shortest_queue").run(
            [Request(0, 0.0, 100, 40), Request(1, 0.105, 100, 5)]).records}

    base, slow = run(0.0), run(0.05)
    assert slow[0].ttft_s == pytest.approx(base[0].ttft_s)                  # the prefill's token: not decode work
    gaps_base, gaps_slow = np.diff(base[0].token_times_s), np.diff(slow[0].token_times_s)
    stretched = np.flatnonzero(~np.isclose(gaps_slow, gaps_base))
    handoff_1 = slow[1].extra["kv_transfer_end_s"]
    # request 0's own first decode step, and the one step that admits request 1 after its hand-off
    assert stretched[0] == 0 and len(stretched) == 2
    assert np.allclose(gaps_slow[stretched] - gaps_base[stretched], 0.05)
    times = slow[0].token_times_s                                             # it starts at the first step
    assert times[stretched[1] - 1] < handoff_1 <= times[stretched[1]] + 1e-9  # boundary after the hand-off
    assert slow[0].e2e_s == pytest.approx(base[0].e2e_s + 0.10)
    with pytest.raises(ValueError, match="admit_overhead_s"):
        InstanceSpec(lat, 10, admit_overhead_s=-0.1)


def test_engine_prefix_lru_equals_kvcache_lru():
    from pdlab.kvcache import LRUBlockCache
    from pdlab.sim.state import PrefixLRU

    rng = np.random.default_rng(3)
    fast, ref = PrefixLRU(40), LRUBlockCache(40)
    for _ in range(300):
        ids = [int(x) for x in rng.integers(0, 90, size=rng.integers(1, 12))]
        assert fast.match(ids) == ref.match(ids)
        fast.insert(ids)
        ref.insert(ids)
        assert fast.blocks() == ref.blocks()


def test_closed_form_plan_counts_steps_like_a_cumulative_sum():
    from pdlab.sim.state import BatchPlan

    lat = roofline_latency("h100-sxm", "llama-3-70b", tp=4)
    rng = np.random.default_rng(0)
    for n, ctx0, k in [(1, 100, 512), (8, 50_000, 300), (64, 2_000_000, 512), (3, 10, 2)]:
        plan = BatchPlan(lat.decode_affine(n), ctx0, n, k, 1.0)
        ends = np.cumsum(lat.decode_times_s(n, ctx0 + n * np.arange(k)))
        assert plan.elapsed_all(k) == pytest.approx(ends, rel=1e-12)
        for t in list(rng.uniform(0, ends[-1] * 1.1, 50)) + list(ends[:5]):
            assert plan.count_below(float(t), k) == int(np.searchsorted(plan.elapsed_all(k), t, side="left"))


def test_build_cluster_is_the_one_builder():
    """A deployment description gives the same simulator whichever way it is written, and a pool that
    cannot be built says what it lacks."""
    from pdlab.sim import ClusterSpec, PoolSpec, build_cluster

    lat = roofline_latency("a100-80gb", "opt-13b")
    explicit = ClusterSpec([PoolSpec("prefill", latency=lat, kv_capacity_tokens=50_000),
                            PoolSpec("decode", 2, latency=lat, kv_capacity_tokens=50_000)],
                           "opt-13b", link="ib-hdr")
    by_names = build_simulator("disaggregated", "a100-80gb", "opt-13b", prefill=1, decode=2, link="ib-hdr")
    sim = build_cluster(explicit)
    assert [s.role for s in sim.specs] == ["prefill", "decode", "decode"]
    assert sim.link.bandwidth_bytes_per_s == by_names.link.bandwidth_bytes_per_s
    assert sim.link.kv_bytes_per_token == by_names.link.kv_bytes_per_token > 0
    assert type(sim.dispatch).__name__ == "ShortestQueue"
    # the catalog capacity, computed the same way as build_simulator's
    assert by_names.specs[0].kv_capacity_tokens == kv_capacity_tokens("a100-80gb", "opt-13b")
    # a colocated cluster has no link and round-robin dispatch; empty pools are allowed
    col = build_cluster(ClusterSpec([PoolSpec("colocated", 2, "a100-80gb"), PoolSpec("prefill", 0)], "opt-13b"))
    assert col.link is None and len(col.specs) == 2 and type(col.dispatch).__name__ == "RoundRobin"
    with pytest.raises(ValueError, match="needs a latency model"):
        build_cluster(ClusterSpec([PoolSpec("colocated")]))
    with pytest.raises(ValueError, match="not both"):
        build_cluster(ClusterSpec(explicit.pools, "opt-13b", link="ib-hdr", link_bandwidth_bytes_per_s=1e9))


# -- token times of closed-form plans, expanded at the end of a run (issue 22) ---------------------

def test_deferred_plan_stamps_equal_each_plans_step_ends():
    from array import array

    from pdlab.sim.state import Batch, BatchPlan, expand_plan_stamps, plan_step_ends

    rng = np.random.default_rng(7)
    lat = roofline_latency("h100-sxm", "llama-3-70b", tp=4)
    plans = []
    for _ in range(300):
        n, k = int(rng.integers(1, 64)), int(rng.integers(2, 600))
        if rng.random() < 0.5:      # the roofline's lines
            coef, ctx0 = lat.decode_affine(n), int(rng.integers(1, 3_000_000))
        else:                       # lines that cross inside the plan (the second one from step m on)
            coef, ctx0 = (0.02, 1e-9, 0.005, 1e-5, 0.001), int(rng.integers(1, 1000))
        plan = BatchPlan(coef, ctx0, n, k, float(rng.choice([1.0, 1.3])))
        plans.append(Batch([], [], float(rng.uniform(0, 1e4)), None, plan.elapsed(k), plan, k))
    assert any(b.plan.m < b.n_steps for b in plans) and any(b.plan.m == b.n_steps for b in plans)
    ends, offsets, steps = plan_step_ends(plans)
    expected_ends = [b.step_ends().copy() for b in plans]
    for i, b in enumerate(plans):
        assert ends[offsets[i]:offsets[i] + steps[i]].tobytes() == expected_ends[i].tobytes()
        b.ends = None
    for _ in range(20):             # plans of a model without a closed form carry their own ends
        start = float(rng.uniform(0, 1e4))
        own = start + np.cumsum(rng.uniform(0.01, 0.05, int(rng.integers(2, 50))))
        plans.append(Batch([], [], start, own, float(own[-1] - start)))
        expected_ends.append(own)
    base = -3.0                     # markers base - i stand for plan i; time stamps are above base
    times, expected = [], []
    for _ in range(80):     # one request's times: time stamps and plan markers, interleaved
        got, want = [], array("d")
        for _ in range(int(rng.integers(0, 8))):
            if rng.random() < 0.4:
                t = float(rng.uniform(-2, 1e4))
                got.append(t)
                want.append(t)
            else:
                i = int(rng.integers(len(plans)))
                got.append(base - i)
                want.frombytes(expected_ends[i].tobytes())
        times.append(got)
        expected.append(want)
    assert [a.tobytes() for a in expand_plan_stamps(times, plans, base)] == [a.tobytes() for a in expected]


def test_token_times_with_negative_arrivals_match_the_reference():
    """Plan markers go below the first arrival, so runs with times below zero are recorded alike
    (the first requests arrive before 0 s and wait for the first arrival after it)."""
    import dataclasses

    lat = roofline_latency("h100-sxm", "llama-3-8b")
    cap = kv_capacity_tokens("h100-sxm", "llama-3-8b")
    reqs = [dataclasses.replace(r, arrival_s=r.arrival_s - 2.0) for r in _mooncake(150, 8.0)]
    specs = [InstanceSpec(lat, cap, scheduler="chunked", token_budget=1024) for _ in range(2)]
    new = Simulator(specs).run(reqs)
    assert min(r.arrival_s for r in new.records) < 0 and any(len(r.token_times_s) > 2 for r in new.records)
    _assert_same_records(new, _reference_sim(specs).run(reqs))


def test_models_without_a_closed_form_match_the_reference():
    """A model that overrides only step_time_s plans with numpy step times; those plans' token times
    go through the same end-of-run expansion as closed-form ones."""
    from pdlab.models import get_model, kv_bytes_per_token
    from pdlab.sim import KVLink
    from pdlab.sim.latency import RooflineLatency

    class NoClosedForm(RooflineLatency):
        def step_time_s(self, *args):
            return super().step_time_s(*args)

    base = roofline_latency("h100-sxm", "llama-3-8b")
    lat, cap = NoClosedForm(base.gpu, base.model), kv_capacity_tokens("h100-sxm", "llama-3-8b")
    reqs = _mooncake(200, 8.0)
    link = KVLink(kv_bytes_per_token(get_model("llama-3-8b")), 25e9, 32)
    for specs, kw in (([InstanceSpec(lat, cap, scheduler="chunked", token_budget=1024) for _ in range(2)], {}),
                      ([InstanceSpec(lat, cap, role="prefill"), InstanceSpec(lat, cap, role="decode")],
                       dict(dispatch="shortest_queue", link=link))):
        new = Simulator(specs, **kw).run(reqs)
        assert any(len(r.token_times_s) > 2 for r in new.records)
        _assert_same_records(new, _reference_sim(specs, **kw).run(reqs))


def test_run_restores_the_garbage_collector_state():
    import gc

    sim = Simulator([InstanceSpec(ConstantLatency(0.05, 0.01), 100_000)])
    assert gc.isenabled()
    sim.run(REQS[:20])
    assert gc.isenabled()
    gc.disable()
    try:
        sim.run(REQS[:20])
        assert not gc.isenabled()
    finally:
        gc.enable()
