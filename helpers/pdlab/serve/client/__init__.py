"""The benchmark client: open-loop load against a live server, one record per request.

- :mod:`~pdlab.serve.client.bench` — workloads, arrivals and the run (``pdlab bench``);
- :mod:`~pdlab.serve.client.streaming` — one streamed request → :class:`pdlab.metrics.RequestRecord`;
- :mod:`~pdlab.serve.client.agreement` — the client beside ``vllm bench serve`` on the same requests;
- :mod:`~pdlab.serve.client.prefix_workload` — Mooncake requests whose hash blocks become shared prompt text.

The names other packages use are listed here by module; ``vllm_bench`` (``vllm bench serve`` on a
CPU install) is run as a process. Nothing starts at import time.
"""

from pdlab.serve.client.agreement import (
    BURST_GAP_S,
    PDLAB_TEMPERATURE,
    ClientSamples,
    compare_clients,
    compare_medians,
    merge_vllm_results,
    side_by_side_with_vllm_bench,
)
from pdlab.serve.client.bench import (
    BenchResult,
    ClientOptions,
    PromptSynthesizer,
    build_workload,
    format_summary,
    interference_requests,
    retry_after_s,
    run_bench,
    run_requests,
    server_models,
)
from pdlab.serve.client.prefix_workload import prefix_prompts, shared_prefix_slice
from pdlab.serve.client.streaming import (
    StreamOutcome,
    chunk_token_counts,
    outcome_record,
    request_path,
    run_sync,
    stream_request,
)

__all__ = [
    # bench
    "PromptSynthesizer", "ClientOptions", "BenchResult", "interference_requests", "build_workload",
    "server_models", "run_requests", "run_bench", "retry_after_s", "format_summary",
    # streaming
    "StreamOutcome", "stream_request", "chunk_token_counts", "outcome_record", "request_path", "run_sync",
    # agreement
    "BURST_GAP_S", "PDLAB_TEMPERATURE", "ClientSamples", "merge_vllm_results",
    "side_by_side_with_vllm_bench", "compare_clients", "compare_medians",
    # prefix_workload
    "prefix_prompts", "shared_prefix_slice",
]
