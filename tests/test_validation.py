"""pdlab.simreal.validation: MAPE, KS, bootstrap TOST on medians, tables and CDF overlays on known samples."""

import numpy as np
import pytest
from pdlab.metrics import RequestRecord
from pdlab.simreal.validation import (
    cdf_overlay,
    compare_samples,
    interval_verdict,
    ks_test,
    mape,
    mape_summary,
    relative_error,
    tost_median_ratio,
    validation_table,
)

RNG = np.random.default_rng(7)
REAL = RNG.lognormal(np.log(0.1), 0.5, size=1000)           # a skewed latency sample, median 0.1 s
SAME = RNG.lognormal(np.log(0.1), 0.5, size=1000)           # same distribution, fresh draws
SHIFT = RNG.lognormal(np.log(0.13), 0.5, size=1000)         # median 30 % higher


def test_mape_and_relative_error():
    assert mape([110, 90], [100, 100]) == pytest.approx(10.0)
    assert mape([1.0, 3.0], [2.0, 2.0]) == pytest.approx(50.0)
    assert relative_error(1.2, 1.0) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        mape([1.0], [0.0])
    with pytest.raises(ValueError):
        mape([1.0, 2.0], [1.0])


def test_ks_separates_same_from_shifted():
    stat_same, p_same = ks_test(SAME, REAL)
    stat_shift, p_shift = ks_test(SHIFT, REAL)
    assert p_same > 0.05 and stat_same < 0.05
    assert p_shift < 1e-6 and stat_shift > 0.15


def test_tost_gives_opposite_verdicts_for_equivalent_and_shifted_samples():
    same = tost_median_ratio(SAME, REAL, n_boot=1000)
    shifted = tost_median_ratio(SHIFT, REAL, n_boot=1000)
    assert same.equivalent and same.p_value < 0.05 and same.ci_low > 0.9 and same.ci_high < 1.1
    assert not shifted.equivalent and shifted.p_value > 0.5 and shifted.ratio == pytest.approx(1.3, rel=0.08)
    # 5 % off with enough data is equivalent at ±10 %, but not at ±2 %
    five = REAL * 1.05
    assert tost_median_ratio(five, REAL, n_boot=1000).equivalent
    assert not tost_median_ratio(five, REAL, margin=0.02, n_boot=1000).equivalent
    # too few samples: the interval is too wide to claim equivalence even for the same distribution
    assert not tost_median_ratio(SAME[:8], REAL[:8]).equivalent
    # deterministic for a seed; the chunked bootstrap gives the same answer
    assert tost_median_ratio(SAME, REAL, n_boot=300) == tost_median_ratio(SAME, REAL, n_boot=300, max_draws=10_000)


def test_tost_rejects_bad_arguments():
    for kw in (dict(margin=0), dict(alpha=0.6), dict(n_boot=10)):
        with pytest.raises(ValueError):
            tost_median_ratio(SAME, REAL, **kw)
    with pytest.raises(ValueError, match="finite"):
        tost_median_ratio([np.nan], REAL)


def _records(lat, n=300, scale=1.0):
    rng = np.random.default_rng(lat)
    out = []
    for i in range(n):
        ttft = float(rng.lognormal(np.log(0.2 * scale), 0.3))
        tpot = float(rng.lognormal(np.log(0.02 * scale), 0.2))
        out.append(RequestRecord(i, 0.0, 100, 11, first_token_s=ttft, finish_s=ttft + 10 * tpot))
    return out


def test_validation_table_and_mape_summary():
    real = _records(1)
    runs = {("colocated", 2.0): (_records(2), real), ("disaggregated", 2.0): (_records(3, scale=1.3), real)}
    table = validation_table(runs, n_boot=500)
    assert len(table) == 6 and set(table["metric"]) == {"ttft_s", "tpot_s", "e2e_s"}
    good = table[table["run"] == ("colocated", 2.0)]
    bad = table[table["run"] == ("disaggregated", 2.0)]
    assert good["equivalent"].all() and not bad["equivalent"].any()
    assert (bad["median_err_pct"] > 20).all()
    summary = mape_summary(table)
    assert 10 < summary["median_mape_pct"] < 25 and summary["tost_pass_share"] == pytest.approx(0.5)
    assert "ttft_s_p90_mape_pct" in summary
    with pytest.raises(ValueError, match="unknown metric"):
        validation_table(runs, metrics=("goodput",))


def test_compare_samples_row_and_cdf_overlay():
    row = compare_samples(SAME, REAL, n_boot=300)
    assert row["n_sim"] == 1000 and abs(row["median_err_pct"]) < 5 and row["equivalent"]
    fig = cdf_overlay(SAME, REAL, title="TTFT, simulated vs measured", x_title="TTFT (ms)", scale=1000)
    assert [t.name for t in fig.data] == ["simulated", "measured"]
    assert fig.data[0].y[-1] == pytest.approx(1.0) and fig.layout.xaxis.title.text == "TTFT (ms)"
    assert max(fig.data[1].x) == pytest.approx(1000 * REAL.max())


def test_interval_verdict_reads_the_whole_interval():
    assert interval_verdict(0.90, 1.10) == "met"                       # the bounds themselves are inside
    assert interval_verdict(1.11, 1.30) == "missed"
    assert interval_verdict(0.50, 0.89) == "missed"
    assert interval_verdict(0.95, 1.12) == "unresolved"                # a point estimate inside, interval not
    assert interval_verdict(0.80, 1.20) == "unresolved"                # straddles both bounds
    assert interval_verdict(float("nan"), 1.0) == "unresolved"
    assert interval_verdict(0.96, 1.04, bound=0.03) == "unresolved"
    with pytest.raises(ValueError, match="bound"):
        interval_verdict(0.9, 1.0, bound=1.5)
    with pytest.raises(ValueError, match="low end"):
        interval_verdict(1.1, 0.9)
