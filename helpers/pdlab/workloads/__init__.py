"""Workloads: what arrives at a serving system (notebooks 04, 07, lab 04).

- :mod:`pdlab.workloads.traces` — the :class:`Request` record; Mooncake JSONL (read, write) and
  ShareGPT length traces, validated (:class:`TraceFormatError` names file and line).
- :mod:`pdlab.workloads.synthetic` — Poisson and gamma (bursty) arrivals, synthetic requests,
  named workloads (:data:`WORKLOADS`).
- :mod:`pdlab.workloads.blocks` — rates run in blocks, in a mirrored order (A1 B1 C1 C2 B2 A2),
  so that a drifting machine biases no rate against another.
- :mod:`pdlab.workloads.agentic` — multi-turn agent sessions with shared prefixes, and their text.

The names of ``traces``, ``synthetic`` and ``blocks`` are re-exported here; import ``agentic`` as a submodule.
"""

from pdlab.workloads import blocks, synthetic, traces
from pdlab.workloads.blocks import *  # noqa: F403 - the names listed in blocks.__all__
from pdlab.workloads.synthetic import *  # noqa: F403 - the names listed in synthetic.__all__
from pdlab.workloads.traces import *  # noqa: F403 - the names listed in traces.__all__

__all__ = [*traces.__all__, *synthetic.__all__, *blocks.__all__]
