"""Checks for notebook 00 (orientation)."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close, check_true
from pdlab.hardware import detect_device, get_gpu

__all__ = ["check_device_kind", "check_ridge_h100", "ONE_CALL_OK"]

# Exercises whose answer may be one call to a helper on the page (tests/test_exercise_effort.py).
ONE_CALL_OK = {
    "Exercise 1": "orientation, not reasoning: the student runs a first cell and reads which device every later "
                  "notebook adapts to (pdlab.hardware.detect_device, the call the notebooks themselves make)",
}


def check_device_kind(value) -> CheckResult:
    """Exercise 1: the kind of device this kernel runs on ("cpu" or "cuda")."""
    actual = detect_device()["kind"]
    return check_true("Exercise 1", value, value == actual, expected=actual,
                      good=f"this kernel runs on {actual!r}",
                      bad=f"got {value!r}; pdlab.hardware.detect_device() says {actual!r}")


def check_ridge_h100(value) -> CheckResult:
    """Exercise 2: the bf16 ridge point of an H100 SXM in FLOP/byte."""
    return check_close("Exercise 2", value, get_gpu("h100-sxm").ridge_point("bf16"), rel_tol=0.01,
                       unit="FLOP/B", hint="dense bf16 FLOP/s divided by HBM bytes/s.")
