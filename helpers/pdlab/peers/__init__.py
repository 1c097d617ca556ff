"""The course beside other tools: the same workload or configuration run through a peer, compared.

- :mod:`pdlab.peers.dynamo_compare` — our simulator beside NVIDIA Dynamo's offline trace replay
  (its Rust mocker) on one trace with matched settings (notebook 07, ``benchmarks/bench_sim.py``).
- :mod:`pdlab.peers.dynamo_planner` — Dynamo's planner in that replay beside ``pdlab place``.
- :mod:`pdlab.peers.aic_compare` — the simulator's latency model beside NVIDIA AIConfigurator
  (notebook 05, ``pdlab gpu-profile --annotate``).
- ``dynamo_replay.py`` and ``dynamo_planner_replay.py`` — standalone scripts run by the peers'
  own Python (``.venv-peers``, ``scripts/install_peers.sh``); they import no pdlab.

The names of ``dynamo_compare``, ``dynamo_planner`` and ``aic_compare`` other packages use are listed here.
Nothing runs at import time; the peers' packages are imported only when a comparison runs.
"""

from pdlab.peers.aic_compare import (
    GRIDS,
    REFERENCE_POINTS,
    add_aiconfigurator,
    aic_available,
    aic_comparison,
    aic_estimate,
    pdlab_estimate,
)
from pdlab.peers.dynamo_compare import (
    MECHANISMS,
    METRICS,
    PEER_MODES,
    PeerSettings,
    chunked_prefill_s,
    compare_rows,
    diff_summary,
    disagreements,
    dynamo_engine_args,
    dynamo_metrics,
    dynamo_profile_arrays,
    dynamo_replay_kwargs,
    format_table,
    max_context,
    peers_python,
    prefill_busy_fraction,
    run_dynamo,
    run_pdlab,
    write_dynamo_profile,
    write_trace_slice,
)
from pdlab.peers.dynamo_planner import (
    PlannerRun,
    PlannerUnavailable,
    format_split_table,
    parse_planner_report,
    place_split,
    planner_config,
    planner_replay_kwargs,
    run_dynamo_planner,
    split_rows,
    trace_workload,
)

__all__ = [
    # dynamo_compare
    "PeerSettings", "PEER_MODES", "METRICS", "MECHANISMS", "peers_python", "dynamo_profile_arrays",
    "write_dynamo_profile", "dynamo_engine_args", "dynamo_replay_kwargs", "dynamo_metrics", "run_pdlab",
    "run_dynamo", "compare_rows", "format_table", "disagreements", "write_trace_slice", "chunked_prefill_s",
    "diff_summary", "prefill_busy_fraction", "max_context",
    # dynamo_planner
    "PlannerUnavailable", "PlannerRun", "planner_config", "planner_replay_kwargs", "parse_planner_report",
    "run_dynamo_planner", "trace_workload", "place_split", "split_rows", "format_split_table",
    # aic_compare
    "GRIDS", "REFERENCE_POINTS", "aic_available", "aic_estimate", "pdlab_estimate", "aic_comparison",
    "add_aiconfigurator",
]
