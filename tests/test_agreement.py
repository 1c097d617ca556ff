"""The client-agreement arithmetic of pdlab.serve.client.agreement, on synthetic records (no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pdlab.metrics import RequestRecord
from pdlab.serve.client.agreement import BURST_GAP_S, ClientSamples, compare_clients, merge_vllm_results


def _record(i: int, ttft: float, step: float, n: int = 5) -> RequestRecord:
    times = [ttft + k * step for k in range(n)]
    return RequestRecord(i, 0.0, 128, n, first_token_s=times[0], finish_s=times[-1], token_times_s=times)


def _vllm(ttfts, step, n=5, burst_first=False):
    itls = [[BURST_GAP_S / 10] * (n - 1) if (burst_first and i == 0) else [step] * (n - 1) for i in range(len(ttfts))]
    lat = [t + sum(g) for t, g in zip(ttfts, itls, strict=True)]
    return {"ttfts": list(ttfts), "itls": itls, "latencies": lat, "output_lens": [n] * len(ttfts),
            "input_lens": [128] * len(ttfts), "completed": len(ttfts), "failed": 0, "seconds": 1.0,
            "command": "vllm bench serve ..."}


def test_same_timings_agree_and_the_interval_holds_one():
    ours = ClientSamples.from_records([_record(i, 0.020 + 0.001 * i, 0.008) for i in range(8)])
    theirs = ClientSamples.from_vllm_result(_vllm([0.020 + 0.001 * i for i in range(8)], 0.008))
    rows = {r["metric"]: r for r in compare_clients(ours, theirs)}
    ttft = rows["median TTFT"]
    assert ttft["pdlab_ms"] == pytest.approx(23.5) and ttft["vllm_bench_ms"] == pytest.approx(23.5)
    assert ttft["rel_diff"] == pytest.approx(0.0) and ttft["ratio_lo"] <= 1.0 <= ttft["ratio_hi"]
    assert rows["median TPOT"]["pdlab_ms"] == pytest.approx(8.0)
    assert rows["median TPOT"]["vllm_bench_ms"] == pytest.approx(8.0)


def test_a_slower_client_is_seen_with_its_bursts():
    ours = ClientSamples.from_records([_record(i, 0.020, 0.008) for i in range(8)])
    theirs = ClientSamples.from_vllm_result(_vllm([0.040] * 8, 0.008, burst_first=True))
    rows = {r["metric"]: r for r in compare_clients(ours, theirs)}
    assert rows["median TTFT"]["rel_diff"] == pytest.approx(0.5)
    assert rows["median TTFT"]["ratio_hi"] == pytest.approx(0.5)
    burst = next(r for r in rows.values() if r["metric"].startswith("burst"))
    assert burst["pdlab_ms"] == 0.0 and burst["vllm_bench_ms"] == pytest.approx(1 / 8)


def test_merged_vllm_runs_recompute_the_medians():
    a, b = _vllm([0.010, 0.012], 0.005), _vllm([0.030, 0.032, 0.034], 0.005)
    merged = merge_vllm_results([a, b])
    assert merged["completed"] == 5 and merged["runs"] == 2 and len(merged["ttfts"]) == 5
    assert merged["median_ttft_ms"] == pytest.approx(30.0)
    assert merged["median_tpot_ms"] == pytest.approx(5.0)


def test_requests_with_one_token_have_no_tpot():
    r = RequestRecord(0, 0.0, 16, 1, first_token_s=0.01, finish_s=0.01, token_times_s=[0.01])
    s = ClientSamples.from_records([r])
    assert s.tpot_s.size == 0 and math.isnan(s.burst_share) and s.ttft_s.tolist() == [0.01]
    assert np.isnan(compare_clients(s, s)[1]["pdlab_ms"])


def test_vllm_bench_serve_is_asked_for_pdlab_bench_sampling():
    """vLLM 0.32's ``vllm bench serve`` sends no temperature unless told (the server's default then
    samples at random); the agreement check passes pdlab bench's own, so both time the same work."""
    from pdlab.serve.client.agreement import PDLAB_TEMPERATURE, _vllm_bench_argv
    from pdlab.serve.client.bench import ClientOptions

    assert PDLAB_TEMPERATURE == ClientOptions().payload("m", "p", 4)["temperature"] == 0.0
    kw = dict(model="m", tokenizer="t", input_len=8, output_len=4, num_prompts=2, rate_rps=None,
              max_concurrency=1, seed=0, warmups=0, name="argv-test")
    argv, _ = _vllm_bench_argv("http://127.0.0.1:1", **kw)
    assert argv[argv.index("--temperature") + 1] == "0"
    argv, _ = _vllm_bench_argv("http://127.0.0.1:1", temperature=None, **kw)
    assert "--temperature" not in argv
