"""Deployments: one colocated vLLM server, N colocated replicas behind vllm-router, or xPyD
prefill/decode servers behind the proxy.

Each is a context manager that starts everything, waits for health, and stops every process on
every path (normal exit, exception, Ctrl-C; ``atexit`` and SIGTERM through
:mod:`pdlab.process`). Servers of a deployment start in parallel (start-up dominates).

The same hardware used two ways, as lab 01 compares them: two colocated replicas, one per core / GPU,
behind ``vllm-router`` in plain round-robin mode (:func:`colocated_replicas`), vs prefill on core / GPU
``"0"`` + decode on ``"1"`` (:func:`disaggregated`). :func:`colocated` alone defaults to the whole
budget (cores ``"0-1"``, or GPUs ``"0,1"`` with tensor parallel 2).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pdlab.paths import build_dir
from pdlab.process import (
    ManagedProcess,
    ServerStartError,
    check_port_free,
    free_port,
    parse_cpu_list,
    pinned,
    spawn,
    wait_http_ok,
)
from pdlab.serve.engines.vllm import VLLMServer, VLLMServerSpec, detect_serve_device
from pdlab.serve.engines.vllm_router import ROUTER_POLICIES, start_vllm_router_workers
from pdlab.serve.measure.evidence import MetricsSnapshot, scrape_metrics

__all__ = ["Deployment", "DeployPorts", "RolePlacement", "colocated", "colocated_replicas", "disaggregated",
           "replica_places", "start_proxy"]


def start_proxy(prefill_urls: Sequence[str], decode_urls: Sequence[str], *, port: int = 8000,
                read_timeout_s: float = 30.0, log_dir: str | Path | None = None,
                timeout_s: float = 30.0, extra_args: Sequence[str] = ()) -> ManagedProcess:
    """Run ``python -m pdlab.serve.proxy`` as a managed process; wait until it listens.

    ``extra_args`` go to the proxy as they are, e.g. ``["--admission-profile", P, "--ttft-slo", "1.0",
    "--tokenizer", DIR]`` for early rejection (:mod:`pdlab.serve.proxy.admission`).
    """
    check_port_free(port, what="disaggregation proxy")
    log = Path(log_dir or build_dir() / "serve") / f"proxy-{port}.log"
    argv = [sys.executable, "-m", "pdlab.serve.proxy", "--port", str(port), "--read-timeout", str(read_timeout_s),
            "--prefill", *prefill_urls, "--decode", *decode_urls, *extra_args]
    proc = spawn(f"proxy-{port}", argv, log)
    try:
        wait_http_ok(proc, f"http://127.0.0.1:{port}/proxy/stats", timeout_s, poll_s=0.2)
    except BaseException:
        proc.stop()
        raise
    return proc


class Deployment:
    """Servers (and a proxy) started together; ``url`` is where clients send requests."""

    #: The front doors a deployment can have in front of its servers: the course's P/D proxy, or
    #: vllm-router in plain mode over colocated servers (:func:`colocated_replicas`).
    FRONT_DOORS = ("proxy", "vllm-router")

    def __init__(self, kind: str, servers: list[VLLMServer], proxy_port: int | None = None,
                 proxy_read_timeout_s: float = 30.0, ready_timeout_s: float = 600.0, warmup: bool = True,
                 front_door: str = "proxy", router_policy: str = "round_robin"):
        if front_door not in self.FRONT_DOORS:
            raise ValueError(f"front_door must be one of {self.FRONT_DOORS}, got {front_door!r}")
        self.kind = kind
        self.servers = servers
        self.proxy_port = proxy_port
        self.front_door = front_door
        self.router_policy = router_policy
        self.proxy_read_timeout_s = proxy_read_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.warmup = warmup
        self.proxy: ManagedProcess | None = None
        self.startup_s: float | None = None
        self.warmup_s: float | None = None

    @property
    def prefill(self) -> list[VLLMServer]:
        return [s for s in self.servers if s.spec.role == "prefill"]

    @property
    def decode(self) -> list[VLLMServer]:
        return [s for s in self.servers if s.spec.role == "decode"]

    @property
    def url(self) -> str:
        if self.proxy_port is not None:
            return f"http://127.0.0.1:{self.proxy_port}"
        return self.servers[0].url

    def start(self) -> Deployment:
        """Start all servers in parallel, wait for all, then the proxy. Stops everything on failure."""
        t0 = time.monotonic()
        try:
            for server in self.servers:
                server.start()
            for server in self.servers:
                server.wait_ready(self.ready_timeout_s)
            if self.proxy_port is not None and self.front_door == "vllm-router":
                self.proxy = start_vllm_router_workers([s.url for s in self.servers], port=self.proxy_port,
                                                       policy=self.router_policy).proc
            elif self.proxy_port is not None:
                self.proxy = start_proxy([s.url for s in self.prefill], [s.url for s in self.decode],
                                         port=self.proxy_port, read_timeout_s=self.proxy_read_timeout_s)
            self.startup_s = time.monotonic() - t0
            if self.warmup:
                self.warmup_s = self.warm_up()
        except BaseException:
            self.stop()
            raise
        return self

    def warm_up(self, rounds: int = 2, timeout_s: float = 300.0, proxy_attempts: int = 3) -> float:
        """Send short requests to every server, then through the entry point; return the seconds spent.

        The first forward passes of a fresh server, and the first KV pull between two instances
        (NIXL handshake), pay one-off costs that must not land in a measurement. A proxied
        request that fails is retried (up to ``proxy_attempts``): on a cold machine the first
        handshake can outlast the proxy's read timeout. A warm-up that still fails raises
        :class:`ServerStartError` naming the request, the proxy's answer and every log's tail.
        """
        import json
        import urllib.error
        import urllib.request

        t0 = time.monotonic()
        model = self.servers[0].spec.served_model_name or self.served_model()

        def post(url: str, i: int) -> None:
            body = {"model": model, "prompt": f"warm up {i} " * (20 + 60 * i), "max_tokens": 4, "ignore_eos": True}
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                resp.read()

        def fail(url: str, exc: Exception) -> ServerStartError:
            answer = exc.read().decode(errors="replace")[:500] if isinstance(exc, urllib.error.HTTPError) else ""
            logs = [f"--- {s.spec.role} {s.url} log {s.log_path}:\n{s.log_tail(15)}" for s in self.servers]
            if self.proxy is not None:
                logs.append(f"--- proxy {self.url} log {self.proxy.log_path}:\n{self.proxy.log_tail(15)}")
            return ServerStartError(f"warm-up request to {url} failed: {type(exc).__name__}: {exc} {answer}\n"
                                    + "\n".join(logs))

        for i in range(rounds):
            for server in self.servers:
                try:
                    post(server.url, i)
                except OSError as exc:  # URLError and HTTPError included
                    raise fail(server.url, exc) from exc
        if self.proxy_port is not None:
            for i in range(rounds * (max(len(self.prefill), len(self.decode)) or len(self.servers))):
                for attempt in range(1, proxy_attempts + 1):
                    try:
                        post(self.url, i)
                        break
                    except OSError as exc:  # URLError and HTTPError included
                        if attempt == proxy_attempts or not self.alive():
                            raise fail(self.url, exc) from exc
        return time.monotonic() - t0

    def served_model(self) -> str:
        """The model id the servers answer to (``GET /v1/models`` of the first server)."""
        import json
        import urllib.request

        with urllib.request.urlopen(self.servers[0].url + "/v1/models", timeout=30) as resp:
            return json.loads(resp.read())["data"][0]["id"]

    def stop(self) -> None:
        """Stop the proxy and every server (each by its own process group). Idempotent."""
        if self.proxy is not None:
            self.proxy.stop()
        for server in self.servers:
            server.stop()

    def alive(self) -> bool:
        return all(s.alive() for s in self.servers) and (self.proxy is None or self.proxy.alive())

    def decode_metrics(self) -> MetricsSnapshot:
        """One ``/metrics`` snapshot summed over the decode servers (the colocated server if none)."""
        targets = self.decode or self.servers
        return MetricsSnapshot(tuple(sample for s in targets for sample in scrape_metrics(s.url).samples))

    def restart_proxy(self, extra_args: Sequence[str] = ()) -> ManagedProcess:
        """Stop the proxy (a killed one too) and start it again on its port, with ``extra_args``."""
        if self.proxy_port is None or self.front_door != "proxy":
            raise ValueError(f"this deployment has no proxy (front door: {self.front_door if self.proxy_port else None})")
        if self.proxy is not None:
            self.proxy.stop()
        self.proxy = start_proxy([s.url for s in self.prefill], [s.url for s in self.decode], port=self.proxy_port,
                                 read_timeout_s=self.proxy_read_timeout_s, extra_args=extra_args)
        return self.proxy

    def metrics_by_role(self) -> dict[str, MetricsSnapshot]:
        """One ``/metrics`` snapshot per role (``colocated``, ``prefill``, ``decode``), summed over its servers."""
        out: dict[str, list] = {}
        for s in self.servers:
            out.setdefault(s.spec.role, []).extend(scrape_metrics(s.url).samples)
        return {role: MetricsSnapshot(tuple(samples)) for role, samples in out.items()}

    def processes(self) -> list[ManagedProcess]:
        procs = [s.process for s in self.servers if s.process is not None]
        return procs + ([self.proxy] if self.proxy is not None else [])

    def front_end_pids(self) -> list[int]:
        """PIDs of the processes that speak HTTP: each server's API process (not its engine core,
        which is a child process) and the proxy."""
        return [p.pid for p in self.processes()]

    @contextlib.contextmanager
    def decode_cores_reserved(self, *, client: bool = True):
        """While the block runs, the decode cores hold the decode engines alone (CPU deployments).

        Every front-end process (both roles' API servers and the proxy) and, with ``client``, the
        calling process (the benchmark client) run on the prefill servers' cores instead of
        floating over all of them; each gets its own affinity back afterwards. On 2 cores this
        is the layout that leaves the decode step as its probe measured it (lab 05, issue 26).
        """
        if not (self.prefill and self.decode) or any(s.spec.resolved_device() != "cpu" or not s.spec.cores
                                                     for s in self.servers):
            raise ValueError("decode_cores_reserved needs a disaggregated CPU deployment with cores set per server, "
                             f"got {self.describe()}")
        front = set().union(*(parse_cpu_list(s.spec.cores) for s in self.prefill))
        decode = set().union(*(parse_cpu_list(s.spec.cores) for s in self.decode))
        if front & decode:
            raise ValueError(f"prefill cores {sorted(front)} and decode cores {sorted(decode)} overlap: "
                             "nothing to reserve")
        with pinned(self.front_end_pids() + ([os.getpid()] if client else []), front):
            yield front

    @contextlib.contextmanager
    def engine_cores_reserved(self, *, client: bool = True):
        """While the block runs, a colocated CPU server's engine holds its cores alone.

        The server's API process and, with ``client``, the calling process (the benchmark client)
        run on the cores this process may use that the engine does not (``spec.cores``, e.g.
        engine on ``"0"``, front end and client on core 1 of a 2-core machine); each gets its own
        affinity back afterwards. On the course's 2-core VM an engine whose OpenMP threads span both
        cores has two step levels about 2× apart; one engine thread on a core of its own has one
        (notes/host/colocated_step_modes.py, lab 05).
        """
        if self.kind != "colocated" or any(s.spec.resolved_device() != "cpu" or not s.spec.cores
                                           for s in self.servers):
            raise ValueError("engine_cores_reserved needs a colocated CPU deployment with its cores set, "
                             f"got {self.describe()}")
        engine = set().union(*(parse_cpu_list(s.spec.cores) for s in self.servers))
        spare = os.sched_getaffinity(0) - engine
        if not spare:
            raise ValueError(f"the engine has every core this process may use ({sorted(engine)}): "
                             "no core left for the front end")
        with pinned(self.front_end_pids() + ([os.getpid()] if client else []), spare):
            yield spare

    def describe(self) -> str:
        lines = [f"{self.kind} deployment, entry point {self.url}"]
        for s in self.servers:
            place = f"cores {s.spec.cores}" if s.spec.resolved_device() == "cpu" else f"GPUs {s.spec.gpus}"
            lines.append(f"  {s.spec.role:<9} {s.url}  {place}  log {s.log_path}")
        if self.proxy is not None:
            door = "proxy" if self.front_door == "proxy" else f"vllm-router ({self.router_policy})"
            lines.append(f"  {door:<9} {self.url}  log {self.proxy.log_path}")
        return "\n".join(lines)

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Deployment {self.kind} {self.url}>"


def _defaults(device: str) -> tuple[str | None, str | None, str | None]:
    """(all, first half, second half) placement strings for cores or GPUs."""
    if device == "cuda":
        return "0,1", "0", "1"
    return "0-1", "0", "1"


def colocated(model: str | Path, *, port: int = 8100, cores: str | None = None, gpus: str | None = None,
              device: str = "auto", ready_timeout_s: float = 600.0, warmup: bool = True,
              **spec_kwargs) -> Deployment:
    """One server doing prefill and decode, on the whole budget (both cores / both GPUs)."""
    dev = detect_serve_device() if device == "auto" else device
    all_, _, _ = _defaults(dev)
    spec = VLLMServerSpec(model=str(model), role="colocated", port=port, device=dev,
                          cores=cores if cores is not None else (all_ if dev == "cpu" else None),
                          gpus=gpus if gpus is not None else (all_ if dev == "cuda" else None), **spec_kwargs)
    return Deployment("colocated", [VLLMServer(spec)], ready_timeout_s=ready_timeout_s, warmup=warmup)


def replica_places(count: int, device: str, places: Sequence[str] | None = None) -> list[str]:
    """Where each of ``count`` replicas runs: ``places`` (one entry each, taskset cores or GPU ids), else
    replica ``i`` on core / GPU ``i``. ValueError when the count is wrong or two replicas share a core / GPU."""
    if count < 1:
        raise ValueError(f"need at least one replica, got {count}")
    chosen = [str(i) for i in range(count)] if places is None else [str(p) for p in places]
    if len(chosen) != count:
        raise ValueError(f"need one placement per replica ({count}), got {chosen}")
    if device == "cpu":
        sets = [set(parse_cpu_list(p)) for p in chosen]
        shared = sorted({c for i, a in enumerate(sets) for b in sets[i + 1:] for c in a & b})
        if shared:
            raise ValueError(f"replicas {chosen} share cores {shared}: each engine needs cores of its own")
    elif len(set(chosen)) != len(chosen):
        raise ValueError(f"replicas {chosen} share a GPU: each engine needs GPUs of its own")
    return chosen


def colocated_replicas(model: str | Path, *, count: int = 2, places: Sequence[str] | None = None,
                       port: int = 8000, replica_port: int = 8100, policy: str = "round_robin",
                       device: str = "auto", ready_timeout_s: float = 600.0, warmup: bool = True,
                       **spec_kwargs) -> Deployment:
    """``count`` colocated servers, each on cores / GPUs of its own, behind ``vllm-router`` in plain mode.

    The router listens on ``port`` (the entry point) and sends each request whole to one replica by
    ``policy`` (``round_robin``: in turn). Replica ``i`` listens on ``replica_port + i`` and runs on
    ``places[i]`` (default: core / GPU ``i``; on a CPU its whole process tree, API server included, stays
    there). On the course's 2-core machine that is the same hardware as 1P1D: two engines, one per core.
    ``spec_kwargs`` go to every server's :class:`~pdlab.serve.engines.vllm.VLLMServerSpec`.
    """
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"unknown vllm-router policy {policy!r}; choose one of {', '.join(ROUTER_POLICIES)}")
    dev = detect_serve_device() if device == "auto" else device
    chosen = replica_places(count, dev, places)
    ports = [replica_port + i for i in range(count)]
    if port in ports:
        raise ValueError(f"the router's port {port} is one of the replicas' ports {ports}")
    servers = [VLLMServer(VLLMServerSpec(model=str(model), role="colocated", port=p, device=dev,
                                         cores=place if dev == "cpu" else None,
                                         gpus=place if dev == "cuda" else None, **spec_kwargs))
               for p, place in zip(ports, chosen, strict=True)]
    return Deployment(f"{count} replicas", servers, proxy_port=port, ready_timeout_s=ready_timeout_s,
                      warmup=warmup, front_door="vllm-router", router_policy=policy)


@dataclass(frozen=True)
class DeployPorts:
    """TCP ports on 127.0.0.1 of a disaggregated deployment.

    ``proxy``: the entry point clients send to. ``prefill`` / ``decode``: the first server of each
    role; server ``i`` of a role listens on ``prefill + i`` / ``decode + i``. ``side_channel``: the
    first NIXL side-channel port; each server takes the next one up (prefill servers first).
    """

    proxy: int = 8000
    prefill: int = 8100
    decode: int = 8200
    side_channel: int = 5600

    def layout(self, n_prefill: int, n_decode: int) -> tuple[list[int], list[int], list[int]]:
        """The ports of ``n_prefill`` prefill and ``n_decode`` decode servers: (prefill ports, decode
        ports, side channels, prefill servers' first). ValueError when two ports of the deployment coincide."""
        pre = [self.prefill + i for i in range(n_prefill)]
        dec = [self.decode + i for i in range(n_decode)]
        side = [self.side_channel + k for k in range(n_prefill + n_decode)]
        every = [self.proxy, *pre, *dec, *side]
        if len(set(every)) != len(every):
            raise ValueError(f"ports collide: proxy {self.proxy}, prefill {pre}, decode {dec}, side channels {side}")
        return pre, dec, side

    @classmethod
    def free(cls, max_per_role: int = 8) -> DeployPorts:
        """Ports that are free right now for up to ``max_per_role`` servers of each role (tests and notebooks,
        beside other servers): one block of consecutive free ports outside the ephemeral range
        (:func:`~pdlab.process.free_port`), so the second server's ports are free too and no engine
        started first can take them."""
        first = free_port(count=1 + 4 * max_per_role)
        return cls(proxy=first, prefill=first + 1, decode=first + 1 + max_per_role,
                   side_channel=first + 1 + 2 * max_per_role)


@dataclass(frozen=True)
class RolePlacement:
    """How many servers one role (prefill or decode) has, and where each runs.

    ``count``: servers of the role. ``cores``: CPU cores of each server, taskset list syntax (``"0"``,
    ``"0-1"``), used on a CPU deployment; ``gpus``: GPU ids of each, ``CUDA_VISIBLE_DEVICES`` syntax
    (``"0"``, ``"0,1"``), used on a GPU deployment. Either one entry per server or one string for all
    of them; None: the role's half of the budget (prefill core/GPU ``0``, decode core/GPU ``1``).
    """

    count: int = 1
    cores: Sequence[str] | str | None = None
    gpus: Sequence[str] | str | None = None

    def places(self, device: str, default: str | None) -> list[str | None]:
        """One placement per server on ``device`` (``"cpu"``: cores, else GPUs); ``default`` for None."""
        value = self.cores if device == "cpu" else self.gpus
        if value is None or isinstance(value, str):
            return [value if value is not None else default] * self.count
        if len(value) != self.count:
            raise ValueError(f"need {self.count} placements, got {list(value)}")
        return list(value)


def disaggregated(model: str | Path, *, connector: str = "nixl", prefill: RolePlacement | None = None,
                  decode: RolePlacement | None = None, ports: DeployPorts | None = None, device: str = "auto",
                  proxy_read_timeout_s: float = 30.0, ready_timeout_s: float = 600.0, warmup: bool = True,
                  **spec_kwargs) -> Deployment:
    """``prefill.count`` prefill + ``decode.count`` decode servers with a KV connector, behind the proxy.

    ``prefill`` / ``decode``: each role's :class:`RolePlacement` (default one server on the role's
    half of the budget); ``ports``: :class:`DeployPorts` (default 8000, 8100, 8200, side channels from
    5600; :meth:`DeployPorts.free` beside other servers). ``spec_kwargs`` go to every server's
    :class:`~pdlab.serve.engines.vllm.VLLMServerSpec` (``max_model_len=...``).
    """
    dev = detect_serve_device() if device == "auto" else device
    _, first, second = _defaults(dev)
    prefill, decode = prefill or RolePlacement(), decode or RolePlacement()
    ports = ports or DeployPorts()
    base = VLLMServerSpec(model=str(model), connector=connector, device=dev, **spec_kwargs)
    if connector == "example" and base.storage_path is None:
        store = build_dir() / "kv-store" / f"{ports.prefill}"
        store.mkdir(parents=True, exist_ok=True)
        base = replace(base, storage_path=str(store))
    pre_ports, dec_ports, sides = ports.layout(prefill.count, decode.count)
    roles = [("prefill", port, place) for port, place in zip(pre_ports, prefill.places(dev, first), strict=True)]
    roles += [("decode", port, place) for port, place in zip(dec_ports, decode.places(dev, second), strict=True)]
    servers = [VLLMServer(replace(base, role=role, port=port, side_channel_port=side,
                                  cores=place if dev == "cpu" else None, gpus=place if dev == "cuda" else None,
                                  extra_args=list(base.extra_args), extra_env=dict(base.extra_env)))
               for (role, port, place), side in zip(roles, sides, strict=True)]
    if not servers:
        raise ServerStartError("no servers to start")
    return Deployment(f"{prefill.count}P{decode.count}D-{connector}", servers, proxy_port=ports.proxy,
                      proxy_read_timeout_s=proxy_read_timeout_s, ready_timeout_s=ready_timeout_s, warmup=warmup)
