"""vLLM's ``NixlConnector`` with a NIXL progress thread that sleeps between polls.

Loaded by vLLM itself, inside the server's processes, never by the course's own code: the
``--kv-transfer-config`` that :func:`pdlab.serve.engines.vllm.kv_transfer_config` writes for a CPU server
names ``"kv_connector": "NixlConnector"`` and ``"kv_connector_module_path":
"pdlab.serve.engines.nixl_connector"``. vLLM (0.32, ``kv_connector/factory.py``) imports a connector
class from an external module path before its own registry, so the class keeps vLLM's name and
every configuration check keyed on the name ``NixlConnector`` still applies.

Why it exists. NIXL's Python API (``nixl_cu12/_api.py``, ``nixl_agent.__init__``, NIXL 1.5.1)
builds every agent with ``agentConfig.pthrDelay = 0``: the agent's progress thread polls its
backends in a loop that never sleeps. vLLM's NIXL worker creates one agent per engine worker,
so an *idle* 1P1D deployment keeps one core per worker busy (measured on the course's 2-core
machine: 0.70–1.0 of a core per agent with no request in flight; ``docs/LIVE_LABS.md`` has the
commands). On a GPU node with spare host cores that trades a core for latency; on a 2-core CPU
it takes the cores the engines compute on, and every disaggregated number measures the spinner.
Turning the thread off is not an option: transfers then never complete.

What it changes, two things and nothing else:

1. **The progress thread's delay.** Before vLLM's worker creates its agent, the agent class
that vLLM's NIXL worker uses (``base_worker.NixlWrapper``) is replaced by :class:`PacedNixlAgent`,
a ``nixl_agent`` whose configuration clamps ``pthrDelay`` to
``kv_connector_extra_config["progress_thread_delay_us"]`` (µs; default
:data:`DEFAULT_PROGRESS_DELAY_US`). The swap happens in the server process that loaded this
module and nowhere else.
2. **The forward thread's core.** On a CPU, vLLM's NIXL worker (``base_worker.py``, "reserve
different cores for start_load_kv() from model_forward()") calls ``os.sched_setaffinity(0,
[last core of each NUMA node])`` from the thread that then runs the model. ``0`` means the
calling thread, so the *forward* thread moves to the last core, whatever
``VLLM_CPU_OMP_THREADS_BIND`` said. On a 2-core machine the prefill worker's compute thread left
core 0 for core 1, where the decode worker computes: both roles shared one core and core 0
idled (measured with ``/proc/PID/task/TID/status``; docs/LIVE_LABS.md). The worker-side
connector here restores the thread's affinity after vLLM's constructor returns
(``restore_forward_affinity``, default on; ``false`` in the extra config keeps vLLM's pinning).
"""

from __future__ import annotations

import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker as _vllm_nixl_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlConnector as _VLLMNixlConnector,
)
from vllm.distributed.nixl_utils import NixlWrapper as _nixl_agent

__all__ = ["NixlConnector", "PacedNixlAgent", "DEFAULT_PROGRESS_DELAY_US", "EXTRA_CONFIG_KEY",
           "RESTORE_AFFINITY_KEY"]

DEFAULT_PROGRESS_DELAY_US = 1000
"""Progress-thread sleep between polls, µs, when the extra config does not name one."""

EXTRA_CONFIG_KEY = "progress_thread_delay_us"
RESTORE_AFFINITY_KEY = "restore_forward_affinity"


class PacedNixlAgent(_nixl_agent):  # type: ignore[misc, valid-type]
    """A ``nixl_agent`` whose progress thread sleeps ``progress_delay_us`` µs between polls."""

    progress_delay_us: int = DEFAULT_PROGRESS_DELAY_US

    def __init__(self, agent_name: str, nixl_conf: Any = None, instantiate_all: bool = False):
        bind = _nixl_api().nixlBind
        stock = bind.nixlAgentConfig
        delay = int(self.progress_delay_us)

        class _PacedConfig(stock):  # the C++ config; only its pthrDelay setter differs
            @property
            def pthrDelay(self) -> int:  # noqa: N802 (NIXL's field name)
                return stock.pthrDelay.__get__(self)

            @pthrDelay.setter
            def pthrDelay(self, value: int) -> None:  # noqa: N802
                stock.pthrDelay.__set__(self, max(int(value), delay))

        bind.nixlAgentConfig = _PacedConfig
        try:
            super().__init__(agent_name, nixl_conf, instantiate_all)
        finally:
            bind.nixlAgentConfig = stock


def _nixl_api():
    """The module that defines ``nixl_agent`` (``nixl_cu12._api`` or its CUDA 13/ROCm sibling)."""
    import sys

    return sys.modules[_nixl_agent.__module__]


class NixlConnector(_VLLMNixlConnector):
    """vLLM's NixlConnector whose NIXL agents use :class:`PacedNixlAgent`."""

    def __init__(self, vllm_config, role, kv_cache_config):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        delay = int(extra.get(EXTRA_CONFIG_KEY, DEFAULT_PROGRESS_DELAY_US))
        if delay < 0:
            raise ValueError(f"{EXTRA_CONFIG_KEY} must be >= 0 µs, got {delay}")
        PacedNixlAgent.progress_delay_us = delay
        _vllm_nixl_worker.NixlWrapper = PacedNixlAgent
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        super().__init__(vllm_config, role, kv_cache_config)
        if affinity is not None and bool(extra.get(RESTORE_AFFINITY_KEY, True)):
            os.sched_setaffinity(0, affinity)  # this thread runs the model: back to its own cores
