"""Sim-to-real: calibrate the simulator on a live engine, replay the live workload, measure the error.

The stages, in the order a reader follows them:

1. :mod:`~pdlab.simreal.probes` — runs the live probes (:mod:`pdlab.serve.probes` and
   :mod:`pdlab.serve.pair_probes`, which need a server and fit nothing) and hands their typed points to
2. :mod:`~pdlab.simreal.fit` (the probe's step-time, hand-off and stall fits) and
   :mod:`~pdlab.simreal.runfit` (the same calibration refitted on one live run);
3. :mod:`~pdlab.simreal.calibration` — the typed :class:`Calibration` and its profile file;
4. :mod:`~pdlab.simreal.replay` — the simulator set up like the live deployment, applying every term
   of a calibration (lab 05 and ``pdlab simulate --profile`` both run it);
5. :mod:`~pdlab.simreal.compare` — errors per run, held-out validation across rates, the host's floor;
   :mod:`~pdlab.simreal.validation` — sim-vs-real statistics (TOST, KS, MAPE).

Apart: :mod:`~pdlab.simreal.steps`, :mod:`~pdlab.simreal.gpu_profile` and
:mod:`~pdlab.simreal.gpu_profile_files` measure and fit step times on a GPU (notebooks 01, 03);
the comparison with NVIDIA AIConfigurator is :mod:`pdlab.peers.aic_compare`.
"""

from pdlab.simreal.calibration import Calibration, StepPoint, load_calibration, save_calibration
from pdlab.simreal.compare import (
           HeldOut,
           HostFloor,
           compare_runs,
           error_table,
           heldout_validation,
           host_floor,
)
from pdlab.simreal.fit import fit_profile
from pdlab.simreal.replay import replay, requests_from_records
from pdlab.simreal.runfit import fit_on_run

__all__ = ["StepPoint", "fit_profile", "fit_on_run", "Calibration", "save_calibration", "load_calibration", "replay",
           "requests_from_records", "compare_runs", "error_table", "heldout_validation", "HeldOut", "host_floor",
           "HostFloor"]
