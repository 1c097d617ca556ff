"""Live experiments on a P/D deployment (lab 01's appendix, labs 06 and 07).

- :mod:`~pdlab.serve.experiments.front_doors` — the course's proxy and ``vllm-router`` in front of
  the same pair;
- :mod:`~pdlab.serve.experiments.faults` — a fault injected into one role, and what the client sees;
- :mod:`~pdlab.serve.experiments.overload` — overload with and without early rejection at the proxy.

The names other packages use are listed here by module; nothing starts at import time.
"""

from pdlab.serve.experiments.faults import (
    FAULTS,
    FaultOutcome,
    engine_state,
    reference_text,
    run_fault,
    stream,
    wait_idle,
)
from pdlab.serve.experiments.front_doors import FrontDoorRun, compare_front_doors, p50_ms
from pdlab.serve.experiments.overload import (
    DESIGNS,
    AdmissionSettings,
    is_rejected,
    measure_handoff,
    overload_matrix,
    saturation_capacity,
    save_prefill_profile,
    slo_capacity,
)

__all__ = [
    # faults
    "FAULTS", "FaultOutcome", "stream", "engine_state", "wait_idle", "reference_text",
    "run_fault",
    # front_doors
    "FrontDoorRun", "compare_front_doors", "p50_ms",
    # overload
    "is_rejected", "save_prefill_profile", "measure_handoff", "saturation_capacity",
    "slo_capacity", "AdmissionSettings", "DESIGNS", "overload_matrix",
]
