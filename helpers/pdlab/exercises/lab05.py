"""Checks for lab 05 (sim-to-real calibration). Expected values are computed from the lab's own data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.metrics import RequestRecord, tpot_s
from pdlab.simreal import Calibration, fit_on_run, host_floor, replay, requests_from_records
from pdlab.simreal.compare import block_log_ratios

#: Exercises whose reference answer ends in one call the page names, and why that is fine.
ONE_CALL_OK = {"Exercise 1": "the last step is a median, but the answer needs the student's own fit on one rate "
                             "(fit_on_run) and replay of another (replay of requests_from_records) first"}

__all__ = ["ONE_CALL_OK", "heldout_tpot_prediction", "check_heldout_prediction", "check_block_scatter", "check_within_floor"]


def heldout_tpot_prediction(probe: Calibration, fit_records: Sequence[RequestRecord],
                            target_records: Sequence[RequestRecord], mode: str, **sim_options: Any) -> float:
    """The median TPOT (s) that ``probe``, fitted on the run ``fit_records``
    (:func:`pdlab.simreal.fit_on_run`), predicts for the requests of the run ``target_records``."""
    fitted = fit_on_run(probe, fit_records, mode, **sim_options)
    return float(np.median(tpot_s(replay(requests_from_records(target_records), mode, fitted, **sim_options))))


def check_heldout_prediction(value, probe: Calibration, fit_records: Sequence[RequestRecord],
                             target_records: Sequence[RequestRecord], mode: str, **sim_options: Any) -> CheckResult:
    """Exercise 1: fit on one rate, predict another: the predicted median TPOT (s)."""
    expected = heldout_tpot_prediction(probe, fit_records, target_records, mode, **sim_options)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="s", measured=True,
                       hint="fit_on_run on the *fitted* rate's records (the probe's calibration, the lab's simulator "
                            "options), then replay the *other* rate's requests (requests_from_records) with that "
                            "fit and take the median of the simulated TPOTs (seconds).")


def check_block_scatter(value, blocks: Mapping[float, Sequence[Sequence[RequestRecord]]]) -> CheckResult:
    """Exercise 2a: the rms, over consecutive blocks of one rate, of the log ratio of their median TPOTs."""
    expected = float(np.sqrt(np.mean(np.square(block_log_ratios(blocks, "tpot")))))
    return check_close("Exercise 2a", value, expected, rel_tol=1e-6, unit="(log ratio, rms)", measured=True,
                       hint="For each rate, log(median TPOT of block k+1 / median TPOT of block k); then the root of "
                            "the mean of their squares over all rates (not the mean of the logs: a + and a − "
                            "difference must not cancel).")


def check_within_floor(value, probe: Calibration, fit_records: Sequence[RequestRecord],
                       target_records: Sequence[RequestRecord], mode: str,
                       blocks: Mapping[float, Sequence[Sequence[RequestRecord]]], **sim_options: Any) -> CheckResult:
    """Exercise 2b: is Exercise 1's held-out TPOT error (prediction ÷ live median − 1) within the
    host's floor, i.e. no larger in magnitude than a perfect model's 95th percentile
    (``host_floor(blocks).floor_tpot_p95``)? ``value``: True or False."""
    predicted = heldout_tpot_prediction(probe, fit_records, target_records, mode, **sim_options)
    error = predicted / float(np.median(tpot_s(target_records))) - 1
    floor = host_floor(blocks)
    expected = bool(abs(error) <= floor.floor_tpot_p95)
    ok = isinstance(value, bool) and value == expected
    return check_true("Exercise 2b", value, ok, expected=expected, choice=True,
                      good=f"{'within' if expected else 'beyond'} the floor: |{error:+.1%}| against "
                           f"{floor.floor_tpot_p95:.1%}",
                      bad="the error is predicted ÷ live median TPOT − 1; compare its magnitude with "
                          "host_floor(...).floor_tpot_p95 and answer True or False (a bool)")
