"""Prefix-block hash chain, LRU block caches, tiered pool, hit ratios and ``pdlab trace stats``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pdlab.cli import main
from pdlab.kvcache import (
    LRUBlockCache,
    Tier,
    TieredBlockPool,
    cache_hit_ratio,
    chain_hashes,
    hit_ratio_curve,
    local_vs_global_hit_ratio,
    prefix_hit_tokens,
)
from pdlab.paths import data_dir

TRACE = data_dir() / "traces" / "mooncake" / "conversation_trace.jsonl"


def req(prompt_tokens, hash_ids):
    return SimpleNamespace(prompt_tokens=prompt_tokens, hash_ids=list(hash_ids))


def test_hash_chain_matches_up_to_first_mismatch():
    a = list(range(2048))
    b = list(range(1024)) + [9] * 1024
    ka, kb = chain_hashes(a, 512), chain_hashes(b, 512)
    assert len(ka) == 4 and ka[:2] == kb[:2] and ka[2] != kb[2]
    # same block content after a different prefix gets a different key (the chain)
    c = [7] * 512 + list(range(512, 1024))
    assert chain_hashes(c, 512)[1] != ka[1]
    assert chain_hashes(a, 512) == ka  # deterministic
    assert len(chain_hashes(list(range(1000)), 512)) == 2
    assert len(chain_hashes(list(range(1000)), 512, include_partial=False)) == 1
    with pytest.raises(ValueError):
        chain_hashes(a, 0)


def test_prefix_hit_tokens_caps_at_input():
    assert prefix_hit_tokens(3, 2000) == 1536
    assert prefix_hit_tokens(4, 2000) == 2000


def test_lru_evicts_least_recent_and_tails_first():
    c = LRUBlockCache(3)
    assert c.access([1, 2]) == 0
    assert c.access([1, 2]) == 2
    c.access([3])            # order (LRU→MRU): 2, 1, 3
    evicted = c.insert([4])  # 2 goes: the tail of prefix [1, 2] before its head
    assert evicted == [2] and 1 in c and 2 not in c
    assert c.match([1, 2]) == 1
    assert c.match([2, 1]) == 0  # prefix semantics: stops at the first miss
    c.access([1])
    c.insert([5])            # 3 is now least recent
    assert 3 not in c and len(c) == 3 and c.evictions == 2


def test_zero_capacity_caches_nothing():
    c = LRUBlockCache(0)
    c.access([1, 2])
    assert c.access([1, 2]) == 0 and len(c) == 0


def test_hit_ratio_small_stream():
    reqs = [req(1024, [0, 1]), req(1500, [0, 1, 2]), req(600, [0, 5])]
    s = cache_hit_ratio(reqs)
    assert s.hit_tokens == 0 + 1024 + 512 and s.input_tokens == 3124
    assert s.ratio == pytest.approx(1536 / 3124)
    assert cache_hit_ratio(reqs, capacity_blocks=0).ratio == 0
    assert [c for c, _ in hit_ratio_curve(reqs, [1, 10])] == [1, 10]


def test_tiered_pool_demotes_and_promotes():
    pool = TieredBlockPool([Tier("hbm", 2, 1e12), Tier("dram", 2, 1e10), Tier("ssd", None, 1e9)])
    pool.access([1, 2])
    pool.access([3, 4])          # 1, 2 demoted to DRAM
    assert pool.occupancy() == {"hbm": 2, "dram": 2, "ssd": 0}
    assert pool.match([1, 2]) == [1, 1]
    pool.access([5, 6])          # 3, 4 to DRAM, 1, 2 to SSD
    assert pool.match([1, 2, 7]) == [2, 2]
    assert pool.load_time_s([2, 2], 1e9) == pytest.approx(2.0)
    assert pool.access([1]) == [2] and pool.where(1) == 0


def test_local_vs_global():
    reqs = [req(1024, [k % 3, 100 + k % 3]) for k in range(30)]
    local, glob = local_vs_global_hit_ratio(reqs, 3, 10, assignment="round_robin")
    assert glob.ratio > 0.8 and local.ratio <= glob.ratio
    best, _ = local_vs_global_hit_ratio(reqs, 3, 10, assignment="best_match")
    assert best.ratio == pytest.approx(glob.ratio)
    with pytest.raises(ValueError):
        local_vs_global_hit_ratio(reqs, 3, 10, assignment="nope")


def test_local_hit_ratio_of_a_measured_assignment():
    """One instance index per request, as a live router chose them: all of a conversation on one
    instance finds what best_match finds; alternating instances re-prefills each prefix once more."""
    reqs = [req(1024, [k % 2, 100 + k % 2]) for k in range(8)]  # two conversations, interleaved
    affine, glob = local_vs_global_hit_ratio(reqs, 2, None, assignment=[k % 2 for k in range(8)])
    best, _ = local_vs_global_hit_ratio(reqs, 2, None, assignment="best_match")
    assert affine.ratio == pytest.approx(glob.ratio) == pytest.approx(best.ratio) == pytest.approx(6 / 8)
    crossed, _ = local_vs_global_hit_ratio(reqs, 2, None, assignment=[(k // 2) % 2 for k in range(8)])
    assert crossed.ratio == pytest.approx(4 / 8)
    with pytest.raises(ValueError, match="one instance in 0..1 per request"):
        local_vs_global_hit_ratio(reqs, 2, None, assignment=[0, 1, 2, 0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="one instance in 0..1 per request"):
        local_vs_global_hit_ratio(reqs, 2, None, assignment=[0, 1])


def test_trace_stats_conversation(capsys):
    assert main(["trace", "stats", str(TRACE), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["requests"] == 12031
    assert d["avg_input_tokens"] == pytest.approx(12035.1, abs=0.05)
    assert d["avg_output_tokens"] == pytest.approx(342.6, abs=0.05)
    assert d["prefix_cache_hit_ratio"] == pytest.approx(0.374, abs=0.0005)
    assert d["duration_s"] == pytest.approx(3537.0, abs=1)


def test_trace_stats_bounded_cache_is_lower(tmp_path, capsys):
    lines = TRACE.read_text().splitlines()[:500]
    small = tmp_path / "slice.jsonl"
    small.write_text("\n".join(lines) + "\n")
    main(["trace", "stats", str(small), "--json"])
    unlimited = json.loads(capsys.readouterr().out)["prefix_cache_hit_ratio"]
    main(["trace", "stats", str(small), "--cache-blocks", "200", "--json"])
    bounded = json.loads(capsys.readouterr().out)["prefix_cache_hit_ratio"]
    assert 0 <= bounded < unlimited


def test_malformed_line_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
    bad.write_text("\n".join([good, '{"timestamp": 1, "input_length": "x"}', "not json", good]) + "\n")
    assert main(["trace", "stats", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err
    assert main(["trace", "stats", str(bad), "--skip-bad", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["requests"] == 2 and d["skipped_lines"] == 2 and d["skipped_line_numbers"] == [2, 3]
    assert d["prefix_cache_hit_ratio"] == pytest.approx(600 / 1200)  # the repeat reuses all 600 tokens


def test_missing_file_is_a_user_error(tmp_path, capsys):
    assert main(["trace", "stats", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
