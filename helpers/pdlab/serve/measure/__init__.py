"""Measuring a live deployment beside its benchmark.

- :mod:`~pdlab.serve.measure.cpucost` — CPU of process trees, idle and under load;
- :mod:`~pdlab.serve.measure.hostcheck` — does the bare host run a fixed kernel at one speed?
- :mod:`~pdlab.serve.measure.ttft` — TTFT anatomy from the engines' and the proxy's clocks;
- :mod:`~pdlab.serve.measure.evidence` — ``/metrics`` scrapes: KV tokens transferred vs recomputed, prefix hits.

The names other packages use are listed here by module; nothing starts at import time.
"""

from pdlab.serve.measure.cpucost import (
    CPUMeter,
    CPUSampler,
    busiest_threads,
    format_cpu,
    machine_cpu_seconds,
    measure_cpu,
    nixl_agent_idle_cpu,
    own_cpu_seconds,
    tree_processes,
)
from pdlab.serve.measure.evidence import (
    KVTransferEvidence,
    MetricsSnapshot,
    kv_transfer_evidence,
    largest_hit_share,
    parse_prometheus,
    prefix_cache_hit_share,
    scrape_metrics,
)
from pdlab.serve.measure.hostcheck import (
    BAND_SPREAD,
    HostCheck,
    KernelWindows,
    between_checks,
    host_lines,
    kernels,
    measure_host,
)
from pdlab.serve.measure.ttft import (
    COLOCATED_PARTS,
    DISAGG_PARTS,
    BreakdownWindow,
    EngineTimes,
    TTFTBreakdown,
    colocated_breakdown,
    combine_breakdowns,
    disaggregated_breakdown,
    engine_times,
    probe_breakdowns,
    proxy_timings,
    streamed_ttft,
)

__all__ = [
    # cpucost
    "CPUMeter", "CPUSampler", "tree_processes", "own_cpu_seconds", "machine_cpu_seconds", "measure_cpu",
    "busiest_threads", "format_cpu", "nixl_agent_idle_cpu",
    # hostcheck
    "BAND_SPREAD", "kernels", "KernelWindows", "HostCheck", "measure_host", "between_checks", "host_lines",
    # ttft
    "DISAGG_PARTS", "COLOCATED_PARTS", "TTFTBreakdown", "combine_breakdowns", "EngineTimes", "engine_times",
    "disaggregated_breakdown", "colocated_breakdown", "probe_breakdowns", "proxy_timings", "streamed_ttft",
    "BreakdownWindow",
    # evidence
    "parse_prometheus", "scrape_metrics", "MetricsSnapshot", "KVTransferEvidence", "kv_transfer_evidence",
    "prefix_cache_hit_share", "largest_hit_share",
]
