"""Sim-to-real's first stage: probe a live deployment, fit what the probes measured (lab 05, lab 07).

- :mod:`~pdlab.simreal.probes.plan` — what to measure: :class:`ProbePlan`, :data:`PROBE_PLANS` by profile;
- :mod:`~pdlab.simreal.probes.run` — :func:`calibrate` runs a plan through the live probes of
  :mod:`pdlab.serve.probes` and :mod:`pdlab.serve.pair_probes` and fits their points
  (:mod:`pdlab.simreal.fit`) into a :class:`~pdlab.simreal.calibration.Calibration`;
  :func:`fit_prefill_model` fits the prefill model the proxy's admission predicts with.

A package of its own inside :mod:`pdlab.simreal`: it sits above the live serving layer it measures
through, while the records, fits and replays of :mod:`pdlab.simreal` sit below it (the schedulers
and the peer comparisons use them). Nothing runs at import time.
"""

from pdlab.simreal.probes.plan import PROBE_PLANS, ProbePlan
from pdlab.simreal.probes.run import (
    admission_from,
    calibrate,
    contention_from,
    fit_prefill_model,
    handoff_rows,
    stall_rows,
    step_points,
)

__all__ = [
    # plan
    "ProbePlan", "PROBE_PLANS",
    # run
    "calibrate", "step_points", "handoff_rows", "stall_rows", "contention_from", "admission_from",
    "fit_prefill_model",
]
