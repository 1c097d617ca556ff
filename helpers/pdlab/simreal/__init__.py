"""Sim-to-real: how the simulator is calibrated on real engines and how far it is from them.

Pure code only (the live probes are :mod:`pdlab.serve.probes`): :mod:`~pdlab.simreal.records`
(what a calibration measured, as typed records), :mod:`~pdlab.simreal.calibrate` (fits, replays
like the live set-ups, error tables; lab 05), :mod:`~pdlab.simreal.validation` (sim-vs-real
statistics),
:mod:`~pdlab.simreal.steps`, :mod:`~pdlab.simreal.gpu_profile` and
:mod:`~pdlab.simreal.gpu_profile_files` (step times measured and fitted on a GPU box;
notebooks 01, 03).
"""
