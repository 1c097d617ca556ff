"""pdlab.roofline: FLOP and byte counts against hand arithmetic, the CLI, measurement and profiles."""

from __future__ import annotations

import json
import math
import time

import pytest
from pdlab.cli import main
from pdlab.hardware import get_gpu
from pdlab.models import get_model, kv_bytes_per_token, param_counts, weight_bytes
from pdlab.roofline import (
    analyze,
    attainable_flops,
    critical_decode_batch,
    layer_ops,
    list_profiles,
    load_device_profile,
    match_catalog_gpu,
    measure_device,
    model_ops,
    save_device_profile,
)


def _ops(ops):
    return {o.name: o for o in ops}


# --- hand arithmetic: Llama-3-8B (GQA, gated MLP) -------------------------------------------------

def test_llama3_8b_decode_layer_by_hand():
    m = get_model("llama-3-8b")  # h 4096, 32 heads, 8 KV heads, head_dim 128, FFN 14336
    ops = _ops(layer_ops(m, "decode", batch=1, context=1024))
    assert ops["qkv_proj"].flops == 2 * 4096 * (4096 + 2 * 1024)          # 50,331,648
    assert ops["qkv_proj"].weight_bytes == 4096 * 6144 * 2
    assert ops["qkv_proj"].kv_bytes == 2 * 1024 * 2                        # the new token's K and V
    assert ops["attn_qk"].flops == 2 * 32 * 128 * 1024                      # 8,388,608
    assert ops["attn_qk"].kv_bytes == 1024 * 8 * 128 * 2                    # K of 1024 tokens
    assert ops["attn_av"].kv_bytes == 1024 * 8 * 128 * 2                    # V of 1024 tokens
    assert ops["o_proj"].flops == 2 * 4096 * 4096
    assert ops["mlp_up"].flops == 2 * 4096 * 2 * 14336                      # gate + up
    assert ops["mlp_down"].weight_bytes == 14336 * 4096 * 2
    assert ops["mlp_act"].flops == 4 * 14336
    assert ops["attn_norm"].flops == 4 * 4096
    linear_w = sum(o.weight_bytes for o in ops.values() if o.name not in ("attn_norm", "mlp_norm"))
    assert linear_w == 218_103_808 * 2                                      # params per layer × 2 B


def test_llama3_8b_decode_model_bytes_are_weights_plus_kv():
    m = get_model("llama-3-8b")
    r = analyze(m, "h100-sxm", "decode", batch=1, context=1024)
    embedding_table = 128256 * 4096 * 2  # only the token's row is read, not the table
    norms = (2 * 32 + 1) * 4096 * 2
    assert r.weight_bytes == pytest.approx(weight_bytes(m) - embedding_table + norms + 4096 * 2)
    assert r.kv_bytes == kv_bytes_per_token(m) * 1024 + kv_bytes_per_token(m)  # read 1024, write 1
    # FLOPs: 2 × (non-embedding params) + attention 4·L·d·C (FACTS §5)
    body = param_counts(m)["total"] - 128256 * 4096
    attention = 4 * 32 * 4096 * 1024
    assert r.flops == pytest.approx(2 * body + attention, rel=0.001)


def test_llama3_8b_prefill_with_prefix_counts_causal_pairs():
    m = get_model("llama-3-8b")
    ops = _ops(layer_ops(m, "prefill", batch=2, tokens=100, prefix=50))
    pairs = 2 * (100 * 50 + 100 * 101 // 2)  # token i attends to 50 + i keys
    assert ops["attn_qk"].flops == 2 * 32 * 128 * pairs
    assert ops["attn_qk"].kv_bytes == 2 * 150 * 8 * 128 * 2
    assert ops["qkv_proj"].flops == 2 * 200 * 4096 * 6144


# --- hand arithmetic: OPT-13B (multi-head attention, ReLU MLP, tied embeddings) -------------------

def test_opt13b_prefill_layer_by_hand():
    m = get_model("opt-13b")  # h 5120, 40 heads (MHA), head_dim 128, FFN 20480, ungated
    ops = _ops(layer_ops(m, "prefill", batch=2, tokens=100))
    t = 200
    assert ops["qkv_proj"].flops == 2 * t * 5120 * 3 * 5120
    assert ops["attn_qk"].flops == 2 * 40 * 128 * (2 * 100 * 101 / 2)
    assert ops["mlp_up"].flops == 2 * t * 5120 * 20480                      # no gate
    assert ops["mlp_up"].weight_bytes == 5120 * 20480 * 2
    assert ops["mlp_act"].flops == t * 20480                                # ReLU: 1 FLOP per element
    assert ops["mlp_act"].bytes == (t * 20480 + t * 20480) * 2
    assert ops["attn_qk"].kv_bytes == 2 * 100 * 40 * 128 * 2


def test_opt13b_decode_kv_matches_kv_bytes_per_token():
    m = get_model("opt-13b")
    r = analyze(m, "a100-80gb", "decode", batch=4, context=512)
    kv_reads = r.op("attn_qk").kv_bytes + r.op("attn_av").kv_bytes
    assert kv_reads == 4 * 512 * kv_bytes_per_token(m)  # 819,200 B per token (FACTS §5)


# --- tensor parallelism, MoE, MLA ------------------------------------------------------------------

def test_tensor_parallel_divides_work_and_adds_allreduce():
    m = get_model("llama-3-70b")
    one = _ops(layer_ops(m, "decode", batch=8, context=100))
    eight = _ops(layer_ops(m, "decode", batch=8, context=100, tp=8))
    assert eight["mlp_up"].flops == one["mlp_up"].flops / 8
    assert eight["qkv_proj"].weight_bytes == pytest.approx(one["qkv_proj"].weight_bytes / 8)
    assert eight["attn_qk"].kv_bytes == one["attn_qk"].kv_bytes / 8   # 8 KV heads, 1 per GPU
    assert eight["allreduce_attn"].comm_bytes == 2 * 7 / 8 * 8 * 8192 * 2
    r = analyze(m, "h100-sxm", "decode", batch=1, context=1, tp=8)
    assert r.comm_time_s > 0 and r.link_bytes_per_s == get_gpu("h100-sxm").nvlink_bytes_per_s
    # FACTS §5: Llama-70B bf16 on TP8 H100 >= 5.3 ms (all weights / 8 / 3.35 TB/s)
    assert r.time_s == pytest.approx(weight_bytes(m) / 8 / 3.35e12, rel=0.05)
    with pytest.raises(ValueError):
        layer_ops(m, "decode", tp=3)


def test_moe_reads_only_touched_experts():
    m = get_model("mixtral-8x7b")  # 8 experts, top-2
    one = _ops(layer_ops(m, "decode", batch=1, context=10))
    expert_w = 3 * 4096 * 14336 * 2
    assert one["moe_experts"].weight_bytes == pytest.approx(2 * expert_w)
    assert one["moe_experts"].flops == pytest.approx(2 * (2 * 3 * 4096 * 14336 + 4 * 14336))
    many = _ops(layer_ops(m, "decode", batch=256, context=10))
    assert many["moe_experts"].weight_bytes == pytest.approx(8 * expert_w, rel=1e-6)


def test_mla_decode_reads_the_latent_cache():
    m = get_model("deepseek-v3")
    ops = model_ops(m, "decode", batch=1, context=4096)
    kv_read = _ops(ops)["attn_qk"].kv_bytes
    assert kv_read == 4096 * kv_bytes_per_token(m)  # 61 × (512 + 64) × 2 B per token
    assert _ops(ops)["attn_av"].kv_bytes == 0       # the latent is read once, by the fused kernel
    assert "kv_b_proj" in _ops(model_ops(m, "prefill", tokens=16))


# --- the done-when conditions ------------------------------------------------------------------------

def _cli_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_decode_is_memory_bound_at_weights_plus_kv(capsys):
    d = _cli_json(capsys, "roofline", "--gpu", "h100-sxm", "--model", "llama-3-8b", "--phase", "decode",
                  "--batch", "1", "--context", "1024", "--json")
    for key in ("flops", "bytes", "arithmetic_intensity", "ridge_point", "bound", "time_s"):
        assert key in d
    m = get_model("llama-3-8b")
    expected = (weight_bytes(m) + kv_bytes_per_token(m) * 1024) / 3.35e12
    assert d["bound"] == "memory"
    assert d["time_s"] == pytest.approx(expected, rel=0.10)
    assert d["ridge_point"] == pytest.approx(989.4e12 / 3.35e12)


def test_cli_prefill_2048_is_compute_bound(capsys):
    d = _cli_json(capsys, "roofline", "--gpu", "h100-sxm", "--model", "llama-3-8b", "--phase", "prefill",
                  "--tokens", "2048", "--json")
    assert d["bound"] == "compute" and d["arithmetic_intensity"] > d["ridge_point"]
    assert 0.5 < d["mfu"] <= 1.0


def test_cli_bad_input_exits_2(capsys):
    assert main(["roofline", "--gpu", "no-such-gpu", "--model", "llama-3-8b", "--phase", "decode"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert main(["roofline", "--model", "llama-3-8b"]) == 2                      # no --gpu/--phase
    assert main(["roofline", "--gpu", "a100-80gb", "--model", "llama-3-8b", "--phase", "decode",
                 "--dtype", "fp8"]) == 2                                           # A100 has no FP8
    assert main(["roofline", "--gpu", "h100-sxm", "--model", "llama-3-8b", "--phase", "decode",
                 "--batch", "0"]) == 2


def test_critical_decode_batch_h100_llama3_8b():
    ridge = get_gpu("h100-sxm").ridge_point("bf16")
    b = critical_decode_batch("llama-3-8b", "h100-sxm", linear_only=True)
    assert ridge < b < 1.2 * ridge  # napkin: B* ≈ ridge; activations push it a little higher
    short = critical_decode_batch("llama-3-8b", "h100-sxm", context=1)
    long = critical_decode_batch("llama-3-8b", "h100-sxm", context=4096)
    assert short >= b and long is None  # GQA attention (AI ≈ 4) keeps long-context decode memory-bound


def test_attainable_flops_is_the_roofline():
    assert attainable_flops(10, 100.0, 2.0) == 20.0
    assert attainable_flops(1000, 100.0, 2.0) == 100.0


def test_match_catalog_gpu():
    assert match_catalog_gpu("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert match_catalog_gpu("NVIDIA H100 PCIe") == "h100-pcie"
    assert match_catalog_gpu("NVIDIA H200") == "h200"
    assert match_catalog_gpu("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    assert match_catalog_gpu("NVIDIA L40S") == "l40s"
    assert match_catalog_gpu("NVIDIA L4") == "l4"
    assert match_catalog_gpu("Some CPU") is None


# --- measurement on this device ------------------------------------------------------------------------

def _under_roof(profile, slack=1.05):
    for p in profile.layer_points:
        assert p.achieved_flops_per_s <= slack * p.roofline_flops_per_s, p


def test_measure_smoke_profile_roundtrip(tmp_path):
    prof = measure_device("cpu", "smoke")
    assert prof.matmul_flops_per_s["fp32"] > 0 and prof.memory_bytes_per_s > 0
    assert {p.phase for p in prof.layer_points} == {"prefill", "decode"}
    _under_roof(prof)
    path = save_device_profile(prof, tmp_path / "cpu.json")
    text = path.read_text()
    import socket

    assert socket.gethostname() not in text
    again = load_device_profile(path)
    assert again.matmul_flops_per_s == prof.matmul_flops_per_s
    assert again.layer_points[0].time_s == prof.layer_points[0].time_s
    assert list_profiles(tmp_path) == [path] and list_profiles(tmp_path / "none") == []
    # a measured profile stands in for a catalog GPU
    r = analyze(get_model("llama-3-8b"), again, "decode", batch=1, context=16,
                dtype="fp32")
    assert math.isclose(r.bytes_per_s, prof.memory_bytes_per_s) and r.time_s > 0
    with pytest.raises(ValueError):
        again.peak_flops("fp8")


def test_cli_measure_default_within_a_minute(tmp_path, capsys):
    out = tmp_path / "profile.json"
    t0 = time.perf_counter()
    d = _cli_json(capsys, "roofline", "measure", "--device", "cpu", "--out", str(out), "--json")
    elapsed = time.perf_counter() - t0
    assert elapsed < 60, f"measure took {elapsed:.0f} s"
    for key in ("matmul_flops_per_s", "memory_bytes_per_s", "layer_points"):
        assert key in d
    prof = load_device_profile(out)
    _under_roof(prof)
    assert prof.kind == "cpu" and prof.size == "ci"


def test_cli_measure_cuda_without_gpu_exits_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["roofline", "measure", "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
