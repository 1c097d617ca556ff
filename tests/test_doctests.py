"""The ``>>>`` examples in pdlab's docstrings run and hold (the functions a notebook calls first)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pdlab.hardware",
    "pdlab.models",
    "pdlab.metrics",
    "pdlab.sched.queueing",
    "pdlab.sched.placement",
    "pdlab.simreal.fit",   # contention_factor, admission_overhead_s (the probes' arithmetic)
    "pdlab.simreal.probes.run",   # step_points: the probes' points as the fit reads them
    "pdlab.serve.proxy.plumbing",
    "pdlab.serve.proxy.server",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0, f"{name} has no >>> examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"
