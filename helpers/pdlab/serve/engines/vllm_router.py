"""vLLM's own front door, ``vllm-router``, as a managed process, in its two modes.

- PD mode (:func:`start_vllm_router`): ``--vllm-pd-disaggregation`` in front of prefill and decode servers.
- Plain mode (:func:`start_vllm_router_workers`): ``--worker-urls`` in front of N colocated replicas,
  each request sent whole to one of them by ``--policy`` (``round_robin``: worker k, k+1, ... in turn).

The binary is a Rust wheel installed in the course's peers environment (``scripts/install_peers.sh``
→ ``.venv-peers/bin/vllm-router``; ``$PDLAB_PEERS_VENV`` overrides the place). It is started by the
code that needs it, waits for ``/health``, and is stopped on every path (it is a
:class:`~pdlab.process.ManagedProcess`; use it as a context manager)::

    with start_vllm_router(dep.prefill[0].url, dep.decode[0].url, port=free_port()) as router:
        ...  # send OpenAI requests to router.url

With ``--kv-connector nixl`` the router sends each request to the prefill server first with
``kv_transfer_params: {"do_remote_decode": true, ...}`` and ``max_tokens: 1``, then passes the
``kv_transfer_params`` that prefill returned on to the decode server (the same protocol as
:mod:`pdlab.serve.proxy`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from pdlab.paths import build_dir, peers_venv
from pdlab.process import ManagedProcess, ServerStartError, check_port_free, spawn, wait_http_ok

__all__ = ["RouterMissingError", "find_vllm_router", "router_argv", "start_vllm_router", "start_vllm_router_workers",
           "VLLMRouter", "idle_cpu_fraction", "ROUTER_POLICIES", "round_robin_split"]

#: The ``--policy`` values vllm-router 0.1.17 accepts (``vllm-router --help``).
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                   "sticky_least_loaded")


class RouterMissingError(FileNotFoundError):
    """The ``vllm-router`` binary is not installed where the course looks for it."""


def find_vllm_router() -> Path:
    """Path of the ``vllm-router`` binary: ``$PDLAB_PEERS_VENV/bin``, ``<repo>/.venv-peers/bin``, then ``PATH``."""
    venv = peers_venv()
    candidate = venv / "bin" / "vllm-router"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("vllm-router")
    if found:
        return Path(found)
    raise RouterMissingError(f"vllm-router is not installed: looked for {candidate} and on PATH. "
                             f"Run scripts/install_peers.sh (it builds .venv-peers with vllm-router).")


class VLLMRouter:
    """A running ``vllm-router``; ``url`` is the front door. PD mode fills ``prefill`` and ``decode``,
    plain mode ``workers``."""

    def __init__(self, proc: ManagedProcess, port: int, prefill: list[str], decode: list[str],
                 workers: list[str] | None = None, policy: str = "round_robin"):
        self.proc = proc
        self.port = port
        self.prefill = prefill
        self.decode = decode
        self.workers = list(workers or [])
        self.policy = policy
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        self.proc.stop()

    def idle_cpu(self, seconds: float = 3.0) -> float:
        """Fraction of one core the router used over ``seconds`` of idling (all its threads)."""
        return idle_cpu_fraction(self.pid, seconds)

    def __enter__(self) -> VLLMRouter:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        if self.workers:
            return f"VLLMRouter({self.url}, workers={self.workers}, policy={self.policy}, alive={self.alive()})"
        return f"VLLMRouter({self.url}, prefill={self.prefill}, decode={self.decode}, alive={self.alive()})"


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15 of proc(5))


def idle_cpu_fraction(pid: int, seconds: float = 3.0) -> float:
    """CPU time of ``pid`` (user + system, all threads) over ``seconds`` of wall time, as a fraction of a core."""
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = time.monotonic(), _cpu_ticks(pid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), _cpu_ticks(pid)
    return (c1 - c0) / hz / (t1 - t0)


def _urls(value: str | Sequence[str], what: str) -> list[str]:
    urls = [value] if isinstance(value, str) else list(value)
    if not urls:
        raise ValueError(f"vllm-router needs at least one {what} URL, got none")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"{what} URLs must start with http:// or https://, got {bad}")
    return urls


def router_argv(binary: str | Path, *, port: int, prefill: Sequence[str] = (), decode: Sequence[str] = (),
                workers: Sequence[str] = (), kv_connector: str = "nixl", policy: str = "round_robin",
                request_timeout_s: int = 120, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of one vllm-router on 127.0.0.1:``port``.

    ``workers`` (plain mode): ``--worker-urls W1 W2 ...``, each request sent whole to one worker.
    ``prefill`` and ``decode`` (PD mode): ``--vllm-pd-disaggregation --kv-connector ... --prefill P
    --decode D``. Give one mode's URLs, not both; ValueError names what is wrong.
    """
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"unknown vllm-router policy {policy!r}; choose one of {', '.join(ROUTER_POLICIES)}")
    pd_mode = bool(prefill) or bool(decode)
    if pd_mode and workers:
        raise ValueError("give vllm-router either workers (plain mode) or prefill and decode (PD mode), not both")
    argv = [str(binary), "--host", "127.0.0.1", "--port", str(port)]
    if pd_mode:
        prefill_urls, decode_urls = _urls(prefill, "prefill"), _urls(decode, "decode")
        argv += ["--vllm-pd-disaggregation", "--kv-connector", kv_connector]
    else:
        argv += ["--worker-urls", *_urls(workers, "worker")]
    argv += ["--policy", policy, "--request-timeout-secs", str(request_timeout_s), "--log-level", "warning"]
    if pd_mode:
        for url in prefill_urls:
            argv += ["--prefill", url]
        for url in decode_urls:
            argv += ["--decode", url]
    return argv + list(extra_args)


def _launch(argv: list[str], port: int, log: Path, timeout_s: float, **fields) -> VLLMRouter:
    """Start ``argv`` and wait for its ``/health``; stop it on every failure. ``fields`` go to :class:`VLLMRouter`."""
    proc = spawn(f"vllm-router-{port}", argv, log)
    router = VLLMRouter(proc, port, **fields)
    try:
        router.startup_s = wait_http_ok(proc, f"{router.url}/health", timeout_s, poll_s=0.2)
    except BaseException:
        proc.stop()
        raise
    if not proc.alive():
        raise ServerStartError(f"vllm-router exited right after start; log {log}:\n{proc.log_tail()}")
    return router


def start_vllm_router_workers(workers: Sequence[str], *, port: int, policy: str = "round_robin",
                              timeout_s: float = 30.0, request_timeout_s: int = 120,
                              log_dir: str | Path | None = None, extra_args: Sequence[str] = ()) -> VLLMRouter:
    """Start ``vllm-router --worker-urls ...`` (plain mode) on 127.0.0.1:``port`` in front of colocated
    servers; wait until ``/health`` answers. With ``policy="round_robin"`` the k-th request it receives
    goes to worker ``k mod len(workers)`` (the count runs on from the router's start, warm-up included).

    Raises as :func:`start_vllm_router` does; ValueError for a bad URL or policy, before anything starts.
    """
    argv_tail = router_argv("vllm-router", port=port, workers=workers, policy=policy,
                            request_timeout_s=request_timeout_s, extra_args=extra_args)[1:]
    binary = find_vllm_router()
    check_port_free(port, what="vllm-router")
    log = Path(log_dir or build_dir() / "serve") / f"vllm-router-{port}.log"
    return _launch([str(binary), *argv_tail], port, log, timeout_s, prefill=[], decode=[],
                   workers=_urls(workers, "worker"), policy=policy)


def start_vllm_router(prefill: str | Sequence[str], decode: str | Sequence[str], *, port: int,
                      kv_connector: str = "nixl", policy: str = "round_robin", timeout_s: float = 30.0,
                      request_timeout_s: int = 120, log_dir: str | Path | None = None,
                      extra_args: Sequence[str] = ()) -> VLLMRouter:
    """Start ``vllm-router --vllm-pd-disaggregation`` (PD mode) on 127.0.0.1:``port``; wait until ``/health`` answers.

    Raises :class:`RouterMissingError` if the binary is absent, :class:`~pdlab.process.PortInUseError`
    if ``port`` is taken, :class:`~pdlab.process.ServerStartError` (with its log's tail) if it exits or
    does not answer within ``timeout_s``; the process is stopped on every failure.
    """
    binary = find_vllm_router()
    check_port_free(port, what="vllm-router")
    prefill_urls = [prefill] if isinstance(prefill, str) else list(prefill)
    decode_urls = [decode] if isinstance(decode, str) else list(decode)
    argv = router_argv(binary, port=port, prefill=prefill_urls, decode=decode_urls, kv_connector=kv_connector,
                       policy=policy, request_timeout_s=request_timeout_s, extra_args=extra_args)
    log = Path(log_dir or build_dir() / "serve") / f"vllm-router-{port}.log"
    return _launch(argv, port, log, timeout_s, prefill=prefill_urls, decode=decode_urls, policy=policy)


def round_robin_split(records: Sequence, served_prompt_tokens: Sequence[float]) -> tuple[list[list], float]:
    """Which worker of a round-robin router served each request, from the workers' own counters.

    The k-th request the router received, in send order, went to worker ``(k + offset) mod n``; the
    offset (the router's count before the run: warm-up, probes) is the one whose per-worker prompt
    tokens come closest to ``served_prompt_tokens``, each worker's own count over the run (the delta of
    its ``vllm:prompt_tokens_total``, in worker order). ``records``: the run's
    :class:`~pdlab.metrics.RequestRecord`; each counts ``server_prompt_tokens`` where known, else
    ``prompt_tokens``. Returns each worker's records (send order) and the share of the served prompt
    tokens that this split leaves unmatched: 0 when it is exact, more when two requests sent a moment
    apart reached the router in the other order.
    """
    n = len(served_prompt_tokens)
    if n < 1:
        raise ValueError("need the prompt-token count of at least one worker")
    ordered = sorted(records, key=lambda r: r.arrival_s)
    tokens = [r.server_prompt_tokens if r.server_prompt_tokens is not None else r.prompt_tokens for r in ordered]
    total = sum(served_prompt_tokens)
    best: tuple[float, int] | None = None
    for offset in range(n):
        sums = [0.0] * n
        for k, t in enumerate(tokens):
            sums[(k + offset) % n] += t
        miss = sum(abs(a - b) for a, b in zip(sums, served_prompt_tokens, strict=True)) / 2
        if best is None or miss < best[0]:
            best = (miss, offset)
    miss, offset = best
    split = [[r for k, r in enumerate(ordered) if (k + offset) % n == w] for w in range(n)]
    return split, (miss / total if total > 0 else float("nan"))
