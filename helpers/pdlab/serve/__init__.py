"""Live engines: launch and stop vLLM servers (colocated, prefill, decode), the PD proxy, evidence.

Submodules: ``process`` (process groups, ports, hygiene), ``vllm`` (one vLLM server and its
KV-connector config), ``deploy`` (colocated / xPyD deployments), ``proxy`` (the
``kv_transfer_params`` proxy), ``evidence`` (``/metrics`` → KV tokens transferred vs recomputed),
``sglang`` (SGLang PD commands and the router demo), ``bench`` (the benchmark client, ``pdlab bench``),
``streaming`` (one streamed request → ``RequestRecord``), ``modelbuild`` (the tiny model). Nothing starts
at import time.
"""

from pdlab.process import PortInUseError, ServerStartError, free_port, live_processes, stop_all
from pdlab.serve.deploy import Deployment, DeployPorts, RolePlacement, colocated, disaggregated, start_proxy
from pdlab.serve.evidence import KVTransferEvidence, kv_transfer_evidence, scrape_metrics
from pdlab.serve.vllm import VLLMServer, VLLMServerSpec, kv_transfer_config

__all__ = [
    "Deployment",
    "DeployPorts",
    "RolePlacement",
    "colocated",
    "disaggregated",
    "start_proxy",
    "KVTransferEvidence",
    "kv_transfer_evidence",
    "scrape_metrics",
    "PortInUseError",
    "ServerStartError",
    "free_port",
    "live_processes",
    "stop_all",
    "VLLMServer",
    "VLLMServerSpec",
    "kv_transfer_config",
]
