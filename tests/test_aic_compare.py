"""pdlab.peers.aic_compare: pdlab's analytic latency against AIConfigurator (skipped without the `aic` extra)."""

import pytest
from pdlab.peers.aic_compare import (
    REFERENCE_POINTS,
    aic_available,
    aic_comparison,
    aic_estimate,
    pdlab_estimate,
)


def test_pdlab_side_reproduces_the_issue_figures():
    ours = pdlab_estimate("llama-3-8b", "h200")           # issue #16: 47.0 ms TTFT, 5.26 ms TPOT
    assert ours["ttft_ms"] == pytest.approx(47.0, abs=0.1)
    assert ours["tpot_ms"] == pytest.approx(5.26, abs=0.02)
    assert ours["ideal_ttft_ms"] < ours["ttft_ms"] and ours["ideal_tpot_ms"] < ours["tpot_ms"]
    big = pdlab_estimate("llama-3-8b", "h200", batch=8)
    assert big["ttft_ms"] > 7 * ours["ttft_ms"] and big["tpot_ms"] < 2 * ours["tpot_ms"]


@pytest.mark.slow
@pytest.mark.skipif(not aic_available(), reason="aiconfigurator (extra 'aic') is not installed")
def test_aic_reference_point_and_table():
    ttft, tpot = REFERENCE_POINTS[("llama-3-8b", "h200", 1)]
    got = aic_estimate("llama-3-8b", "h200")
    assert got["ttft_ms"] == pytest.approx(ttft, rel=0.01) and got["tpot_ms"] == pytest.approx(tpot, rel=0.01)
    table = aic_comparison(models=("llama-3-8b",), gpus=("h200",), batches=(1,), lengths=((2048, 256),))
    row = table.iloc[0]
    assert row["ttft_aic_ms"] == pytest.approx(ttft, rel=0.01)
    assert row["ttft_err_pct"] == pytest.approx(100 * (47.0 - ttft) / ttft, abs=1.0)
    assert abs(row["tpot_err_pct"]) < 20


def test_missing_aiconfigurator_is_a_clear_error(monkeypatch):
    import pdlab.peers.aic_compare as ac

    monkeypatch.setattr(ac, "aic_available", lambda: False)
    with pytest.raises(ImportError, match="pip install"):
        ac.aic_comparison("smoke")
