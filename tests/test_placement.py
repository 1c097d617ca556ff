"""pdlab.sched.placement: binary search on rate, config enumeration, Alg. 1 and Alg. 2 on small cases."""

import pytest
from pdlab.metrics import SLO
from pdlab.sched.placement import ParallelConfig, SearchSettings, enumerate_configs, max_rate, place

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
    assert main(args[:-1] + ["--attainment", "1.5"]) == 2
    assert main(["place", "--model", "opt-13b", "--gpu", "a100-80gb", "--nodes", "1", "--gpus-per-node", "2",
                 "--workload", "nope", "--slo-ttft", "0.4", "--slo-tpot", "0.06", "--workers", "1"]) == 2
