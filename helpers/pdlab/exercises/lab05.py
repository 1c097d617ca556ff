"""Checks for lab 05 (predict a deployment from a calibration, then run it). Expected values are
computed from the lab's own calibration and live records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pdlab.exercises import CheckResult, check_close, check_pair
from pdlab.metrics import RequestRecord, ttft_s
from pdlab.simreal import Calibration, replay
from pdlab.simreal.replay import Deployment
from pdlab.workloads import Request

#: Exercises whose reference answer ends in one call the page names, and why that is fine.
ONE_CALL_OK = {"Exercise 1": "the last step is a median, but the answer is a prediction the page has not made: "
                             "the student picks the deployment (two replicas, round robin), the block and the "
                             "calibration's simulator options and replays the planned requests on it first"}

__all__ = ["ONE_CALL_OK", "block_ttft_prediction", "check_block_prediction", "one_block_judgement",
           "check_one_block_judgement"]


def block_ttft_prediction(calibration: Calibration, block: Sequence[Request], deployment: Deployment,
                          **sim_options: Any) -> float:
    """The median TTFT (s) that ``calibration`` predicts for the planned requests of one ``block``
    on ``deployment`` (:func:`pdlab.simreal.replay`, ``sim_options`` its keywords)."""
    return float(np.median(ttft_s(replay(list(block), deployment, calibration, **sim_options))))


def check_block_prediction(value, calibration: Calibration, block: Sequence[Request], deployment: Deployment,
                           **sim_options: Any) -> CheckResult:
    """Exercise 1: predict the deployment before it runs: the median TTFT (s) of one planned block."""
    expected = block_ttft_prediction(calibration, block, deployment, **sim_options)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="s", measured=True,
                       hint="replay the block's planned requests on DEPLOYMENTS['2 replicas'] (two replicas, round "
                            "robin, front ends on their cores) with the engine's calibration and the lab's simulator "
                            "options (**SIM), then take the median of the simulated TTFTs, in seconds.")


def one_block_judgement(calibration: Calibration, block: Sequence[Request], deployment: Deployment,
                        live_blocks: Sequence[Sequence[RequestRecord]], **sim_options: Any) -> tuple[float, float]:
    """(the error of one block's prediction, the floor of one block): the predicted median TTFT of
    ``block`` (:func:`block_ttft_prediction`) ÷ the live median TTFT of ``live_blocks[0]`` (that
    block's live records) − 1; and |median TTFT of ``live_blocks[1]`` ÷ that of ``live_blocks[0]`` − 1|,
    how far the same deployment's other block of the same rate is from it: what an exact
    prediction of one block can miss by on this host."""
    if len(live_blocks) < 2:
        raise ValueError(f"the floor of one block needs the rate's two blocks, got {len(live_blocks)}")
    first, second = (float(np.median(ttft_s(b))) for b in live_blocks[:2])
    predicted = block_ttft_prediction(calibration, block, deployment, **sim_options)
    return predicted / first - 1, abs(second / first - 1)


def check_one_block_judgement(value, calibration: Calibration, block: Sequence[Request], deployment: Deployment,
                              live_blocks: Sequence[Sequence[RequestRecord]], **sim_options: Any) -> CheckResult:
    """Exercise 2: ``(error, floor)`` of Exercise 1's one-block prediction (:func:`one_block_judgement`),
    each within 1e-6; the verdict (within or beyond the floor) is printed, not asked."""
    name = "Exercise 2"
    expected = one_block_judgement(calibration, block, deployment, live_blocks, **sim_options)
    return check_pair(name, value, expected, labels=("prediction error", "floor of one block"),
                      pair="error, floor", variables="prediction_error and block_floor", fmt="+.6g", abs_tol=1e-12,
                      passed="error {0:+.1%} against a floor of {1:.1%}: "
                             + ("within" if abs(expected[0]) <= expected[1] else "beyond")
                             + " what one block of this host can miss by",
                      hint="The error is your Exercise 1 prediction ÷ the live median TTFT of the same block − 1 "
                           "(signed); the floor is |median TTFT of the rate's other block ÷ that block's − 1|, from "
                           "the same deployment's live run.")

