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


def _four():
    """Three finished requests and one failure; every derived number below is worked out by hand.

    id  arrival  first  finish  out  TTFT  TPOT            E2E  ITL
    0   0.0      0.2    1.0     5    0.2   0.8/4 = 0.2     1.0  0.2 0.2 0.2 0.2
    1   1.0      1.4    2.0     3    0.4   0.6/2 = 0.3     1.0  0.3 0.3
    2   2.0      2.6    4.0     2    0.6   1.4/1 = 1.4     2.0  1.4
    3   3.0      failed
    Duration: first arrival 0.0 → last finish 4.0 = 4.0 s.
    """
    return [rec(0, 0.0, 0.2, 1.0, 5, times=[0.2, 0.4, 0.6, 0.8, 1.0]),
            rec(1, 1.0, 1.4, 2.0, 3, times=[1.4, 1.7, 2.0]),
            rec(2, 2.0, 2.6, 4.0, 2, times=[2.6, 4.0]),
            rec(3, 3.0, None, None, 4, ok=False)]


def test_summary_values_by_hand():
    # numpy's linear percentile of n sorted values: index p/100·(n − 1), interpolated
    s = summarize(_four(), SLO(ttft_s=0.5, tpot_s=0.25), num_gpus=2)
    expected = {
        "requests": 4, "completed": 3, "failed": 1, "duration_s": 4.0,
        "request_throughput_rps": 3 / 4.0, "output_token_throughput_tps": (5 + 3 + 2) / 4.0,
        # TTFT 0.2, 0.4, 0.6: p90 at index 1.8 = 0.4 + 0.8·0.2; p99 at 1.98 = 0.4 + 0.98·0.2
        "ttft_mean_s": 0.4, "ttft_p50_s": 0.4, "ttft_p90_s": 0.56, "ttft_p99_s": 0.596,
        # TPOT 0.2, 0.3, 1.4: p90 = 0.3 + 0.8·1.1
        "tpot_mean_s": 1.9 / 3, "tpot_p50_s": 0.3, "tpot_p90_s": 1.18,
        # ITL pooled: 0.2 ×4, 0.3 ×2, 1.4 (7 gaps, sum 2.8); p90 at index 5.4 = 0.3 + 0.4·1.1
        "itl_mean_s": 2.8 / 7, "itl_p50_s": 0.2, "itl_p90_s": 0.74,
        # E2E 1.0, 1.0, 2.0: p90 = 1.0 + 0.8·1.0
        "e2e_mean_s": 4 / 3, "e2e_p50_s": 1.0, "e2e_p90_s": 1.8,
        # only request 0 meets TTFT ≤ 0.5 and TPOT ≤ 0.25 (1 breaks TPOT, 2 both, 3 failed)
        "slo_attainment": 1 / 4, "goodput_rps": 1 / 4.0, "per_gpu_goodput_rps": 1 / 4.0 / 2,
    }
    for key, value in expected.items():
        assert s[key] == pytest.approx(value), key


def test_summary_without_slo_has_no_attainment_and_nan_when_nothing_finished():
    s = summarize(_four())
    assert "slo_attainment" not in s and "goodput_rps" not in s and "per_gpu_goodput_rps" not in s
    empty = summarize([rec(0, 0.0, None, None, 3, ok=False)], SLO(ttft_s=1.0), num_gpus=1)
    assert (empty["completed"], empty["failed"], empty["slo_attainment"]) == (0, 1, 0.0)
    for key in ("duration_s", "request_throughput_rps", "ttft_mean_s", "ttft_p50_s", "goodput_rps"):
        assert math.isnan(empty[key]), key


def test_e2e_slo_is_checked_inclusive_of_the_bound():
    records = _four()
    # E2E 1.0, 1.0, 2.0, failed: ≤ 1.0 passes (the check is "> slo fails")
    assert [meets_slo(r, SLO(e2e_s=1.0)) for r in records] == [True, True, False, False]
    assert slo_attainment(records, SLO(e2e_s=1.5)) == pytest.approx(2 / 4)
    assert slo_attainment(records, SLO(e2e_s=2.0)) == pytest.approx(3 / 4)
    # request 2 meets TTFT (0.6 ≤ 1.0) but not E2E (2.0 > 1.5): the E2E objective alone rejects it
    assert slo_attainment(records, SLO(ttft_s=1.0)) == pytest.approx(3 / 4)
    assert slo_attainment(records, SLO(ttft_s=1.0, e2e_s=1.5)) == pytest.approx(2 / 4)
    assert list(attainment_curve(records, "e2e", [0.5, 1.0, 2.0])) == pytest.approx([0.0, 0.5, 0.75])
    assert math.isnan(slo_attainment([], SLO(e2e_s=1.0)))


def test_goodput_with_an_explicit_duration():
    records = _four()
    slo = SLO(e2e_s=1.5)                                           # requests 0 and 1 meet it
    assert goodput_rps(records, slo) == pytest.approx(2 / 4.0)     # default: first arrival → last finish
    assert goodput_rps(records, slo, duration_s=10.0) == pytest.approx(2 / 10.0)
    assert goodput_rps(records, slo, duration_s=0.5) == pytest.approx(2 / 0.5)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert math.isnan(goodput_rps(records, slo, duration_s=bad)), bad
    assert math.isnan(goodput_rps([rec(0, 0.0, None, None, 3, ok=False)], slo))  # nothing finished: no duration
    with pytest.raises(ValueError, match="num_gpus"):
        per_gpu_goodput_rps(1.0, 0)


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


def test_records_round_trip_with_token_times_and_chunk_sizes(tmp_path):
    """write_records/read_records keep token times and the tokens each chunk held; a bad line is named."""
    from pdlab.metrics import RequestRecord, read_records, write_records

    live = RequestRecord(0, 0.0, 8, 4, 0.1, 0.3, token_times_s=[0.1, 0.2, 0.3], chunk_tokens=[1, 2, 1])
    sim = RequestRecord(1, 0.0, 8, 2, 0.1, 0.2, token_times_s=[0.1, 0.2])
    path = write_records([live, sim], tmp_path / "r.jsonl")
    assert read_records(path) == [live, sim]
    assert "chunk_tokens" not in live.as_dict() and live.as_dict(with_token_times=True)["chunk_tokens"] == [1, 2, 1]
    path.write_text(path.read_text() + "not json\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:3: not a request record"):
        read_records(path)


def test_block_medians_of_consecutive_slices_in_arrival_order():
    from pdlab.metrics import block_medians

    recs = [RequestRecord(i, arrival_s=float(9 - i), prompt_tokens=1, output_tokens=3, first_token_s=9.0 - i + 0.1,
                          finish_s=9.0 - i + 0.1 + 2 * (0.01 if i >= 5 else 0.02)) for i in range(10)]
    # arrival order is i = 9..0: the first five (i >= 5) step every 10 ms, the last five every 20 ms
    assert block_medians(recs, 2) == pytest.approx([0.01, 0.02])
    assert block_medians(recs, 2, "ttft") == pytest.approx([0.1, 0.1])
    assert len(block_medians(recs, 3)) == 3
    with pytest.raises(ValueError, match="at least 3 records"):
        block_medians(recs[:2], 3)
    with pytest.raises(ValueError, match="ttft or tpot"):
        block_medians(recs, 2, "itl")
