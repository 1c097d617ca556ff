"""Splitwise pools: cost and power, SLO limits, the cheapest-design search; Nexus split model."""

from __future__ import annotations

import pytest
from pdlab.hardware import get_gpu
from pdlab.sched.pools import (
    PoolDesign,
    SplitwiseSLO,
    cheapest_design,
    evaluate_design,
    nexus_gpu,
    reference_latencies,
)
from pdlab.workloads import synthetic_requests

MODEL = "llama-2-70b"


def test_cost_and_power_from_catalog():
    ha = PoolDesign("h100-sxm", 2, "a100-80gb", 3)
    a, h = get_gpu("a100-80gb"), get_gpu("h100-sxm")
    assert ha.cost_per_hour == pytest.approx(8 * (2 * h.price_per_hour + 3 * a.price_per_hour))
    assert ha.power_w == pytest.approx(8 * (2 * h.tdp_w + 3 * a.tdp_w))
    assert ha.num_gpus == 40 and ha.name == "HA (2P+3T)"
    assert PoolDesign("a100-80gb", 4).name == "Baseline-A (4)"
    with pytest.raises(ValueError):
        PoolDesign("a800", 1)  # no price in the catalog
    with pytest.raises(ValueError):
        PoolDesign("h100-sxm", 1, "a100-80gb", 0)


def test_splitwise_slo_limits():
    slo = SplitwiseSLO(0.1, 0.01, 1.0)
    lim = slo.limits()
    assert lim["ttft_p50_s"] == pytest.approx(0.2) and lim["ttft_p99_s"] == pytest.approx(0.6)
    assert lim["tbt_p90_s"] == pytest.approx(0.015) and lim["e2e_p99_s"] == pytest.approx(5.0)


def test_reference_is_unloaded_a100_and_ha_beats_aa_on_ttft():
    slo = reference_latencies(MODEL, 1020, 129)
    assert 0 < slo.ttft_ref_s < 1 and 0 < slo.tbt_ref_s < 0.1
    reqs = synthetic_requests(120, 10.0, prompt_tokens=1020, output_tokens=129, seed=0)
    aa = evaluate_design(PoolDesign("a100-80gb", 2, "a100-80gb", 1), reqs, MODEL, slo)
    ha = evaluate_design(PoolDesign("h100-sxm", 2, "a100-80gb", 1), reqs, MODEL, slo)
    assert ha["ttft_p50_s"] < aa["ttft_p50_s"] and ha["completed"] == 120
    assert ha["cost_per_hour"] > aa["cost_per_hour"]


def test_cheapest_search_finds_a_feasible_design():
    reqs = synthetic_requests(120, 10.0, prompt_tokens=1020, output_tokens=129, seed=0)
    slo = reference_latencies(MODEL, 1020, 129)
    best, rows = cheapest_design("h100-sxm", "a100-80gb", reqs, MODEL, slo, max_prompt=4, max_token=3)
    assert best is not None and best["slo_met"]
    assert all(best["cost_per_hour"] <= r["cost_per_hour"] for r in rows if r["slo_met"])


def test_nexus_split_model():
    nx = nexus_gpu("h100-sxm", "llama-3-8b")
    assert nx.max_rate(0.0, 2000, 500, 0.05) == 0.0
    x, rate = nx.best_split(2000, 500, 0.05)
    assert 0 < x < 1 and rate >= nx.max_rate(0.5, 2000, 500, 0.05)
    # decode-heavy traffic wants few prefill SMs, prompt-heavy traffic many
    assert nx.best_split(500, 1500, 0.05)[0] < nx.best_split(8000, 300, 0.05)[0]
