"""pdlab.peers.dynamo_compare: settings conversion to Dynamo's replay, the profile tables, the side-by-side
table; and one real Dynamo replay on a slice of the Mooncake trace when .venv-peers exists."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pdlab import peers
from pdlab.peers.dynamo_compare import PeerSettings
from pdlab.sim import ConstantLatency, FittedLatency

FITTED = FittedLatency(prefill=(0.01, 2e-5, 1e-9), decode=(0.008, 1e-7, 2e-4))


def test_profile_tables_hold_the_model_at_grid_points():
    a = peers.dynamo_profile_arrays(FITTED, max_prefill_tokens=20000, max_kv_tokens=400000, max_context=30000,
                                    max_batch=256, points=24)
    assert set(a) == {"prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length",
                      "decode_itl"}
    for name in ("prefill_isl", "decode_active_kv_tokens", "decode_context_length"):
        assert np.all(np.diff(a[name]) > 0), name  # Dynamo's interpolators need increasing axes
    assert a["prefill_isl"][0] == 1 and a["prefill_isl"][-1] == 20000
    for n, ms in zip(a["prefill_isl"], a["prefill_ttft_ms"], strict=True):
        assert ms == pytest.approx(FITTED.prefill_time_s([int(n)]) * 1e3)
    assert a["decode_itl"].shape == (a["decode_active_kv_tokens"].size, a["decode_context_length"].size)
    i, j = 10, 12
    x, y = a["decode_active_kv_tokens"][i], a["decode_context_length"][j]
    b = min(max(round(x / y), 1), 256)
    assert a["decode_itl"][i, j] == pytest.approx(FITTED.step_time_s(0, 0.0, b, int(min(x, b * y))) * 1e3)


def test_profile_tables_reject_bad_ranges():
    with pytest.raises(ValueError, match="max_kv_tokens"):
        peers.dynamo_profile_arrays(FITTED, max_prefill_tokens=10, max_kv_tokens=0, max_context=10, max_batch=1)
    with pytest.raises(ValueError, match="points"):
        peers.dynamo_profile_arrays(FITTED, max_prefill_tokens=10, max_kv_tokens=10, max_context=10, max_batch=1,
                                    points=1)


def test_written_profile_is_dynamos_npz(tmp_path):
    s = PeerSettings()
    path = peers.write_dynamo_profile(s, tmp_path / "p.npz", max_context=5000)
    with np.load(path) as z:
        assert z["decode_itl"].dtype == np.float64
        assert z["decode_active_kv_tokens"][-1] == s.kv_capacity_tokens()
        assert z["prefill_isl"][-1] == s.max_batched_tokens  # the longer of budget and context


def test_engine_args_carry_the_matched_settings(tmp_path):
    s = PeerSettings(mode="disaggregated", block_tokens=64, max_num_seqs=128, max_batched_tokens=4096)
    kw = peers.dynamo_replay_kwargs(s, tmp_path / "p.npz")
    assert (kw["num_prefill_workers"], kw["num_decode_workers"], kw["router_mode"]) == (4, 4, "round_robin")
    assert kw["trace_block_size"] == 64
    eng = kw["prefill_engine_args"]["engine"]
    assert eng["worker_type"] == "prefill" and kw["decode_engine_args"]["engine"]["worker_type"] == "decode"
    assert eng["num_gpu_blocks"] * 64 == s.kv_capacity_tokens()
    assert (eng["max_num_seqs"], eng["max_num_batched_tokens"], eng["block_size"]) == (128, 4096, 64)
    assert eng["kv_transfer_bandwidth"] == pytest.approx(50.0)  # ib-ndr, decimal GB/s
    assert eng["kv_transfer_bytes_per_token"] == 327680  # Llama-3-70B bf16: 2 x 80 layers x 8 x 128 x 2 B
    assert eng["timing_model"]["config"]["path"] == str(tmp_path / "p.npz")
    agg = peers.dynamo_replay_kwargs(PeerSettings(), "x.npz")
    assert agg["num_workers"] == 8 and "kv_transfer_bandwidth" not in agg["extra_engine_args"]["engine"]
    json.dumps(kw)  # crosses the process boundary as JSON
    with pytest.raises(ValueError, match="role"):
        peers.dynamo_engine_args(s, "x.npz", "both")


def test_settings_validate():
    with pytest.raises(ValueError, match="mode"):
        PeerSettings(mode="chunked")
    with pytest.raises(ValueError, match="max_num_seqs"):
        PeerSettings(max_num_seqs=0)
    assert PeerSettings(block_tokens=512).kv_capacity_tokens() % 512 == 0


def test_dynamo_metrics_converts_ms_to_s():
    summary = {"wall_time_ms": 2500.0, "num_requests": 10, "completed_requests": 9, "prefix_cache_reused_ratio": 0.1}
    for k in ("ttft", "tpot", "itl"):
        summary[f"median_{k}_ms"], summary[f"p90_{k}_ms"] = 100.0, 300.0
    m = peers.dynamo_metrics({"summary": summary, "outer_wall_s": 3.0})
    assert m["wall_s"] == 2.5 and m["ttft_p50_s"] == 0.1 and m["itl_p90_s"] == 0.3 and m["completed"] == 9


def _result(wall, scale):
    return {"wall_s": wall, "prefix_hit_share": 0.05} | {m: 0.1 * scale for m in peers.METRICS}


def test_table_ratio_and_disagreements():
    rows = peers.compare_rows(_result(0.5, 1.3), _result(5.0, 1.0))
    assert rows[0]["ratio"] == pytest.approx(10.0)  # Dynamo wall / pdlab wall
    assert {r["metric"]: r["ratio"] for r in rows}["ttft_p50_s"] == pytest.approx(0.3)
    dis = dict(peers.disagreements(rows, "colocated"))
    assert set(dis) == set(peers.METRICS)
    assert "hand-off" not in dis["ttft_p50_s"] and "prefill attention" in dis["ttft_p50_s"]
    assert "hand-off" in dict(peers.disagreements(rows, "disaggregated"))["ttft_p50_s"]
    assert peers.disagreements(peers.compare_rows(_result(0.5, 1.1), _result(5.0, 1.0)), "colocated") == []
    nan = peers.compare_rows(_result(0.5, 1.0), _result(5.0, 0.0))  # Dynamo 0 → NaN, reported as a disagreement
    assert len(peers.disagreements(nan, "colocated")) == len(peers.METRICS)
    text = peers.format_table("t", rows)
    assert "pdlab 10.0x faster" in text and "+30%" in text
    with pytest.raises(ValueError, match="mode"):
        peers.disagreements(rows, "chunked")


def test_chunked_prefill_pricing_gap():
    lat = PeerSettings().latency()
    one = peers.chunked_prefill_s(lat, 8192, 8192)
    assert one[0] == pytest.approx(one[1])  # one chunk: the same question, the same answer
    ours, theirs = peers.chunked_prefill_s(lat, 65536, 8192)
    assert ours > theirs * 1.2  # later chunks attend to earlier ones in pdlab only
    flat = ConstantLatency(prefill_s=0.1)
    assert peers.chunked_prefill_s(flat, 100, 30) == pytest.approx((0.4, 0.4))
    with pytest.raises(ValueError):
        peers.chunked_prefill_s(lat, 0, 10)


def test_trace_slice(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"timestamp": i, "input_length": 10, "output_length": 2, "hash_ids": [i]})
                           + "\n" for i in range(5)))
    out = peers.write_trace_slice(src, tmp_path / "s.jsonl", 3)
    assert len(out.read_text().splitlines()) == 3
    with pytest.raises(ValueError, match="limit"):
        peers.write_trace_slice(src, tmp_path / "s.jsonl", 0)


def test_run_dynamo_without_peers_env_says_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="install_peers.sh"):
        peers.run_dynamo(tmp_path / "t.jsonl", PeerSettings(), tmp_path, python=tmp_path / "no-python")


def test_runner_rejects_a_bad_request():
    runner = Path(peers.__file__).with_name("dynamo_replay.py")
    proc = subprocess.run([sys.executable, str(runner)], input="not json", capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "bad request" in proc.stderr


@pytest.mark.skipif(peers.peers_python() is None, reason="no .venv-peers (scripts/install_peers.sh installs Dynamo)")
@pytest.mark.parametrize("mode", peers.PEER_MODES)
def test_real_dynamo_replay_on_a_slice(tmp_path, mode):
    from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl

    trace = peers.write_trace_slice(mooncake_trace_path("conversation"), tmp_path / "slice.jsonl", 300)
    s = PeerSettings(mode=mode)
    ours, theirs = peers.run_pdlab(read_mooncake_jsonl(trace), s), peers.run_dynamo(trace, s, tmp_path)
    assert ours["completed"] == theirs["completed"] == 300
    assert theirs["wall_s"] > 0 and theirs["dynamo_version"] == "1.6.1"
    assert abs(ours["prefix_hit_share"] - theirs["prefix_hit_share"]) < 0.02  # same blocks, same reuse
    # The converted decode table: Dynamo's median token gap is our roofline's, not its default model's.
    assert ours["itl_p50_s"] == pytest.approx(theirs["itl_p50_s"], rel=0.1)
    assert math.isfinite(theirs["ttft_p90_s"])


def test_prefill_busy_fraction():
    from pdlab.workloads import Request

    reqs = [Request(i, float(i), 100, 2) for i in range(11)]  # 10 s span
    flat = ConstantLatency(prefill_s=0.1)
    assert peers.prefill_busy_fraction(reqs, flat, 2, 30) == pytest.approx((11 * 0.4 / 2 / 10,) * 2)
    long = [Request(i, float(i), 40000, 2) for i in range(11)]
    ours, theirs = peers.prefill_busy_fraction(long, PeerSettings().latency(), 1, 8192)
    assert ours > theirs  # chunks after earlier ones cost more attention in pdlab
    with pytest.raises(ValueError, match="workers"):
        peers.prefill_busy_fraction(reqs, flat, 0, 30)
    with pytest.raises(ValueError, match="instant"):
        peers.prefill_busy_fraction(reqs[:1], flat, 1, 30)
