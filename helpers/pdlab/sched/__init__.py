"""Schedulers and their analyses, built on the simulator (notebooks 05, 07, 08, 09).

- :mod:`pdlab.sched.queueing` — DistServe §3.1: M/D/1 TTFT of colocated vs disaggregated prefill.
- :mod:`pdlab.sched.placement` — DistServe's placement search (Alg. 1 and 2): goodput per GPU.
- :mod:`pdlab.sched.conductor` — Mooncake's Conductor: KV-cache-aware prefill scheduling.
- :mod:`pdlab.sched.pools` — Splitwise's heterogeneous prefill/decode pools and the decision guide.
- :mod:`pdlab.sched.admission` — early rejection by predicted TTFT, one policy for the live proxy and the simulator.
- :mod:`pdlab.sched.deploy_export` — a placement written as a Dynamo DynamoGraphDeployment or llm-d overlays.

The names other packages use are listed here by module; nothing runs at import time.
"""

from pdlab.sched.admission import (
    AdmissionDecision,
    EngineState,
    PrefillModel,
    TTFTAdmission,
    replay_admission,
    simulate_admission,
)
from pdlab.sched.conductor import (
    CONDUCTOR_POLICIES,
    Conductor,
    PrefillCostModel,
    compare_policies,
    mooncake_cluster,
)
from pdlab.sched.deploy_export import (
    DYNAMO_FILE,
    EXPORT_TARGETS,
    LLM_D_FILES,
    ROUTER_MODES,
    ExportError,
    ExportOptions,
    dgd_problems,
    dynamo_model_check,
    dynamo_template_check,
    export_placement,
    hf_model_id,
    k8s_object_problems,
    llm_d_problems,
    render,
    render_dynamo,
    render_llm_d,
    template_key_problems,
)
from pdlab.sched.placement import (
    SEARCH_PROFILES,
    ParallelConfig,
    PhaseGoodput,
    Placement,
    SearchSettings,
    colocated_goodput,
    decode_goodput,
    enumerate_configs,
    fits,
    make_env,
    max_rate,
    pair_goodput,
    place,
    prefill_goodput,
)
from pdlab.sched.pools import (
    DECISION_SCENARIOS,
    NexusGPU,
    PoolDesign,
    SplitwiseSLO,
    cheapest_design,
    evaluate_design,
    mode_goodputs,
    nexus_gpu,
    reference_latencies,
)
from pdlab.sched.queueing import (
    avg_ttft_all,
    avg_ttft_inter_op,
    avg_ttft_intra_op,
    avg_ttft_single,
    crossover_rate,
    simulate_all,
    simulate_avg_ttft,
)

__all__ = [
    # queueing
    "avg_ttft_single", "avg_ttft_inter_op", "avg_ttft_intra_op", "avg_ttft_all", "crossover_rate",
    "simulate_avg_ttft", "simulate_all",
    # placement
    "ParallelConfig", "SearchSettings", "PhaseGoodput", "Placement", "SEARCH_PROFILES", "max_rate",
    "enumerate_configs", "prefill_goodput", "decode_goodput", "pair_goodput", "colocated_goodput",
    "make_env", "fits", "place",
    # conductor
    "PrefillCostModel", "mooncake_cluster", "CONDUCTOR_POLICIES", "Conductor", "compare_policies",
    # pools
    "PoolDesign", "SplitwiseSLO", "reference_latencies", "evaluate_design", "cheapest_design",
    "DECISION_SCENARIOS", "mode_goodputs", "NexusGPU", "nexus_gpu",
    # admission
    "PrefillModel", "EngineState", "AdmissionDecision", "TTFTAdmission", "replay_admission",
    "simulate_admission",
    # deploy_export
    "EXPORT_TARGETS", "ROUTER_MODES", "DYNAMO_FILE", "LLM_D_FILES", "ExportError", "ExportOptions",
    "hf_model_id", "render_dynamo", "render_llm_d", "render", "k8s_object_problems", "dgd_problems",
    "llm_d_problems", "dynamo_template_check", "dynamo_model_check", "template_key_problems",
    "export_placement",
]
