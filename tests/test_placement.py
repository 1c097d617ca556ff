"""pdlab.sched.placement: binary search on rate, config enumeration, Alg. 1 and Alg. 2 on small cases."""

import pytest
from pdlab.metrics import SLO
from pdlab.sched.placement import (
    ParallelConfig,
    SearchSettings,
    enumerate_configs,
    fits,
    make_env,
    max_rate,
    place,
)

TINY = SearchSettings(requests=40, bisect_steps=3, min_duration_s=5.0, max_requests=120)


def test_binary_search_finds_the_threshold():
    settings = SearchSettings(bisect_steps=12, start_rate_rps=1.0)
    assert max_rate(lambda r: 1.0 if r <= 6.3 else 0.5, 0.9, settings) == pytest.approx(6.3, rel=0.01)
    assert max_rate(lambda r: 1.0 if r <= 0.2 else 0.0, 0.9, settings) == pytest.approx(0.2, rel=0.01)
    assert max_rate(lambda r: 0.0, 0.9, SearchSettings(max_doublings=4)) == 0.0


def test_enumeration_respects_memory_heads_and_layers():
    cfgs = enumerate_configs("opt-66b", "a100-80gb", 8, max_tp=8)
    assert ParallelConfig(1, 1) not in cfgs                      # 131 GB of weights on one 80 GB GPU
    assert ParallelConfig(4, 2) in cfgs and all(c.num_gpus <= 8 for c in cfgs)
    assert all(72 % c.tp == 0 and 64 % c.pp == 0 for c in cfgs)


def test_high_affinity_small_cluster():
    p = place("opt-13b", "a100-80gb", 1, 2, "fixed-512-64", SLO(ttft_s=0.4, tpot_s=0.06), settings=TINY, workers=1)
    assert p.num_prefill >= 1 and p.num_decode >= 1 and p.total_gpus <= 2
    assert p.per_gpu_goodput_rps == pytest.approx(p.cluster_goodput_rps / p.total_gpus)
    assert {c.phase for c in p.candidates} == {"prefill", "decode"}


def test_cross_node_bandwidth_caps_the_rate():
    free = place("opt-13b", "a100-80gb", 1, 2, "fixed-512-64", SLO(0.4, 0.06), settings=TINY, workers=1)
    slow = place("opt-13b", "a100-80gb", 1, 2, "fixed-512-64", SLO(0.4, 0.06), settings=TINY, workers=1,
                 cross_node_bytes_per_s=0.5e9)
    assert slow.cluster_goodput_rps < free.cluster_goodput_rps
    assert slow.kv_bandwidth_needed_bytes_per_s <= 0.5e9 * 1 + 1


def test_low_affinity_pairs_share_a_node():
    p = place("opt-13b", "a100-80gb", 1, 2, "fixed-512-64", SLO(0.4, 0.06), affinity="low", settings=TINY,
              workers=1)
    assert p.prefill.pp == p.decode.pp and p.total_gpus <= 2
    assert all(c.phase == "pair" for c in p.candidates)


def test_invalid_inputs():
    with pytest.raises(ValueError, match="TTFT and a TPOT"):
        place("opt-13b", "a100-80gb", 1, 2, "sharegpt", SLO(ttft_s=0.2), settings=TINY, workers=1)
    with pytest.raises(ValueError, match="affinity"):
        place("opt-13b", "a100-80gb", 1, 2, "sharegpt", SLO(0.2, 0.1), affinity="mid")


def test_cli_place_json(capsys):
    import json

    from pdlab.cli import main

    args = ["place", "--model", "opt-13b", "--gpu", "a100-80gb", "--nodes", "1", "--gpus-per-node", "2",
            "--workload", "fixed-512-64", "--slo-ttft", "0.4", "--slo-tpot", "0.06", "--profile", "smoke",
            "--workers", "1", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("prefill", "decode", "num_prefill", "num_decode", "per_gpu_goodput_rps", "candidates"):
        assert key in out
    assert out["per_gpu_goodput_rps"] == pytest.approx(out["cluster_goodput_rps"] / out["total_gpus"])
    assert out["total_gpus"] == out["num_prefill"] * out["prefill"]["tp"] * out["prefill"]["pp"] \
        + out["num_decode"] * out["decode"]["tp"] * out["decode"]["pp"] <= 2
    assert out["settings"]["dtype"] == "bf16" and out["kv_bandwidth_needed_bytes_per_s"] > 0
    assert main(args[:-1] + ["--attainment", "1.5"]) == 2
    assert main(["place", "--model", "opt-13b", "--gpu", "a100-80gb", "--nodes", "1", "--gpus-per-node", "2",
                 "--workload", "nope", "--slo-ttft", "0.4", "--slo-tpot", "0.06", "--workers", "1"]) == 2


# ---------------------------------------------------------------- values a reader can derive by hand
def test_kv_bytes_per_token_is_2_layers_kv_heads_head_dim_dtype_bytes():
    from pdlab.models import get_model, kv_bytes_per_token

    # opt-13b: 40 layers, 40 KV heads (MHA), head_dim 128; llama-3-8b: 32 layers, 8 KV heads (GQA), 128
    opt = get_model("opt-13b")
    assert (opt.num_layers, opt.num_kv_heads, opt.head_dim) == (40, 40, 128)
    assert kv_bytes_per_token(opt, "bf16") == 2 * 40 * 40 * 128 * 2 == 819_200
    assert kv_bytes_per_token(opt, "fp8") == 2 * 40 * 40 * 128 * 1 == 409_600
    assert kv_bytes_per_token(get_model("llama-3-8b"), "bf16") == 2 * 32 * 8 * 128 * 2 == 131_072
    env = make_env("opt-13b", "a100-80gb", "fixed-512-64", SLO(0.4, 0.06))
    assert env.dtype == "bf16" and env.kv_bytes_per_token == 819_200
    assert make_env("opt-13b", "a100-80gb", "fixed-512-64", SLO(0.4, 0.06), dtype="fp8").kv_bytes_per_token \
        == 819_200 // 2


def test_fp8_halves_the_bytes_and_changes_what_fits():
    from pdlab.models import get_model, weight_bytes

    m = get_model("opt-66b")
    # one A100 at 0.9 utilisation holds 72 GB: 131.4 GB of bf16 weights do not fit, 65.7 GB of fp8 do,
    # with 72 − 65.7 = 6.3 GB left ≥ 2,048 tokens × 1,179,648 B = 2.4 GB of fp8 KV
    assert weight_bytes(m, "fp8") == pytest.approx(weight_bytes(m, "bf16") / 2)
    assert not fits(m, "a100-80gb", ParallelConfig(1, 1), dtype="bf16")
    assert fits(m, "a100-80gb", ParallelConfig(1, 1), dtype="fp8")
    assert enumerate_configs(m, "a100-80gb", 2, max_tp=2) == [ParallelConfig(1, 2), ParallelConfig(2, 1)]
    assert enumerate_configs(m, "a100-80gb", 2, max_tp=2, dtype="fp8") == \
        [ParallelConfig(1, 1), ParallelConfig(1, 2), ParallelConfig(2, 1)]
    # the same room at half the memory utilisation: 36 GB no longer holds the fp8 weights
    assert not fits(m, "a100-80gb", ParallelConfig(1, 1), dtype="fp8", memory_utilization=0.45)


def _scripted_goodputs(monkeypatch):
    """Replace the simulated searches with fixed goodputs: TP1×PP1 prefill 3 req/s, TP1×PP1 decode
    2 req/s, every other configuration 0.25 req/s per GPU (never the best)."""
    from pdlab.sched import placement

    def pre(env, cfg):
        g = 3.0 if cfg == ParallelConfig(1, 1) else 0.25 * cfg.num_gpus
        return placement.PhaseGoodput("prefill", cfg, None, cfg.num_gpus, g, g / cfg.num_gpus)

    def dec(env, cfg):
        g = 2.0 if cfg == ParallelConfig(1, 1) else 0.25 * cfg.num_gpus
        return placement.PhaseGoodput("decode", None, cfg, cfg.num_gpus, g, g / cfg.num_gpus)

    monkeypatch.setattr(placement, "prefill_goodput", pre)
    monkeypatch.setattr(placement, "decode_goodput", dec)


def test_alg1_fills_the_cluster_with_the_best_n_m(monkeypatch):
    _scripted_goodputs(monkeypatch)
    slo = SLO(0.4, 0.06)
    # 4 GPUs, one GPU per instance: (n, m) = (1, 3) → min(3, 6) = 3; (2, 2) → min(6, 4) = 4; (3, 1) → 2
    p = place("opt-13b", "a100-80gb", 1, 4, "fixed-512-64", slo, workers=1)
    assert (p.prefill, p.decode, p.num_prefill, p.num_decode) == (ParallelConfig(1, 1), ParallelConfig(1, 1), 2, 2)
    assert (p.prefill_goodput_rps, p.decode_goodput_rps) == (3.0, 2.0)
    assert (p.total_gpus, p.cluster_goodput_rps, p.per_gpu_goodput_rps) == (4, 4.0, 1.0)
    # KV the chosen rate moves: 4 req/s × 512 prompt tokens × 819,200 B (opt-13b, bf16)
    assert p.kv_bandwidth_needed_bytes_per_s == pytest.approx(4.0 * 512 * 819_200)
    assert not p.bandwidth_limited and p.cross_node_bytes_per_s is None
    # 6 prefill + 6 decode configurations were searched
    assert sum(c.phase == "prefill" for c in p.candidates) == sum(c.phase == "decode" for c in p.candidates) == 6


def test_alg1_with_a_target_rate_takes_ceil_r_over_g(monkeypatch):
    _scripted_goodputs(monkeypatch)
    p = place("opt-13b", "a100-80gb", 1, 4, "fixed-512-64", SLO(0.4, 0.06), workers=1, rate_rps=3.0)
    # n = ⌈3/3⌉ = 1, m = ⌈3/2⌉ = 2 on 3 GPUs; the cluster serves min(3, 1·3, 2·2) = 3 req/s
    assert (p.num_prefill, p.num_decode, p.total_gpus) == (1, 2, 3)
    assert p.cluster_goodput_rps == 3.0 and p.per_gpu_goodput_rps == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no prefill \\+ decode configuration"):
        # ⌈5/3⌉ + ⌈5/2⌉ = 5 GPUs > 4 with the best pair, and every other pair needs more
        place("opt-13b", "a100-80gb", 1, 4, "fixed-512-64", SLO(0.4, 0.06), workers=1, rate_rps=5.0)


def test_alg1_bandwidth_cap_and_the_dtype_path(monkeypatch):
    _scripted_goodputs(monkeypatch)
    slo = SLO(0.4, 0.06)
    need_bf16 = 4.0 * 512 * 819_200                       # 1.68 GB/s at the uncapped 4 req/s
    p = place("opt-13b", "a100-80gb", 1, 4, "fixed-512-64", slo, workers=1, cross_node_bytes_per_s=1e9)
    assert p.bandwidth_limited and p.kv_bandwidth_needed_bytes_per_s == pytest.approx(1e9)
    assert p.cluster_goodput_rps == pytest.approx(4.0 * 1e9 / need_bf16)    # 2.38 req/s
    assert p.per_gpu_goodput_rps == pytest.approx(p.cluster_goodput_rps / 4)
    # fp8 KV halves the bytes per token: 0.84 GB/s fits under the same 1 GB/s link
    q = place("opt-13b", "a100-80gb", 1, 4, "fixed-512-64", slo, workers=1, cross_node_bytes_per_s=1e9,
              dtype="fp8")
    assert not q.bandwidth_limited and q.cluster_goodput_rps == 4.0
    assert q.kv_bandwidth_needed_bytes_per_s == pytest.approx(need_bf16 / 2)
    assert q.settings["dtype"] == "fp8" and p.settings["dtype"] == "bf16"
