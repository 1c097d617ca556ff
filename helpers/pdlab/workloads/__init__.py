"""Workloads: what arrives at a serving system (notebooks 04, 07, lab 04).

- :mod:`pdlab.workloads.traces` — the :class:`Request` record; Mooncake JSONL (read, write) and
  ShareGPT length traces, validated (:class:`TraceFormatError` names file and line).
- :mod:`pdlab.workloads.synthetic` — Poisson and gamma (bursty) arrivals, synthetic requests,
  named workloads (:data:`WORKLOADS`).
- :mod:`pdlab.workloads.blocks` — rates run in blocks, in a mirrored order (A1 B1 C1 C2 B2 A2),
  so that a drifting machine biases no rate against another.
- :mod:`pdlab.workloads.agentic` — multi-turn agent sessions with shared prefixes, and their text.

The names of ``traces``, ``synthetic`` and ``blocks`` other packages use are listed here; import
``agentic`` as a submodule.
"""

from pdlab.workloads.blocks import mirrored_order, split_blocks
from pdlab.workloads.synthetic import (
    WORKLOADS,
    gamma_arrivals,
    make_requests,
    named_workload,
    poisson_arrivals,
    scale_rate,
    stratified_rows,
    synthetic_requests,
    with_rate,
)
from pdlab.workloads.traces import (
    Request,
    TraceFormatError,
    mooncake_trace_path,
    read_mooncake_jsonl,
    read_sharegpt_lengths,
)

__all__ = [
    # traces
    "Request", "TraceFormatError", "read_mooncake_jsonl", "read_sharegpt_lengths", "mooncake_trace_path",
    # synthetic
    "poisson_arrivals", "gamma_arrivals", "make_requests", "synthetic_requests", "stratified_rows",
    "scale_rate", "with_rate", "named_workload", "WORKLOADS",
    # blocks
    "mirrored_order", "split_blocks",
]
