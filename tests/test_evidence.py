"""Prefix-cache hit share from two /metrics snapshots (pdlab.serve.measure.evidence), no server."""

from __future__ import annotations

import math

import pytest
from pdlab.serve.measure.evidence import MetricsSnapshot, largest_hit_share, prefix_cache_hit_share


def _snapshot(prompt: float, hit: float, compute: float) -> MetricsSnapshot:
    return MetricsSnapshot.from_text(f"""# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{model_name="m"}} {prompt}
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{{model_name="m",source="local_cache_hit"}} {hit}
vllm:prompt_tokens_by_source_total{{model_name="m",source="local_compute"}} {compute}
""")


def test_hit_share_is_the_difference_of_two_snapshots():
    before, after = _snapshot(1000, 400, 600), _snapshot(3000, 900, 2100)
    assert prefix_cache_hit_share(before, after) == pytest.approx(500 / 2000)


def test_cold_run_has_zero_and_no_traffic_is_nan():
    before = _snapshot(100, 0, 100)
    assert prefix_cache_hit_share(before, _snapshot(600, 0, 600)) == 0.0
    assert math.isnan(prefix_cache_hit_share(before, before))


def test_largest_hit_share_is_the_warmest_server_and_idle_servers_do_not_count():
    before = {"p": _snapshot(100, 0, 100), "d": _snapshot(100, 0, 100), "idle": _snapshot(50, 0, 50)}
    after = {"p": _snapshot(1100, 0, 1100), "d": _snapshot(1100, 300, 800), "idle": _snapshot(50, 0, 50)}
    assert largest_hit_share(before, after) == pytest.approx(0.3)
    assert math.isnan(largest_hit_share({"idle": before["idle"]}, {"idle": after["idle"]}))


def test_kv_capacity_tokens_reads_cache_config_info_labels():
    """num_gpu_blocks × block_size of vllm:cache_config_info; None when absent or not integers."""
    info = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="512"} 1.0\n'
    assert MetricsSnapshot.from_text(info).kv_capacity_tokens() == 8192
    assert MetricsSnapshot.from_text("vllm:num_requests_waiting 3.0\n").kv_capacity_tokens() is None
    bad = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="many"} 1.0\n'
    assert MetricsSnapshot.from_text(bad).kv_capacity_tokens() is None
