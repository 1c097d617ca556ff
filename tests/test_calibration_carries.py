"""A calibration carries to deployments it was not measured on (issue 53, item 1): one calibrated
engine, built here from synthetic step times (no live server), simulated by ``pdlab sim run
--profile`` as one engine, two replicas round robin, chunked, 1P1D and 2P1D, and searched by
``pdlab place --calibration``; a term that cannot carry is an error that names it and says why;
the CLI gives the Python replay's records; a ``pdlab-latency-profile/1`` file written by hand loads
and carries; a CPU engine's run is counted in cores."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pdlab.cli import main
from pdlab.metrics import read_records, summarize
from pdlab.sim.latency import FittedLatency, sample_points
from pdlab.simreal.calibration import (
    Calibration,
    Contention,
    CoreShare,
    LinkFit,
    PrefillStall,
    RunFit,
    load_calibration,
    save_calibration,
)
from pdlab.simreal.fit import fit_profile
from pdlab.simreal.replay import Deployment, build_sim, carry, replay
from pdlab.workloads import Request, synthetic_requests

#: A one-core CPU engine's step times (s): prefill a + b·Σl + c·Σl², decode a + b·Σctx + c·batch.
ENGINE = FittedLatency((0.012, 6.0e-5, 1.0e-9), (0.010, 2.0e-7, 1.5e-3))
#: A rate (req/s) of 512 → 32-token requests that loads one such engine (its TTFT queues), not two.
LOADED_RPS = 12.0
WORKLOAD = dict(prompt_tokens=512, output_tokens=32, seed=1)


def _calibration(**terms) -> Calibration:
    """The engine fitted from synthetic probe points (as a probe's), on a CPU, with ``terms``."""
    points = sample_points(ENGINE, prefill_lengths=(16, 128, 512, 1024, 1536), prefill_batches=(1,),
                           decode_batches=(1, 4, 16, 32), decode_contexts=(64, 512), noise=0.01, seed=0)
    lat = fit_profile(points, meta={"device": "cpu", "source": "test"})
    pre = [p for p in points if p["prefill_tokens"] > 0]
    dec = [p for p in points if p["decode_batch"] > 0]
    return Calibration(lat, pre, dec, **terms)


def _engine_and_link() -> Calibration:
    """One colocated engine's calibration and the KV link: what lab 05 probes before it predicts."""
    return _calibration(kv_link=LinkFit(0.004, 2e-6),
                        prefill_stall=PrefillStall.from_dict({"streams": 4, "fixed_s": 0.001}),
                        run_fit=RunFit(front_end_s=0.002),
                        front_end_core=CoreShare(base_cores=0.05, cpu_s_per_request=0.01))


def _sim_run(path, *flags, tmp_path, capsys, requests=120, rate=LOADED_RPS):
    out = tmp_path / f"recs{len(list(tmp_path.glob('recs*')))}.jsonl"
    rc = main(["sim", "run", "--synthetic", "--requests", str(requests), "--rate", str(rate),
               "--prompt-tokens", str(WORKLOAD["prompt_tokens"]), "--output-tokens", str(WORKLOAD["output_tokens"]),
               "--seed", str(WORKLOAD["seed"]), "--profile", str(path), "--records", str(out), "--json", *flags])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    return json.loads(printed.out), read_records(out)


DEPLOYMENTS = {
    "one engine": (("--mode", "colocated"), Deployment("colocated")),
    "two replicas round robin": (("--mode", "colocated", "--instances", "2", "--dispatch", "round_robin"),
                                 Deployment("colocated", instances=2, dispatch="round_robin")),
    "chunked": (("--mode", "chunked"), Deployment("chunked")),
    "1P1D": (("--mode", "disaggregated"), Deployment("disaggregated")),
    "2P1D": (("--mode", "disaggregated", "--prefill", "2", "--decode", "1"), Deployment("disaggregated", prefill=2)),
    "two replicas, front ends on their cores": (("--mode", "colocated", "--instances", "2",
                                                 "--front-end-shares-core"),
                                                Deployment("colocated", instances=2, front_end_shares_core=True)),
}


def test_one_calibration_simulates_every_deployment_of_its_engine(tmp_path, capsys):
    """Every deployment completes every request with the targeted tokens, and the CLI's records
    are the Python replay's for the same deployment; two replicas queue less than one engine at
    a rate that loads one; colocated and chunked are one scheduler for a calibrated engine."""
    cal = _engine_and_link()
    path = save_calibration(cal, tmp_path / "engine.json")
    reqs = synthetic_requests(120, LOADED_RPS, **WORKLOAD)
    runs = {}
    for name, (flags, dep) in DEPLOYMENTS.items():
        printed, recs = _sim_run(path, *flags, tmp_path=tmp_path, capsys=capsys)
        assert printed["completed"] == printed["requests"] == 120, name
        assert all(r.ok and r.output_tokens == 32 and len(r.token_times_s) == 32 for r in recs), name
        assert printed["deployment"] == str(dep) and printed["engines"] == dep.engines
        lab = replay(reqs, dep, load_calibration(path), max_num_seqs=256)
        assert [r.as_dict(with_token_times=True) for r in recs] == [r.as_dict(with_token_times=True) for r in lab]
        runs[name] = summarize(recs)
    one, two = runs["one engine"]["ttft_p50_s"], runs["two replicas round robin"]["ttft_p50_s"]
    lone = replay([Request(0, 0.0, 512, 32)], "colocated", cal)[0].ttft_s
    assert one > 2 * lone, "the rate must load one engine"
    assert two < 0.5 * one
    assert runs["chunked"] == runs["one engine"]
    # the front ends on the replicas' cores slow them: prefill by u = 0.05 + 6 req/s × 10 ms = 0.11 of each
    # core, decode by its per-request part, 6 req/s × 10 ms = 0.06
    assert runs["two replicas, front ends on their cores"]["tpot_p50_s"] > runs["two replicas round robin"]["tpot_p50_s"]
    lone_fe = replay([Request(0, 0.0, 512, 32), Request(1, 1.0, 512, 32)],
                     Deployment("colocated", instances=2, front_end_shares_core=True), cal)[0]
    lone_plain = replay([Request(0, 0.0, 512, 32), Request(1, 1.0, 512, 32)], Deployment("colocated", instances=2),
                        cal)[0]
    # 1 req/s over two engines: decode pays the per-request CPU only (its streaming is in the decode probe)
    assert lone_fe.finish_s - lone_fe.first_token_s == pytest.approx(
        (lone_plain.finish_s - lone_plain.first_token_s) / (1 - 0.5 * 0.01), rel=1e-9)


def test_a_calibrated_cpu_run_counts_cores(tmp_path, capsys):
    path = save_calibration(_engine_and_link(), tmp_path / "engine.json")
    rc = main(["sim", "run", "--synthetic", "--requests", "20", "--rate", "4", "--profile", str(path),
               "--mode", "colocated", "--instances", "2"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "2 colocated engines (round_robin): 20/20 requests on 2 cores" in text and "GPU" not in text
    printed, _ = _sim_run(path, "--mode", "disaggregated", tmp_path=tmp_path, capsys=capsys, requests=20, rate=4)
    assert printed["num_cores"] == 2 and printed["num_gpus"] is None and printed["device"] == "cpu"
    gpu = _calibration(kv_link=LinkFit(0.004, 2e-6))
    gpu = Calibration.from_latency(gpu.latency.derive(meta={**gpu.latency.meta, "device": "cuda"}))
    gpath = save_calibration(gpu, tmp_path / "gpu.json")
    assert main(["sim", "run", "--synthetic", "--requests", "5", "--profile", str(gpath), "--mode", "disaggregated"]) == 0
    assert "5/5 requests on 2 GPUs" in capsys.readouterr().out


def test_a_profile_without_a_device_probed_here_takes_this_machines(monkeypatch):
    import pdlab.hardware

    lat = FittedLatency(ENGINE.prefill, ENGINE.decode, meta={"url": "http://127.0.0.1:8100"})
    monkeypatch.setattr(pdlab.hardware, "resolve_device", lambda device: "cpu")
    assert Calibration(lat).device == "cpu"
    monkeypatch.setattr(pdlab.hardware, "resolve_device", lambda device: "cuda")
    assert Calibration(lat).device == "cuda"
    assert Calibration(lat.derive(meta={"url": "http://10.0.0.5:8100"})).device is None
    assert Calibration(lat.derive(meta={"device": {"kind": "cpu", "name": "x86_64"}})).device == "cpu"


def test_terms_that_cannot_carry_are_errors_that_name_them_and_say_why(tmp_path, capsys):
    """A pair's calibration (contention between the roles, the pair's prefill core load) carries to
    xPyD, not to colocated replicas; a front end on the engines' cores needs its term and must not
    charge the pair's front ends twice; a term left out on purpose is gone."""
    pair = _calibration(kv_link=LinkFit(0.004, 2e-6), contention=Contention.from_dict({"prefill": 0.3, "decode": 0.1}),
                        run_fit=RunFit(front_end_s=0.002, prefill_core_base_cores=0.05,
                                       prefill_core_cpu_s_per_request=0.01))
    how = carry(pair, Deployment("disaggregated", prefill=2))
    assert set(how.applied) == {"kv_link", "cpu_contention", "run_fit.front_end_s", "run_fit.prefill_core"}
    sim = build_sim(Deployment("disaggregated", prefill=2), pair)
    assert [(s.role, s.cpu_contention, s.cpu_group) for s in sim.specs] == [
        ("prefill", 0.3, "host"), ("prefill", 0.3, "host"), ("decode", 0.1, "host")]
    with pytest.raises(ValueError) as err:
        carry(pair, Deployment("colocated", instances=2))
    text = str(err.value)
    assert text.startswith("the calibration's terms cannot carry to 2 colocated engines (round_robin): ")
    assert "cpu_contention: measured as a prefill role's and a decode role's slowdown while the other works" in text
    assert "run_fit.prefill_core: measured on a prefill/decode pair's prefill core" in text
    with pytest.raises(ValueError, match="front_end_core: missing: the deployment runs each front end on its"):
        carry(pair.without("run_fit.prefill_core"), Deployment("disaggregated", front_end_shares_core=True))
    both = Calibration(pair.latency, kv_link=pair.kv_link, run_fit=pair.run_fit,
                       front_end_core=CoreShare(base_cores=0.05, cpu_s_per_request=0.01))
    with pytest.raises(ValueError, match="run_fit.prefill_core: already charges the front ends on the prefill core"):
        carry(both, Deployment("disaggregated", front_end_shares_core=True))
    dropped = pair.without("cpu_contention", "run_fit.prefill_core")
    assert dropped.contention is None and dropped.run_fit == RunFit(front_end_s=0.002)
    assert "cpu_contention" not in dropped.to_dict()
    assert set(carry(dropped, Deployment("colocated", instances=2)).applied) == {"run_fit.front_end_s"}
    path = save_calibration(pair, tmp_path / "pair.json")
    assert main(["sim", "run", "--synthetic", "--requests", "5", "--profile", str(path), "--mode", "chunked",
                 "--instances", "2"]) == 2
    assert "cpu_contention: measured as a prefill role's" in capsys.readouterr().err
    assert main(["sim", "run", "--synthetic", "--requests", "5", "--profile", str(path), "--mode", "chunked",
                 "--instances", "2", "--without", "cpu_contention,run_fit.prefill_core"]) == 0
    capsys.readouterr()
    assert main(["sim", "run", "--synthetic", "--requests", "5", "--profile", str(path), "--mode", "disaggregated",
                 "--link", "ib-ndr"]) == 2
    assert "its measured kv_link" in capsys.readouterr().err


def test_a_hand_written_v1_profile_loads_and_carries(tmp_path, capsys):
    """A ``pdlab-latency-profile/1`` file as lab 05 and older versions wrote it (the run fit's keys
    at the top level, no device, no front_end_core) loads, and carries to 2P1D and, without its
    contention, to two replicas."""
    v1 = {"format": "pdlab-latency-profile/1", "tp": 1, "pp": 1, "prefill": list(ENGINE.prefill),
          "decode": list(ENGINE.decode), "source": "pdlab sim calibrate", "url": "http://10.0.0.5:8100",
          "points": [{"prefill_tokens": 512, "prefill_sq_tokens": 512.0 ** 2, "decode_batch": 0,
                      "decode_ctx_tokens": 0, "time_s": ENGINE.prefill_time_s([512]), "samples": 3, "kind": "prefill"}],
          "kv_link": {"latency_s": 0.004, "s_per_token": 2e-6, "mae_s": 1e-4, "points": 3},
          "cpu_contention": {"prefill": 0.3, "decode": 0.1},
          "prefill_stall": {"streams": 4, "fixed_s": 0.001, "off_engine_s": 0.001},
          "front_end_s": 0.002, "calibration_s": 30.0}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(v1))
    cal = load_calibration(path)
    assert cal.run_fit == RunFit(front_end_s=0.002) and cal.contention.prefill == 0.3 and cal.device is None
    assert cal.terms() == ["kv_link", "cpu_contention", "prefill_stall", "run_fit"]
    printed, recs = _sim_run(path, "--mode", "disaggregated", "--prefill", "2", tmp_path=tmp_path, capsys=capsys,
                             requests=40, rate=6)
    assert printed["completed"] == 40 and all(r.ok for r in recs)
    assert set(printed["carried_terms"]) == {"kv_link", "cpu_contention", "prefill_stall", "run_fit.front_end_s"}
    assert printed["engines"] == 3 and "num_cores" not in printed     # device unknown: counted in engines
    assert main(["sim", "run", "--synthetic", "--requests", "5", "--profile", str(path), "--mode", "colocated",
                 "--instances", "2"]) == 2
    assert "cpu_contention" in capsys.readouterr().err
    printed, recs = _sim_run(path, "--mode", "colocated", "--instances", "2", "--without", "cpu_contention",
                             tmp_path=tmp_path, capsys=capsys, requests=40, rate=6)
    assert printed["completed"] == 40 and printed["unused_terms"] == {"kv_link": "no KV hand-off between colocated engines"}


def test_pdlab_place_searches_the_deployments_of_a_calibrated_engine(tmp_path, capsys):
    """On two cores: one engine, two replicas and 1P1D, each with its goodput; the best is the
    highest; two replicas serve more than one engine; the best deployment meets the goal at its
    goodput, every request completed."""
    from pdlab.metrics import SLO, slo_attainment
    from pdlab.sched.placement import SEARCH_PROFILES, workload_requests

    cal = _engine_and_link()
    path = save_calibration(cal, tmp_path / "engine.json")
    rc = main(["place", "--calibration", str(path), "--engines", "2", "--workload", "fixed-512-32",
               "--slo-ttft", "0.25", "--slo-tpot", "0.05", "--profile", "smoke", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    d = json.loads(out.out)
    found = {c["deployment"]: c for c in d["candidates"]}
    assert set(found) == {"1 colocated engine", "2 colocated engines (round_robin)", "1P1D"}
    assert not any(c["skipped"] for c in d["candidates"])
    assert d["best"]["goodput_rps"] == max(c["goodput_rps"] for c in d["candidates"])
    assert found["2 colocated engines (round_robin)"]["goodput_rps"] > found["1 colocated engine"]["goodput_rps"] > 0
    assert d["unit"] == "core" and d["engines"] == 2
    best = d["best"]
    dep = Deployment(best["mode"], instances=best["instances"] or 1, prefill=best["prefill"] or 1,
                     decode=best["decode"] or 1)
    settings = SEARCH_PROFILES["smoke"]
    rate = best["goodput_rps"]
    recs = replay(workload_requests("fixed-512-32", settings.requests_at(rate), rate, settings.seed), dep, cal,
                  max_num_seqs=256)
    assert all(r.ok for r in recs)
    assert slo_attainment(recs, SLO(ttft_s=0.25, tpot_s=0.05)) >= 0.9
    assert main(["place", "--calibration", str(path), "--workload", "fixed-512-32", "--slo-ttft", "0.25",
                 "--slo-tpot", "0.05"]) == 2
    assert "--calibration needs --engines" in capsys.readouterr().err
    assert main(["place", "--workload", "fixed-512-32", "--slo-ttft", "0.25", "--slo-tpot", "0.05"]) == 2
    assert "--model, --gpu, --nodes, --gpus-per-node needed" in capsys.readouterr().err


def test_front_end_core_round_trips_and_checks_its_values(tmp_path):
    share = CoreShare(base_cores=0.05, cpu_s_per_request=0.01, requests=80, windows=30, r2=0.8, rate_rps=4.0)
    cal = _calibration(front_end_core=share)
    back = load_calibration(save_calibration(cal, tmp_path / "c.json"))
    assert back.front_end_core == share and back.terms() == ["front_end_core"]
    assert share.share(10.0) == pytest.approx(0.15)
    assert math.isnan(CoreShare.from_dict({"base_cores": 0.1}).r2)
    with pytest.raises(ValueError, match="CoreShare.cpu_s_per_request must be a finite number >= 0"):
        CoreShare(cpu_s_per_request=-0.001)
    with pytest.raises(ValueError, match="front end on its engine's core would need 1.05 cores"):
        replay([Request(i, i / 100.0, 64, 2) for i in range(10)], Deployment("colocated", front_end_shares_core=True),
               cal)
    with pytest.raises(ValueError, match="unknown term"):
        cal.without("front_end")
    assert np.isfinite(summarize(replay([Request(0, 0.0, 64, 4), Request(1, 0.5, 64, 4)], "colocated", cal))[
        "ttft_p50_s"])


def test_the_front_end_probe_splits_its_cpu_into_cores_in_flight_and_seconds_per_request(monkeypatch):
    """The probe's wiring, without a server: the benchmark client and the CPU sampler stand in for
    a front end that takes 0.1 of a core while requests are in flight plus 20 ms per request spread
    over each request's life; the probe gives both back as the calibration's front_end_core."""
    import dataclasses

    import pdlab.serve.client.bench as bench
    import pdlab.serve.measure.cpucost as cpucost
    from pdlab.metrics import RequestRecord
    from pdlab.simreal.probes.frontend import probe_front_end_core

    sent: list[list[RequestRecord]] = []

    def fake_bench(url, requests, **kwargs):
        start = 100.0 * (len(sent) + 1)
        life = 0.6
        recs = [RequestRecord(request_id=r.request_id, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                              arrival_s=start + r.arrival_s, first_token_s=start + r.arrival_s + 0.05,
                              finish_s=start + r.arrival_s + life) for r in requests]
        sent.append(recs)
        return bench.BenchResult(recs, {})

    class FakeSampler:
        def __init__(self, pids, *, period_s):
            self.pids, self.period_s, self.samples = list(pids), period_s, []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            recs = sent[-1]
            lo, hi = recs[0].arrival_s - 1.0, max(r.finish_s for r in recs) + 1.0
            grid = np.linspace(lo, hi, 20_000)
            busy, per_req = np.zeros_like(grid), np.zeros_like(grid)
            for r in recs:
                on = (grid >= r.arrival_s) & (grid < r.finish_s)
                busy[on] = 1.0
                per_req[on] += 0.020 / (r.finish_s - r.arrival_s)
            cum = np.concatenate([[0.0], np.cumsum((0.1 * busy + per_req)[1:] * np.diff(grid))])
            self.samples = [(float(t), float(np.interp(t, grid, cum))) for t in np.arange(lo, hi, self.period_s)]

    monkeypatch.setattr(bench, "run_bench", fake_bench)
    monkeypatch.setattr(cpucost, "CPUSampler", FakeSampler)
    share = probe_front_end_core("http://127.0.0.1:9", [4242], rates_rps=(2.0, 6.0), requests_per_rate=60)
    assert share.base_cores == pytest.approx(0.1, abs=0.02)
    assert share.cpu_s_per_request == pytest.approx(0.020, abs=0.004)
    assert share.requests == 120 and share.rate_rps == 4.0 and share.windows >= 20
    assert _calibration(front_end_core=share).terms() == ["front_end_core"]
    with pytest.raises(ValueError, match="front_end_pids is empty"):
        probe_front_end_core("http://127.0.0.1:9", [])
    failed = dataclasses.replace(sent[0][0], ok=False, error="HTTP 500")
    monkeypatch.setattr(bench, "run_bench", lambda url, reqs, **kw: bench.BenchResult([failed], {}))
    with pytest.raises(RuntimeError, match="1 of 1 front-end probe requests"):
        probe_front_end_core("http://127.0.0.1:9", [4242], rates_rps=(2.0,), requests_per_rate=4)


def test_lab05s_saved_calibration_gives_the_labs_predictions_on_the_command_line(tmp_path, capsys):
    """Lab 05 predicts with :func:`pdlab.simreal.predict.predict_blocks` from one engine's probe
    calibration and the link fitted beside it (:func:`~pdlab.simreal.predict.with_link`), and saves
    that calibration; ``pdlab sim run --profile`` with :func:`~pdlab.simreal.predict.sim_run_flags`
    gives the same records for one colocated engine, two replicas round robin and 1P1D, with and
    without the front ends on the engines' cores (the lab's CPU layout)."""
    from pdlab.simreal.predict import predict_blocks, sim_run_flags, two_core_deployments, with_link

    engine = _calibration(prefill_stall=PrefillStall.from_dict({"streams": 4, "fixed_s": 0.001}),
                          front_end_core=CoreShare(base_cores=0.05, cpu_s_per_request=0.01))
    handoff = [{"tokens": n, "ttft_s": 0.03 + ENGINE.decode_time_s([n]) + 0.004 + 2e-6 * n, "samples": 3,
                "prefill_leg_s": 0.03} for n in (32, 512, 1536)]
    path = save_calibration(with_link(engine, handoff), tmp_path / "calibration.json")
    options = dict(kv_capacity_tokens=65536, token_budget=1024, max_num_seqs=64)
    flags = ["--kv-capacity-tokens", "65536", "--token-budget", "1024", "--max-num-seqs", "64"]
    reqs = synthetic_requests(80, LOADED_RPS, **WORKLOAD)
    deployments = {"one engine": Deployment("colocated"), **two_core_deployments(),
                   **{f"{n}, front ends on the engines' cores": d
                      for n, d in two_core_deployments(front_end_shares_core=True).items()}}
    for name, dep in deployments.items():
        printed, recs = _sim_run(path, *sim_run_flags(dep), *flags, tmp_path=tmp_path, capsys=capsys, requests=80)
        lab = predict_blocks({LOADED_RPS: [reqs]}, dep, load_calibration(path), **options)[LOADED_RPS][0]
        assert printed["deployment"] == str(dep), name
        assert [r.as_dict(with_token_times=True) for r in recs] == [r.as_dict(with_token_times=True) for r in lab], name
        assert all(r.ok for r in recs), name
