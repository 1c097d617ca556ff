"""pdlab.sched.queueing: DistServe §3.1 closed forms and their check by simulation."""

import math

import pytest
from pdlab.cli import main
from pdlab.sched.queueing import avg_ttft_all, avg_ttft_single, crossover_rate, simulate_avg_ttft


def test_check_values_from_the_paper_formulas():
    v = avg_ttft_all(0.5, 1.0, 1.5)
    assert round(v["single"], 3) == 1.500
    assert round(v["inter_op"], 3) == 1.083
    assert round(v["intra_op"], 3) == 0.833


def test_crossover_rates_and_instability():
    assert crossover_rate(1.0, 1.3) == pytest.approx(0.61, abs=0.01)
    assert crossover_rate(1.0, 1.5) == pytest.approx(0.94, abs=0.01)
    assert crossover_rate(1.0, 1.8) == pytest.approx(1.43, abs=0.01)
    assert math.isinf(avg_ttft_single(1.0, 1.0))
    with pytest.raises(ValueError):
        avg_ttft_single(-1, 1)


@pytest.mark.parametrize("kind", ["single", "inter_op", "intra_op"])
def test_simulation_agrees_within_5_percent(kind):
    closed = avg_ttft_all(0.5, 1.0, 1.5)[kind]
    assert simulate_avg_ttft(0.5, 1.0, kind=kind, speedup=1.5, requests=8000, seed=2) == pytest.approx(closed, rel=0.05)


def test_cli_queue_json(capsys):
    assert main(["queue", "--rate", "0.5", "--service-time", "1", "--speedup", "1.5", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["avg_ttft_s"]["inter_op"] == pytest.approx(1.0833333, rel=1e-6)
    assert "simulated_avg_ttft_s" not in out
    assert main(["queue", "--rate", "2", "--service-time", "1", "--simulate", "--json"]) == 2
