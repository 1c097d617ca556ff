"""SGLang prefill/decode disaggregation behind ``smg launch --pd-disaggregation``.

On a GPU box: real SGLang servers (``python -m sglang.launch_server --disaggregation-mode
prefill|decode --disaggregation-transfer-backend mooncake|nixl ...``), one GPU each, behind the
real gateway. On a machine without a GPU (or without SGLang), SGLang cannot run; the same gateway
is put in front of clearly labelled stand-in workers (:mod:`pdlab.serve.engines.standin`) so that its
routing and its bootstrap fields can be seen on the wire.

The gateway is ``smg`` (Shepherd Model Gateway, PyPI ``smg`` 1.13, a Rust binary with a Python
launcher), the successor of ``sglang-router``; its PD flags (``--pd-disaggregation``,
``--prefill URL [BOOTSTRAP_PORT]``, ``--decode URL``, ``--policy``) are sglang-router's. Server
flags are those of SGLang 0.5 (``python/sglang/srt/server_args.py``).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdlab.paths import build_dir
from pdlab.process import ManagedProcess, check_port_free, free_port, spawn, wait_http_ok

__all__ = [
    "sglang_status",
    "sglang_server_argv",
    "router_argv",
    "SGLangPD",
    "gpu_commands",
]


def sglang_status() -> tuple[bool, str]:
    """``(can_run, reason)``: SGLang needs its package and a CUDA GPU."""
    if importlib.util.find_spec("sglang") is None:
        return False, ("the sglang package is not installed: its PyPI wheels pin CUDA builds of torch, "
                       "flashinfer and sglang-kernel, and its CPU route needs a source build for Intel AMX Xeons")
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA GPU is visible: SGLang's PD mode moves KV between GPUs"
    except Exception as exc:  # torch missing or broken
        return False, f"torch is not usable: {exc}"
    return True, "SGLang and a GPU are available"


def sglang_server_argv(model: str, mode: str, port: int, *, transfer_backend: str = "mooncake",
                       bootstrap_port: int = 8998, gpu_id: int = 0, ib_device: str | None = None,
                       extra: list[str] | None = None, python: str = sys.executable) -> list[str]:
    """The command line of one SGLang server in PD ``mode`` (``prefill`` or ``decode``)."""
    if mode not in ("prefill", "decode"):
        raise ValueError(f"mode must be prefill or decode, got {mode!r}")
    if transfer_backend not in ("mooncake", "nixl", "fake"):
        raise ValueError(f"transfer backend must be mooncake, nixl or fake, got {transfer_backend!r}")
    argv = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1", "--port", str(port),
            "--disaggregation-mode", mode, "--disaggregation-transfer-backend", transfer_backend,
            "--base-gpu-id", str(gpu_id)]
    if mode == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    if ib_device:
        argv += ["--disaggregation-ib-device", ib_device]
    return argv + list(extra or [])


def router_argv(port: int, prefill: list[tuple[str, int | None]], decode: list[str], *,
                prometheus_port: int | None = None, policy: str = "round_robin",
                prefill_policy: str | None = None, shutdown_grace_s: int | None = None,
                python: str = sys.executable) -> list[str]:
    """``python -m smg launch --pd-disaggregation ...``: the gateway and its metrics on 127.0.0.1.

    ``prefill`` pairs each prefill URL with its KV bootstrap port (None: none); ``policy`` picks the
    workers of both pools, ``prefill_policy`` (None: ``policy``) the prefill worker, for example
    ``cache_aware`` (smg's radix tree of the text it sent each worker); ``prometheus_port`` None keeps
    smg's default (29000); ``shutdown_grace_s`` None keeps smg's wait for in-flight requests on
    SIGTERM (180 s)."""
    argv = [python, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
            "--pd-disaggregation", "--policy", policy]
    if prefill_policy is not None:
        argv += ["--prefill-policy", prefill_policy]
    for url, bport in prefill:
        argv += ["--prefill", url] + ([str(bport)] if bport is not None else [])
    for url in decode:
        argv += ["--decode", url]
    argv += ["--prometheus-host", "127.0.0.1"]
    if prometheus_port is not None:
        argv += ["--prometheus-port", str(prometheus_port)]
    if shutdown_grace_s is not None:
        argv += ["--shutdown-grace-period-secs", str(shutdown_grace_s)]
    return argv


def gpu_commands(model: str, *, transfer_backend: str = "mooncake", prefill_port: int = 31001,
                 decode_port: int = 31002, bootstrap_port: int = 8998, router_port: int = 30000,
                 ib_device: str | None = None) -> list[str]:
    """The shell commands of a 1P1D SGLang deployment on GPUs 0 and 1 (for people to copy)."""
    pre = sglang_server_argv(model, "prefill", prefill_port, transfer_backend=transfer_backend,
                             bootstrap_port=bootstrap_port, gpu_id=0, ib_device=ib_device, python="python")
    dec = sglang_server_argv(model, "decode", decode_port, transfer_backend=transfer_backend, gpu_id=1,
                             ib_device=ib_device, python="python")
    rtr = router_argv(router_port, [(f"http://127.0.0.1:{prefill_port}", bootstrap_port)],
                      [f"http://127.0.0.1:{decode_port}"], python="python")
    bench = (f"pdlab bench --url http://127.0.0.1:{router_port} --workload interference --rate 4 --duration 60 "
             f"--tokenizer {model} --slo-ttft 2 --slo-tpot 0.1")
    return [shlex.join(pre), shlex.join(dec), shlex.join(rtr), bench]


@dataclass
class SGLangPD:
    """xPyD SGLang (or stand-ins) behind ``smg``; a context manager that stops everything.

    ``prometheus_port`` None: a free port (smg always serves metrics; its default port may be taken)."""

    model: str | None = None  # None → stand-in workers
    n_prefill: int = 1
    n_decode: int = 1
    transfer_backend: str = "mooncake"
    router_port: int = 30000
    prefill_port: int = 31001
    decode_port: int = 31101
    bootstrap_port: int = 8998
    prometheus_port: int | None = None
    policy: str = "round_robin"
    prefill_policy: str | None = None  # None: ``policy``; "cache_aware": smg's prefix-affine routing
    ib_device: str | None = None
    token_interval_s: float = 0.005
    ready_timeout_s: float = 900.0
    log_dir: Path = field(default_factory=lambda: build_dir() / "serve" / "sglang")
    processes: list[ManagedProcess] = field(default_factory=list)

    @property
    def stand_in(self) -> bool:
        return self.model is None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def prefill_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.prefill_port + i}" for i in range(self.n_prefill)]

    def decode_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.decode_port + i}" for i in range(self.n_decode)]

    def wire_log(self, role: str, i: int = 0) -> Path:
        return self.log_dir / f"wire-{role}-{i}.jsonl"

    def _worker_argv(self, role: str, i: int) -> list[str]:
        port = (self.prefill_port if role == "prefill" else self.decode_port) + i
        bport = self.bootstrap_port + i
        if self.stand_in:
            argv = [sys.executable, "-m", "pdlab.serve.engines.standin", "--role", role, "--port", str(port),
                    "--wire-log", str(self.wire_log(role, i)), "--token-interval", str(self.token_interval_s)]
            return argv + (["--bootstrap-port", str(bport)] if role == "prefill" else [])
        gpu = i if role == "prefill" else self.n_prefill + i
        return sglang_server_argv(self.model, role, port, transfer_backend=self.transfer_backend,
                                  bootstrap_port=bport, gpu_id=gpu, ib_device=self.ib_device)

    def start(self) -> SGLangPD:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            workers = []
            for role, n in (("prefill", self.n_prefill), ("decode", self.n_decode)):
                for i in range(n):
                    port = (self.prefill_port if role == "prefill" else self.decode_port) + i
                    check_port_free(port, what=f"{role} worker")
                    if self.stand_in:
                        self.wire_log(role, i).unlink(missing_ok=True)
                    label = f"{'standin' if self.stand_in else 'sglang'}-{role}-{i}"
                    proc = spawn(label, self._worker_argv(role, i), self.log_dir / f"{label}.log")
                    self.processes.append(proc)
                    workers.append((proc, f"http://127.0.0.1:{port}/health"))
            for proc, health in workers:
                wait_http_ok(proc, health, self.ready_timeout_s)
            check_port_free(self.router_port, what="smg")
            argv = router_argv(self.router_port, [(u, self.bootstrap_port + i) for i, u in enumerate(self.prefill_urls())],
                               self.decode_urls(), prometheus_port=self.prometheus_port or free_port(),
                               policy=self.policy, prefill_policy=self.prefill_policy, shutdown_grace_s=5)
            router = spawn("smg", argv, self.log_dir / "router.log")
            self.processes.append(router)
            wait_http_ok(router, f"{self.url}/health", 120.0)
        except BaseException:
            self.stop()
            raise
        return self

    def prefill_worker_of(self, prompts: Sequence[str]) -> list[int]:
        """For each prompt text, the index of the prefill stand-in that received it (from the wire
        logs); -1 for a prompt no prefill worker received. Stand-ins only (real SGLang keeps no
        wire log)."""
        if not self.stand_in:
            raise RuntimeError("prefill_worker_of reads the stand-ins' wire logs; real SGLang workers keep none")
        from pdlab.serve.engines.standin import read_wire_log

        where: dict[str, int] = {}
        for i in range(self.n_prefill):
            for entry in read_wire_log(self.wire_log("prefill", i)):
                body = entry.get("body") or {}
                if entry.get("method") == "POST" and isinstance(body, dict) and isinstance(body.get("prompt"), str):
                    where.setdefault(body["prompt"], i)
        return [where.get(p, -1) for p in prompts]

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()

    def __enter__(self) -> SGLangPD:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
