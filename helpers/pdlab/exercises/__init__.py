"""Exercise checks: clear pass / fail / not-attempted messages for the notebooks' exercises.

An exercise cell first sets its answer variable to ``None``; the student replaces the
``raise NotImplementedError`` that follows with code. The check cell after it calls a
``check_*`` function, which reports "not attempted" for ``None`` and never stops the notebook,
unless ``PDLAB_STRICT_CHECKS=1`` (set when the solutions are executed in tests and course runs),
where anything but a pass raises ``AssertionError``.

Per-notebook checks live in submodules (``pdlab.exercises.nb02`` for notebook 02, ...).

When ``PDLAB_EXPECTED_LOG`` names a file, every check appends its exercise name and expected value
to it (one JSON object per line): the answer-not-on-the-page test uses it to look for the expected
values in a student copy's text and outputs.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["CheckResult", "check_close", "check_pair", "check_true", "report", "strict_mode", "record_expected", "PASSED",
           "FAILED", "NOT_ATTEMPTED", "EXPECTED_LOG_ENV"]

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
EXPECTED_LOG_ENV = "PDLAB_EXPECTED_LOG"
_SYMBOL = {PASSED: "✅", FAILED: "❌", NOT_ATTEMPTED: "⏳"}


@dataclass(frozen=True, repr=False)
class CheckResult:
    """The outcome of one exercise check."""

    exercise: str
    status: str
    message: str

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __str__(self) -> str:
        return f"{_SYMBOL[self.status]} {self.exercise}: {self.status.upper()} — {self.message}"

    __repr__ = __str__


def strict_mode() -> bool:
    """True when ``PDLAB_STRICT_CHECKS=1``: a check that does not pass raises."""
    return os.environ.get("PDLAB_STRICT_CHECKS", "") == "1"


def report(result: CheckResult) -> CheckResult:
    """Return a result (its repr is the message); in strict mode raise AssertionError unless it passed."""
    if strict_mode() and not result.passed:
        raise AssertionError(str(result))
    return result


def record_expected(exercise: str, expected: Any, kind: str = "value") -> None:
    """Append ``expected`` to the file named by ``PDLAB_EXPECTED_LOG`` (no-op when it is unset).

    ``kind`` is "value" for a computed answer, "choice" for an answer picked from options the
    page lists on purpose (a row of a table), and "measured" for a statistic of a live run: the
    leak check reads a "measured" answer at 4 significant digits, because a live lab's page prints
    dozens of 3-digit figures of the same run, and one of them matches the answer by chance (lab 05's
    block scatter, 0.243, matched an unrelated 0.243 on the page in one CI run)."""
    path = os.environ.get(EXPECTED_LOG_ENV)
    if not path:
        return
    try:
        json.dumps(expected)
    except (TypeError, ValueError):
        expected = repr(expected)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"exercise": exercise, "expected": expected, "kind": kind}) + "\n")


def check_close(exercise: str, value: Any, expected: float, *, rel_tol: float = 0.02,
                unit: str = "", hint: str = "", measured: bool = False) -> CheckResult:
    """Check a numeric answer within a relative tolerance; ``None`` means not attempted.
    ``measured``: the expected value is a statistic of a live run (see :func:`record_expected`)."""
    record_expected(exercise, float(expected), "measured" if measured else "value")
    if value is None:
        return report(CheckResult(exercise, NOT_ATTEMPTED, "set the answer variable and run the cell"))
    try:
        got = float(value)
    except (TypeError, ValueError):
        return report(CheckResult(exercise, FAILED, f"expected a number, got {type(value).__name__}"))
    if math.isclose(got, expected, rel_tol=rel_tol):
        within = "exact" if rel_tol < 1e-6 else f"within {rel_tol * 100:g}%"
        return report(CheckResult(exercise, PASSED, f"{got:,.6g} {unit} ({within})"))
    msg = f"got {got:,.6g} {unit}, not within {rel_tol * 100:g}% of the expected value."
    return report(CheckResult(exercise, FAILED, f"{msg} {hint}".strip()))


def check_pair(exercise: str, value: Any, expected: tuple[float, float], *, labels: tuple[str, str], pair: str,
               variables: str, passed: str, hint: str, fmt: str = ",.6g", abs_tol: float = 0.0) -> CheckResult:
    """Check a pair of numbers, each within 1e-6 relative (``abs_tol`` absolute) of ``expected``, a
    statistic of a live run (recorded as measured). ``labels`` name each number in a failure, ``pair``
    names both in a type error, ``variables`` the answer variables; ``passed`` is the message on
    success, formatted with the two numbers (``"{0:.1f} … {1:.4g}"``), and ``hint`` follows a failure."""
    for x in expected:
        record_expected(exercise, float(x), "measured")
    if value is None or (isinstance(value, tuple | list) and all(v is None for v in value)):
        return report(CheckResult(exercise, NOT_ATTEMPTED, f"set {variables} and run the cell"))
    try:
        got = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        return report(CheckResult(exercise, FAILED, f"expected a pair of numbers ({pair}), got {value!r}"))
    if len(got) != 2:
        return report(CheckResult(exercise, FAILED, f"expected a pair of numbers ({pair}), got {len(got)} values"))
    wrong = [f"{label}: got {g:{fmt}}" for label, g, e in zip(labels, got, expected, strict=True)
             if not math.isclose(g, e, rel_tol=1e-6, abs_tol=abs_tol)]
    if not wrong:
        return report(CheckResult(exercise, PASSED, passed.format(*got)))
    return report(CheckResult(exercise, FAILED, "; ".join(wrong) + ". " + hint))


def check_true(exercise: str, value: Any, ok: bool, *, good: str, bad: str,
               expected: Any = None, choice: bool = False) -> CheckResult:
    """Report a pass when ``ok`` holds (``value`` None = not attempted); ``expected`` (optional) is
    the reference answer, recorded for the answer-not-on-the-page test (``choice``: picked from
    options the page lists, see :func:`record_expected`)."""
    if expected is not None:
        record_expected(exercise, expected, "choice" if choice else "value")
    if value is None:
        return report(CheckResult(exercise, NOT_ATTEMPTED, "set the answer variable and run the cell"))
    return report(CheckResult(exercise, PASSED if ok else FAILED, good if ok else bad))
