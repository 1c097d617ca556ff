"""Lab 05's prediction tables on synthetic records: the errors of a prediction against a live run,
the decision table (agree / disagree / within the floor), the goodput floor between repeated
blocks, the prediction floor, and the link fitted beside an engine's calibration."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from pdlab.metrics import SLO, RequestRecord
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibration import Calibration
from pdlab.simreal.compare import perfect_prediction_chance, prediction_floor
from pdlab.simreal.predict import (
    TWO_CORE_DEPLOYMENTS,
    block_goodputs,
    decide,
    decision_table,
    goodput_floor_rps,
    predict_blocks,
    prediction_errors,
    sim_run_flags,
    with_link,
)
from pdlab.simreal.replay import Deployment
from pdlab.workloads import Request

SLO_ = SLO(ttft_s=0.5, tpot_s=0.1)


def _block(ttfts, *, tpot=0.05, tokens=5, gap=1.0, first_id=0):
    """Records of one block: request i arrives at i·gap with TTFT ``ttfts[i]`` and a steady TPOT."""
    return [RequestRecord(first_id + i, i * gap, 100, tokens, first_token_s=i * gap + t,
                          finish_s=i * gap + t + tpot * (tokens - 1),
                          token_times_s=[i * gap + t + tpot * k for k in range(tokens)])
            for i, t in enumerate(ttfts)]


def test_prediction_errors_are_the_medians_errors_per_rate_and_their_mae():
    live = {1.0: [_block([0.1, 0.2]), _block([0.3, 0.4], first_id=2)],
            2.0: [_block([0.2, 0.2]), _block([0.2, 0.2], first_id=2)]}
    sim = {1.0: [_block([0.11, 0.22]), _block([0.33, 0.44], first_id=2)],      # every TTFT +10 %
           2.0: [_block([0.1, 0.1], tpot=0.06), _block([0.1, 0.1], tpot=0.06, first_id=2)]}   # −50 %, TPOT +20 %
    err = prediction_errors(sim, live)
    rows = {r["rate_rps"]: r for r in err.rows}
    assert rows[1.0]["ttft_p50_err"] == pytest.approx(0.10) and rows[1.0]["paired_ttft_err"] == pytest.approx(0.10)
    assert rows[1.0]["tpot_p50_err"] == pytest.approx(0.0, abs=1e-12) and rows[1.0]["requests"] == 4
    assert rows[2.0]["ttft_p50_err"] == pytest.approx(-0.5) and rows[2.0]["tpot_p50_err"] == pytest.approx(0.2)
    assert err.ttft_mae == pytest.approx(0.30) and err.tpot_mae == pytest.approx(0.10)
    assert err.paired_ttft_mae == pytest.approx(0.30)
    assert not err.met() and err.met(bar=0.30)
    assert list(err.table().rate_rps) == [1.0, 2.0]
    with pytest.raises(ValueError, match="must be the same"):
        prediction_errors({1.0: sim[1.0]}, live)


def test_goodput_of_blocks_and_the_floor_between_them():
    fast = _block([0.1] * 4)                    # 4 requests met in 3.1 + 0.15 s
    half = _block([0.1, 0.9, 0.1, 0.9])         # 2 of 4 met the TTFT objective
    g = block_goodputs([fast, half], SLO_)
    assert g[0] == pytest.approx(4 / (3 + 0.1 + 0.2)) and g[1] == pytest.approx(2 / (3 + 0.9 + 0.2))
    # the rms of the consecutive differences, over every run given
    assert goodput_floor_rps([[fast, half], [fast, fast]], SLO_) == pytest.approx(abs(g[1] - g[0]) / math.sqrt(2))
    assert math.isnan(goodput_floor_rps([[fast]], SLO_))


def _runs(goodput_blocks):
    """Records whose block goodputs are set by how many of 10 requests meet the TTFT objective."""
    out = []
    for k, met in enumerate(goodput_blocks):
        out.append(_block([0.1] * met + [0.9] * (10 - met), first_id=10 * k))
    return out


def test_decisions_agree_disagree_or_fall_within_the_floor():
    live = {"2 replicas": {1.0: _runs([9, 9]), 2.0: _runs([8, 8]), 3.0: _runs([6, 7])},
            "1P1D": {1.0: _runs([5, 5]), 2.0: _runs([9, 9]), 3.0: _runs([7, 6])}}
    sim = {"2 replicas": {1.0: _runs([10, 10]), 2.0: _runs([10, 10]), 3.0: _runs([5, 5])},
           "1P1D": {1.0: _runs([4, 4]), 2.0: _runs([7, 7]), 3.0: _runs([8, 8])}}
    got = {d.rate_rps: d for d in decide(sim, live, SLO_)}
    assert got[1.0].sim_choice == got[1.0].live_choice == "2 replicas" and got[1.0].verdict == "agree"
    assert got[1.0].floor_rps == 0.0 and got[1.0].gap_rps > 0
    assert (got[2.0].sim_choice, got[2.0].live_choice, got[2.0].verdict) == ("2 replicas", "1P1D", "disagree")
    # at 3 req/s the two deployments' means tie live and each one's blocks differ by one request: within the floor
    assert got[3.0].gap_rps < got[3.0].floor_rps and got[3.0].verdict == "within the floor"
    table = decision_table(list(got.values()))
    assert list(table.index) == [1.0, 2.0, 3.0]
    assert list(table["verdict"]) == ["agree", "disagree", "within the floor"]
    assert {"sim 2 replicas (req/s)", "live 1P1D (req/s)", "block floor (req/s)"} <= set(table.columns)
    with pytest.raises(ValueError, match="same >= 2 deployments"):
        decide({"2 replicas": sim["2 replicas"]}, live, SLO_)
    with pytest.raises(ValueError, match="needs the rates"):
        decide(sim, {**live, "1P1D": {1.0: live["1P1D"][1.0]}}, SLO_)


def test_the_prediction_floor_is_a_perfect_predictors_error_under_the_block_scatter():
    rng = np.random.default_rng(0)
    blocks = {r: [_block(list(rng.uniform(0.1, 0.3, 20)), first_id=20 * k) for k in range(2)] for r in (1.0, 2.0)}
    floor = prediction_floor(blocks)
    assert floor.pairs == 2 and floor.block_rms_ttft > 0 and floor.block_rms_tpot == 0
    assert 0 < floor.floor_ttft_mae < floor.floor_ttft_p95 and floor.floor_tpot_mae == 0
    # one rate, two blocks: a perfect prediction of the mean of two blocks of scatter s misses by about
    # E|N(0, s/√2)| = s/√2·√(2/π)
    _, m_ttft, _ = perfect_prediction_chance(0.1, 0.0, rates=1, blocks=2, draws=200000)
    assert float(m_ttft.mean()) == pytest.approx(0.1 / math.sqrt(2) * math.sqrt(2 / math.pi), rel=0.02)
    with pytest.raises(ValueError, match=">= 2 blocks"):
        prediction_floor({1.0: [blocks[1.0][0]]})


@dataclass(frozen=True)
class _Handoff:
    tokens: int
    ttft_s: float
    samples: int
    prefill_leg_s: float | None = None


def test_with_link_fits_the_handoff_beside_the_engine_and_the_two_core_deployments_predict():
    engine = Calibration(FittedLatency((0.01, 5e-5, 0.0), (0.008, 1e-7, 1e-3)))
    # TTFT through the proxy = prefill leg + one decode step + 3 ms + 1 µs/token
    points = [_Handoff(n, 0.02 + engine.latency.decode_time_s([n]) + 0.003 + 1e-6 * n, 3, 0.02)
              for n in (32, 512, 1536)]
    cal = with_link(engine, points)
    assert cal.kv_link.latency_s == pytest.approx(0.003, rel=1e-6)
    assert cal.kv_link.s_per_token == pytest.approx(1e-6, rel=1e-6)
    assert cal.latency.prefill == engine.latency.prefill and len(cal.handoff_points) == 3
    assert sim_run_flags(TWO_CORE_DEPLOYMENTS["2 replicas"]) == ["--mode", "colocated", "--instances", "2",
                                                                 "--dispatch", "round_robin"]
    assert sim_run_flags(TWO_CORE_DEPLOYMENTS["1P1D"]) == ["--mode", "disaggregated", "--prefill", "1",
                                                           "--decode", "1"]
    assert sim_run_flags(Deployment("colocated", instances=2, front_end_shares_core=True))[-1] == \
        "--front-end-shares-core"
    blocks = {4.0: [[Request(i, i / 4.0, 256, 8) for i in range(6)],
                    [replace(Request(i, (i - 6) / 4.0, 256, 8)) for i in range(6, 12)]]}
    for dep in TWO_CORE_DEPLOYMENTS.values():
        pred = predict_blocks(blocks, dep, cal)
        assert [[r.request_id for r in b] for b in pred[4.0]] == [list(range(6)), list(range(6, 12))]
        assert all(r.ok and r.output_tokens == 8 for b in pred[4.0] for r in b)
    with pytest.raises(ValueError, match="no blocks"):
        predict_blocks({}, "colocated", cal)


def test_two_calibrations_compared_coefficient_by_coefficient():
    from pdlab.simreal.calibration import LinkFit, PrefillStall
    from pdlab.simreal.compare import calibration_differences

    a = Calibration(FittedLatency((0.010, 5e-5, 0.0), (0.008, 1e-7, 1e-3)), kv_link=LinkFit(0.003, 1e-6),
                    prefill_stall=PrefillStall.from_dict({"streams": 4, "fixed_s": 0.002}))
    b = Calibration(FittedLatency((0.011, 5e-5, 1e-9), (0.008, 1.2e-7, 1e-3)), kv_link=LinkFit(0.003, 2e-6),
                    prefill_stall=PrefillStall.from_dict({"streams": 4, "fixed_s": 0.001}))
    rows = {r["coefficient"]: r for r in calibration_differences(a, b)}
    assert rows["a_p"]["first"] == pytest.approx(10.0) and rows["a_p"]["rel_diff"] == pytest.approx(0.1)
    assert math.isnan(rows["c_p"]["rel_diff"]) and rows["c_p"]["second"] == pytest.approx(1.0)   # first is 0
    assert rows["b_d"]["rel_diff"] == pytest.approx(0.2) and rows["c_d"]["rel_diff"] == pytest.approx(0.0)
    assert rows["stall fixed_s"]["rel_diff"] == pytest.approx(-0.5)
    assert rows["link s_per_token"]["unit"] == "µs/token" and rows["link s_per_token"]["rel_diff"] == pytest.approx(1.0)
    pre = rows["prefill of 1024 tokens"]
    assert pre["second"] / pre["first"] - 1 == pytest.approx(pre["rel_diff"])
    assert pre["first"] == pytest.approx(1e3 * (0.010 + 5e-5 * 1024))
    assert rows["decode step, 16 × 512 tokens"]["first"] == pytest.approx(1e3 * (0.008 + 1e-7 * 16 * 512 + 16e-3))
    assert "link latency_s" not in {r["coefficient"] for r in calibration_differences(a, Calibration(b.latency))}
