"""The simulator's ``horizon_s``: events after the horizon are not simulated, and what was still
in flight ends as a failure ("unfinished"), so attainment counts it as a miss.

Hand-derivable: one colocated instance with constant step times (prefill 0.1 s, decode 0.01 s);
a 4-token request arriving at t finishes its prefill (first token) at t + 0.1 and its three
decode steps at t + 0.13.
"""

import pytest
from pdlab.metrics import SLO, slo_attainment
from pdlab.sim.cluster import simulate
from pdlab.sim.latency import ConstantLatency
from pdlab.workloads import make_requests

REQS = make_requests([0.0, 1.0, 5.0], [16, 16, 16], [4, 4, 4])


def _run(horizon_s):
    return simulate(REQS, "colocated", "a100-80gb", "opt-13b", latency=ConstantLatency(0.1, 0.01),
                    horizon_s=horizon_s)


def test_without_a_horizon_every_request_finishes():
    res = _run(None)
    assert [r.ok for r in res.records] == [True, True, True]
    assert [r.finish_s for r in res.records] == pytest.approx([0.13, 1.13, 5.13])
    assert res.end_time_s == pytest.approx(5.13)


def test_a_horizon_cuts_the_arrivals_after_it():
    res = _run(2.0)
    assert [r.ok for r in res.records] == [True, True, False]
    assert [r.finish_s for r in res.records[:2]] == pytest.approx([0.13, 1.13])
    assert res.records[2].error == "unfinished when the simulation ended" and res.records[2].finish_s is None
    assert res.end_time_s == pytest.approx(1.13)        # the last event simulated, not the horizon
    assert slo_attainment(res.records, SLO(ttft_s=1.0)) == pytest.approx(2 / 3)


def test_a_horizon_inside_a_request_leaves_it_unfinished():
    res = _run(1.05)    # request 1 arrived at 1.0; its prefill would end at 1.1
    assert [r.ok for r in res.records] == [True, False, False]
    assert res.records[1].first_token_s is None
    assert res.end_time_s == pytest.approx(1.0)          # its arrival was the last event before 1.05
