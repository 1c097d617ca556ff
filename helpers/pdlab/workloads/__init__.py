"""Workloads: what arrives at a serving system (notebooks 04, 07, lab 04).

- :mod:`pdlab.workloads.traces` — the :class:`Request` record; Mooncake JSONL (read, write) and
  ShareGPT length traces, validated (:class:`TraceFormatError` names file and line).
- :mod:`pdlab.workloads.synthetic` — Poisson and gamma (bursty) arrivals, synthetic requests,
  named workloads (:data:`WORKLOADS`).
- :mod:`pdlab.workloads.agentic` — multi-turn agent sessions with shared prefixes, and their text.

The names of ``traces`` and ``synthetic`` are re-exported here; import ``agentic`` as a submodule.
"""

from pdlab.workloads.synthetic import (
    WORKLOADS,
    gamma_arrivals,
    make_requests,
    named_workload,
    poisson_arrivals,
    scale_rate,
    synthetic_requests,
    with_rate,
)
from pdlab.workloads.traces import (
    Request,
    TraceFormatError,
    mooncake_trace_path,
    read_mooncake_jsonl,
    read_sharegpt_lengths,
    sharegpt_lengths_path,
    write_mooncake_jsonl,
)

__all__ = [
    "Request",
    "TraceFormatError",
    "read_mooncake_jsonl",
    "write_mooncake_jsonl",
    "read_sharegpt_lengths",
    "mooncake_trace_path",
    "sharegpt_lengths_path",
    "poisson_arrivals",
    "gamma_arrivals",
    "make_requests",
    "synthetic_requests",
    "scale_rate",
    "with_rate",
    "named_workload",
    "WORKLOADS",
]
