"""Engine launchers: start, check and stop the servers a lab measures.

- :mod:`~pdlab.serve.engines.vllm` — one vLLM server and its KV-connector config;
  :mod:`~pdlab.serve.engines.deploy` — colocated and xPyD deployments behind the P/D proxy;
- :mod:`~pdlab.serve.engines.sglang` — SGLang PD commands; :mod:`~pdlab.serve.engines.standin` — the
  SGLang stand-ins that speak its PD wire protocol on a CPU;
- :mod:`~pdlab.serve.engines.dynamo` — NVIDIA Dynamo's frontend and mocker workers (lab 08);
  :mod:`~pdlab.serve.engines.vllm_router` — vLLM's Rust router;
- :mod:`~pdlab.serve.engines.modelbuild` — the tiny Llama-shaped model the CPU servers load.

The names other packages use are listed here by module. Two modules are loaded by path, never through this file:
``nixl_connector`` (the CPU NIXL connector vLLM imports by module path; it imports vLLM) and
``dynamo_forward`` (the namespace forwarder, run as a process). Nothing starts at import time.
"""

from pdlab.serve.engines.deploy import (
    Deployment,
    DeployPorts,
    RolePlacement,
    colocated,
    colocated_replicas,
    disaggregated,
    start_proxy,
)
from pdlab.serve.engines.dynamo import (
    DynamoMissingError,
    MockerSpec,
    dynamo_status,
    find_dynamo_python,
    frontend_prefix_hits,
    mocker_profile_npz,
    start_dynamo,
)
from pdlab.serve.engines.modelbuild import ModelBuild, build_model, needs_dummy_weights, tiny_model_dir
from pdlab.serve.engines.sglang import SGLangPD, gpu_commands, sglang_server_argv, sglang_status
from pdlab.serve.engines.standin import make_standin_app, read_wire_log
from pdlab.serve.engines.vllm import (
    CPU_NIXL_PROGRESS_DELAY_US,
    ROLES,
    VLLMServer,
    VLLMServerSpec,
    detect_serve_device,
    kv_transfer_config,
)
from pdlab.serve.engines.vllm_router import (
    RouterMissingError,
    find_vllm_router,
    start_vllm_router,
    start_vllm_router_workers,
)

__all__ = [
    # vllm
    "ROLES", "VLLMServerSpec", "VLLMServer", "kv_transfer_config", "detect_serve_device",
    "CPU_NIXL_PROGRESS_DELAY_US",
    # deploy
    "Deployment", "DeployPorts", "RolePlacement", "colocated", "colocated_replicas", "disaggregated", "start_proxy",
    # sglang
    "sglang_status", "sglang_server_argv", "SGLangPD", "gpu_commands",
    # standin
    "make_standin_app", "read_wire_log",
    # dynamo
    "DynamoMissingError", "MockerSpec", "find_dynamo_python", "dynamo_status", "start_dynamo",
    "mocker_profile_npz", "frontend_prefix_hits",
    # vllm_router
    "RouterMissingError", "find_vllm_router", "start_vllm_router", "start_vllm_router_workers",
    # modelbuild
    "ModelBuild", "build_model", "tiny_model_dir", "needs_dummy_weights",
]
