"""The perfect-model ceiling of benchmarks/engine_steadiness.py: lab 05's block schedule laid over a
measured speed series (no server started)."""

from __future__ import annotations

import importlib
import sys

import pytest
from pdlab.paths import repo_root


def _benchmark(name: str):
    """benchmarks/<name>.py as a module, the folder on sys.path only while the tests use it."""
    sys.path.insert(0, str(repo_root() / "benchmarks"))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(repo_root() / "benchmarks"))


@pytest.fixture(scope="module")
def steadiness():
    yield from _benchmark("engine_steadiness")


def series(values_at):
    return [{"t": 0.5 * k, "decode": values_at(0.5 * k)} for k in range(400)]   # 200 s, a round every 0.5 s


def test_a_machine_that_repeats_itself_lets_a_perfect_model_meet_every_prediction(steadiness):
    f = steadiness.perfect_model_floor(series(lambda t: 0.005), "decode", [2.0, 4.0, 6.0])
    assert f["schedules"] > 50
    assert f["within"] == 1.0 and f["all_within"] == 1.0 and f["median_abs_err"] == 0.0


def test_a_machine_that_slows_by_half_midway_fails_the_schedules_that_straddle_it(steadiness):
    # blocks of 30 requests at 2/4/6 req/s: 16.5 + 9 + 6.5 + 6.5 + 9 + 16.5 s plus 5 gaps of 3 s = 79 s
    f = steadiness.perfect_model_floor(series(lambda t: 0.005 if t < 100 else 0.0075), "decode", [2.0, 4.0, 6.0])
    assert 0 < f["all_within"] < 1            # schedules wholly before or after the step still pass
    assert f["within"] < 1 and f["median_abs_err"] == 0.0   # most predictions are untouched


def test_the_mirrored_order_cancels_a_steady_drift(steadiness):
    # the machine slows by 0.5 % per second, +40 % over a schedule: each rate's two blocks sit
    # symmetrically about the schedule's middle, so each rate's median is the same (lab 05, section 2)
    f = steadiness.perfect_model_floor(series(lambda t: 0.005 * (1 + 0.005 * t)), "decode", [2.0, 4.0, 6.0])
    assert f["all_within"] == 1.0 and f["median_abs_err"] < 0.02


def test_a_series_shorter_than_the_schedule_scores_nothing(steadiness):
    assert steadiness.perfect_model_floor(series(lambda t: 0.005)[:100], "decode", [2.0, 4.0, 6.0]) == {"schedules": 0}


@pytest.fixture(scope="module")
def scatter():
    yield from _benchmark("block_scatter")


def test_block_scatter_cuts_a_rate_into_its_blocks_in_the_order_they_arrived(scatter):
    """Two blocks of 5 requests, the second sent 30 s later, stored out of order: each part holds
    one block; an odd count gives the first block the extra request, as split_blocks does."""
    from pdlab.metrics import RequestRecord

    recs = [RequestRecord(i, t, 100, 4) for i, t in enumerate([30.0, 0.1, 30.4, 0.0, 30.2, 0.3, 30.1, 0.2, 30.3, 0.4])]
    first, second = scatter.blocks_of(recs, 2)
    assert sorted(r.arrival_s for r in first) == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert min(r.arrival_s for r in second) == 30.0
    assert [len(p) for p in scatter.blocks_of(recs[:9], 2)] == [5, 4]


def test_a_perfect_models_chance_falls_as_the_blocks_scatter(scatter):
    """Blocks that repeat exactly leave a perfect model every prediction; its chance falls as the
    blocks scatter, and with a scatter far past the 10 % band it is near nothing."""
    chance = [scatter.perfect_model_chance(s, rates=3, blocks=2, elasticity=1.2, draws=20_000)
              for s in (0.0, 0.02, 0.05, 0.5)]
    assert chance[0] == 1.0
    assert chance[0] >= chance[1] > chance[2] > chance[3]
    assert chance[3] < 0.05
