"""pdlab.metrics: vLLM-bench definitions of TTFT/TPOT/ITL/E2E, attainment and goodput."""

import math

import pytest
from pdlab.metrics import (
    SLO,
    RequestRecord,
    attainment_curve,
    goodput_rps,
    itl_s,
    meets_slo,
    per_gpu_goodput_rps,
    percentiles,
    slo_attainment,
    summarize,
    tpot_s,
    ttft_s,
)


def rec(i, arrival, first, finish, out, times=None, ok=True):
    return RequestRecord(i, arrival, 100, out, first, finish, times, ok=ok, error="" if ok else "boom")


def test_definitions_match_vllm_bench():
    r = rec(0, 1.0, 1.5, 3.5, 5, times=[1.5, 2.0, 2.5, 3.0, 3.5])
    assert r.ttft_s == pytest.approx(0.5)
    assert r.e2e_s == pytest.approx(2.5)
    assert r.tpot_s == pytest.approx((2.5 - 0.5) / 4)      # (E2E − TTFT) / (out − 1)
    assert list(itl_s([r])) == pytest.approx([0.5] * 4)


def test_one_token_output_has_no_tpot_but_passes_tpot_slo():
    r = rec(0, 0.0, 0.2, 0.2, 1)
    assert r.tpot_s is None and tpot_s([r]).size == 0
    assert meets_slo(r, SLO(ttft_s=0.3, tpot_s=0.01))


def test_attainment_counts_failures_goodput_uses_duration():
    records = [rec(0, 0.0, 0.1, 1.0, 10), rec(1, 1.0, 1.9, 3.0, 10), rec(2, 2.0, None, None, 10, ok=False),
               rec(3, 3.0, 3.1, 4.0, 10)]
    slo = SLO(ttft_s=0.5, tpot_s=0.2)
    assert slo_attainment(records, slo) == pytest.approx(0.5)   # 2 of 4; the failed one counts as a miss
    assert goodput_rps(records, slo) == pytest.approx(2 / 4.0)  # first arrival 0 → last finish 4
    assert per_gpu_goodput_rps(2.0, 4) == 0.5
    assert ttft_s(records).size == 3


def test_percentiles_and_summary_keys():
    assert percentiles([1, 2, 3, 4, 5], (50, 100)) == {"p50": 3.0, "p100": 5.0}
    assert math.isnan(percentiles([], (50,))["p50"])
    s = summarize([rec(0, 0.0, 0.1, 1.0, 10)], SLO(ttft_s=1), num_gpus=2)
    for key in ("ttft_p50_s", "tpot_p99_s", "e2e_mean_s", "slo_attainment", "goodput_rps", "per_gpu_goodput_rps"):
        assert key in s


@pytest.mark.parametrize("bad", [dict(ttft_s=0), dict(tpot_s=-1), dict(ttft_s=float("nan")), dict(e2e_s="1"), {}])
def test_invalid_slo_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="SLO"):
        SLO(**bad)


def test_attainment_curve_is_monotone():
    records = [rec(i, float(i), i + 0.1 * i, i + 5.0, 10) for i in range(10)]
    curve = attainment_curve(records, "ttft", [0.05, 0.3, 1.0])
    assert list(curve) == sorted(curve) and curve[-1] == 1.0
    with pytest.raises(ValueError):
        attainment_curve(records, "bogus", [1.0])
