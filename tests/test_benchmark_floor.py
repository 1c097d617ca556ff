"""The perfect-model ceiling of benchmarks/engine_steadiness.py: lab 05's block schedule laid over a
measured speed series (no server started)."""

from __future__ import annotations

import importlib
import sys

import pytest
from pdlab.paths import repo_root


@pytest.fixture(scope="module")
def steadiness():
    sys.path.insert(0, str(repo_root() / "benchmarks"))
    try:
        yield importlib.import_module("engine_steadiness")
    finally:
        sys.path.remove(str(repo_root() / "benchmarks"))


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
