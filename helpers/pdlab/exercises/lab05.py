"""Checks for lab 05 (sim-to-real calibration). Expected values are computed from the lab's own data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.metrics import RequestRecord
from pdlab.simreal import Calibration, fit_on_run, host_floor, replay, requests_from_records
from pdlab.simreal.compare import median_error

__all__ = ["heldout_tpot_error", "check_heldout_error", "check_block_scatter", "check_within_floor"]


def heldout_tpot_error(probe: Calibration, fit_records: Sequence[RequestRecord],
                       target_records: Sequence[RequestRecord], mode: str, **sim_options: Any) -> float:
    """The error of the median TPOT (fraction, (sim − live) / live) when ``probe`` is fitted on the
    run ``fit_records`` (:func:`pdlab.simreal.fit_on_run`) and predicts the run ``target_records``."""
    fitted = fit_on_run(probe, fit_records, mode, **sim_options)
    sims = replay(requests_from_records(target_records), mode, fitted, **sim_options)
    return median_error(target_records, sims, "tpot", boot=1)[0]


def check_heldout_error(value, probe: Calibration, fit_records: Sequence[RequestRecord],
                        target_records: Sequence[RequestRecord], mode: str, **sim_options: Any) -> CheckResult:
    """Exercise 1: fit on one rate, predict another: the held-out error of the median TPOT."""
    expected = heldout_tpot_error(probe, fit_records, target_records, mode, **sim_options)
    if value is None:
        return check_true("Exercise 1", None, False, good="", bad="", expected=expected)
    try:
        got = float(value)
    except (TypeError, ValueError):
        return check_true("Exercise 1", value, False, good="", bad=f"expected a number, got {type(value).__name__}")
    ok = abs(got - expected) <= 0.002
    return check_true("Exercise 1", value, ok, good=f"{got:+.1%} (the run fit's prediction of the other rate)",
                      bad=f"got {got:+.2%}: fit the probe's calibration on the *fitted* rate's records "
                          "(fit_on_run), replay the *other* rate's requests (requests_from_records) with it, and "
                          "give median(simulated TPOT) / median(live TPOT) − 1 as a fraction")


def check_block_scatter(value, blocks: Mapping[float, Sequence[Sequence[RequestRecord]]]) -> CheckResult:
    """Exercise 2a: the rms, over consecutive blocks of one rate, of the log ratio of their median TPOTs."""
    expected = host_floor(blocks, draws=100).block_rms_tpot
    return check_close("Exercise 2a", value, expected, rel_tol=1e-6, unit="(log ratio, rms)",
                       hint="For each rate, log(median TPOT of block k+1 / median TPOT of block k); then the root of "
                            "the mean of their squares over all rates (not the mean of the ratios: a + and a − "
                            "difference must not cancel).")


def check_within_floor(value, error: float, blocks: Mapping[float, Sequence[Sequence[RequestRecord]]]) -> CheckResult:
    """Exercise 2b: is ``error`` (a held-out TPOT error) within the host's floor, i.e. no larger in
    magnitude than the TPOT error a perfect model stays under in 95 % of runs (``floor_tpot_p95``)?"""
    floor = host_floor(blocks)
    expected = bool(abs(error) <= floor.floor_tpot_p95)
    if value is None:
        return check_true("Exercise 2b", None, False, good="", bad="", expected=expected)
    ok = isinstance(value, bool) and value == expected
    return check_true("Exercise 2b", value, ok,
                      good=f"{'within' if expected else 'beyond'} the floor: |{error:+.1%}| vs "
                           f"{floor.floor_tpot_p95:.1%}",
                      bad="compare |error| with host_floor(...).floor_tpot_p95 and answer True or False (a bool)")
