"""Engine launchers: start, check and stop the servers a lab measures.

- :mod:`~pdlab.serve.engines.vllm` — one vLLM server and its KV-connector config;
  :mod:`~pdlab.serve.engines.deploy` — colocated and xPyD deployments behind the P/D proxy;
- :mod:`~pdlab.serve.engines.sglang` — SGLang PD commands; :mod:`~pdlab.serve.engines.standin` — the
  SGLang stand-ins that speak its PD wire protocol on a CPU;
- :mod:`~pdlab.serve.engines.dynamo` — NVIDIA Dynamo's frontend and mocker workers (lab 08);
  :mod:`~pdlab.serve.engines.vllm_router` — vLLM's Rust router;
- :mod:`~pdlab.serve.engines.modelbuild` — the tiny Llama-shaped model the CPU servers load.

Their names are re-exported here. Two modules are loaded by path, never through this file:
``nixl_connector`` (the CPU NIXL connector vLLM imports by module path; it imports vLLM) and
``dynamo_forward`` (the namespace forwarder, run as a process). Nothing starts at import time.
"""

from pdlab.serve.engines import deploy, dynamo, modelbuild, sglang, standin, vllm, vllm_router
from pdlab.serve.engines.deploy import *  # noqa: F403 - the names listed in deploy.__all__
from pdlab.serve.engines.dynamo import *  # noqa: F403 - the names listed in dynamo.__all__
from pdlab.serve.engines.modelbuild import *  # noqa: F403 - the names listed in modelbuild.__all__
from pdlab.serve.engines.sglang import *  # noqa: F403 - the names listed in sglang.__all__
from pdlab.serve.engines.standin import *  # noqa: F403 - the names listed in standin.__all__
from pdlab.serve.engines.vllm import *  # noqa: F403 - the names listed in vllm.__all__
from pdlab.serve.engines.vllm_router import *  # noqa: F403 - the names listed in vllm_router.__all__

__all__ = [*vllm.__all__, *deploy.__all__, *sglang.__all__, *standin.__all__, *dynamo.__all__,
           *vllm_router.__all__, *modelbuild.__all__]
