"""Faults on a live 1P1D deployment: inject one, see what the client gets, check nothing leaked.

Disaggregation adds ways to fail that a single server does not have: a role dies or stalls while
the other waits, the KV hand-off breaks half-way. Each fault here is injected into a running
:class:`pdlab.serve.engines.deploy.Deployment` (one prefill, one decode, the proxy) and measured the same
way (:class:`FaultOutcome`):

- what the client received — the full answer, an SSE ``error`` event, an HTTP error, a closed
  connection — and how long after the fault;
- whether an answer's greedy text equals a single vLLM instance's for the same prompt;
- whether anything leaked: after recovery every engine's ``/metrics`` shows no running or waiting
  request and KV usage back at its idle level;
- whether a process of a killed role was left behind, and whether the next request succeeds once
  the failed role is restarted.

The KV hand-off faults drive the two legs of vLLM's protocol themselves (the proxy's
:func:`~pdlab.serve.proxy.prefill_request` / :func:`~pdlab.serve.proxy.decode_request`), so the
fault lands exactly between them: after the prefill computed the KV, before the decode pulled it.
What the decode does then is its ``kv_load_failure_policy``: ``fail`` or ``recompute``.

:func:`silent_fallback` injects the failure that raises no error at all: a front door that drops
``kv_transfer_params`` (the proxy's ``--drop-kv-transfer-params``). The decode then prefills every
prompt itself; the engines' own counters show it
(:func:`~pdlab.serve.measure.evidence.check_kv_transfer_is_used`), and the client pays in TTFT and
decode speed against the healthy pair.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from pdlab.serve.measure.evidence import KVTransferVerdict, check_kv_transfer_is_used, scrape_metrics
from pdlab.serve.proxy import decode_request, prefill_request

__all__ = ["FAULTS", "StreamOutcome", "FaultOutcome", "stream", "engine_state", "wait_idle", "reference_text",
           "run_fault", "FALLBACK_DOORS", "FallbackRun", "silent_fallback"]

#: The faults, in the order a lab runs them (the last ones restart a server).
FAULTS = ("client disconnects mid-stream", "proxy killed with streams open", "decode killed mid-stream",
          "prefill killed before the KV pull", "prefill frozen past the KV lease")


@dataclass
class StreamOutcome:
    """What one streamed request got: ``kind`` is ``answer`` (ended with ``[DONE]``), ``sse error``
    (an ``error`` event), ``http <status>``, ``closed`` (connection cut without either),
    ``timeout`` or ``left`` (the client disconnected on purpose). Times in seconds (monotonic)."""

    kind: str
    text: str = ""
    tokens: int = 0
    ended_s: float = 0.0
    message: str = ""


def stream(url: str, body: dict[str, Any], *, timeout_s: float = 60.0, after_tokens: int = 0,
           on_tokens: Callable[[], None] | None = None, leave: bool = False) -> StreamOutcome:
    """POST ``body`` (``stream: true``) to ``url + /v1/completions`` and read the SSE stream.

    After ``after_tokens`` chunks with text, ``on_tokens()`` runs (the fault) once; with ``leave``
    the client then closes its connection instead of reading on.
    """
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    out = StreamOutcome("closed")
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            payload = resp.read().decode(errors="replace")
            return StreamOutcome(f"http {resp.status}", message=payload[:300], ended_s=time.monotonic())
        fired = False
        while time.monotonic() < deadline:
            line = resp.readline()
            if not line:
                break
            line = line.decode(errors="replace").strip()
            if not line.startswith("data: "):
                if line.startswith("event: error"):
                    out.kind = "sse error"
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                if out.kind == "closed":
                    out.kind = "answer"
                break
            event = json.loads(data)
            if "error" in event:
                out.kind, out.message = "sse error", json.dumps(event["error"])[:300]
                break
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    out.text += choice["text"]
                    out.tokens += 1
            if not fired and out.tokens >= max(after_tokens, 1) and (on_tokens is not None or leave):
                fired = True
                if on_tokens is not None:
                    on_tokens()
                if leave:
                    out.kind = "left"
                    break
        else:
            out.kind = "timeout"
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        out.kind = "timeout" if isinstance(exc, TimeoutError) else "closed"
        out.message = f"{type(exc).__name__}: {exc}"
    finally:
        out.ended_s = time.monotonic()
        conn.close()
    return out


def engine_state(servers) -> dict[str, float]:
    """Running and waiting requests and KV-cache usage (0–1), summed over ``servers``' ``/metrics``."""
    snaps = [scrape_metrics(s.url) for s in servers]
    return {"running": sum(m.total("vllm:num_requests_running") for m in snaps),
            "waiting": sum(m.total("vllm:num_requests_waiting") for m in snaps),
            "kv_usage": sum(m.total("vllm:kv_cache_usage_perc") for m in snaps)}


def wait_idle(servers, idle_kv: float, timeout_s: float = 15.0) -> tuple[bool, dict[str, float], float]:
    """Poll until no request runs or waits and KV usage is back at ``idle_kv`` (or ``timeout_s``).

    Returns ``(idle, last state, seconds waited)``.
    """
    t0 = time.monotonic()
    state: dict[str, float] = {}
    while True:
        state = engine_state(servers)
        if state["running"] == 0 and state["waiting"] == 0 and state["kv_usage"] <= idle_kv + 1e-9:
            return True, state, time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return False, state, time.monotonic() - t0
        time.sleep(0.25)


def reference_text(server_url: str, body: dict[str, Any]) -> str:
    """The greedy text of ``body`` from one plain vLLM instance (no KV connector involved)."""
    out = stream(server_url, body, timeout_s=60.0)
    if out.kind != "answer":
        raise RuntimeError(f"the reference request to {server_url} failed: {out.kind} {out.message}")
    return out.text


@dataclass
class FaultOutcome:
    """One row of the fault matrix (seconds; ``text_ok`` None when no answer came back)."""

    fault: str
    policy: str
    client: str
    seconds: float
    text_ok: bool | None
    leaked: bool
    left_behind: int
    recovered: bool
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _post_json(url: str, body: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any]]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("POST", parts.path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw or b"{}")
    finally:
        conn.close()


def _in_thread(fn: Callable[[], StreamOutcome]) -> tuple[threading.Thread, dict[str, StreamOutcome]]:
    box: dict[str, StreamOutcome] = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    return thread, box


def _inject(dep, fault: str, body: dict[str, Any], timeout_s: float, lease_s: float) -> tuple[StreamOutcome, float,
                                                                                               list[int], str]:
    """Run ``fault``; return (client outcome, fault time, pids left of a killed role, what was done)."""
    prefill, decode = dep.prefill[0], dep.decode[0]
    mark: dict[str, float] = {}
    left: list[int] = []
    if fault == "client disconnects mid-stream":
        out = stream(dep.url, body, timeout_s=timeout_s, after_tokens=3, leave=True,
                     on_tokens=lambda: mark.setdefault("t", time.monotonic()))
        return out, mark.get("t", out.ended_s), left, "the client closed its connection after 3 tokens"
    if fault in ("proxy killed with streams open", "decode killed mid-stream"):
        victim = dep.proxy if fault.startswith("proxy") else decode.process

        def kill() -> None:
            mark["t"] = time.monotonic()
            victim.kill()

        out = stream(dep.url, body, timeout_s=timeout_s, after_tokens=3, on_tokens=kill)
        time.sleep(0.5)
        left = victim.group_members()
        return out, mark.get("t", out.ended_s), left, f"SIGKILL to the {fault.split()[0]}'s process group after 3 tokens"
    # the hand-off faults: the two legs by hand, the fault between them
    status, pre = _post_json(prefill.url + "/v1/completions", prefill_request(body), timeout_s)
    if status != 200:
        raise RuntimeError(f"the prefill leg failed before the fault: HTTP {status} {pre}")
    dec_body = decode_request(body, pre.get("kv_transfer_params"))
    if fault == "prefill killed before the KV pull":
        mark["t"] = time.monotonic()
        prefill.kill()
        time.sleep(0.5)
        left = prefill.process.group_members()
        out = stream(decode.url, dec_body, timeout_s=timeout_s)
        return out, mark["t"], left, "SIGKILL to the prefill's process group after its leg, before the decode leg"
    if fault == "prefill frozen past the KV lease":
        prefill.freeze()
        mark["t"] = time.monotonic()
        try:
            time.sleep(lease_s + 1.0)
            thread, box = _in_thread(lambda: stream(decode.url, dec_body, timeout_s=timeout_s))
            time.sleep(1.0)
        finally:
            prefill.thaw()
        thread.join(timeout_s + 5)
        return (box.get("out", StreamOutcome("timeout")), mark["t"], left,
                f"SIGSTOP to the prefill for {lease_s + 2:.0f} s (lease {lease_s:g} s), decode leg sent after the lease")
    raise ValueError(f"unknown fault {fault!r}; use one of {', '.join(FAULTS)}")


def _recover(dep, fault: str) -> None:
    if fault == "proxy killed with streams open":
        dep.restart_proxy()
    elif fault == "decode killed mid-stream":
        dep.decode[0].restart()
    elif fault == "prefill killed before the KV pull":
        dep.prefill[0].restart()


def run_fault(dep, fault: str, policy: str, body: dict[str, Any], reference: str, *, idle_kv: float,
              timeout_s: float = 15.0, lease_s: float = 5.0) -> FaultOutcome:
    """Inject ``fault`` into ``dep`` (decode servers started with ``policy``), recover, and measure.

    ``reference``: the greedy text of ``body`` from a plain instance; ``idle_kv``: summed KV usage
    of the idle deployment (what "nothing leaked" returns to).
    """
    out, t_fault, left, what = _inject(dep, fault, body, timeout_s, lease_s)
    seconds = max(out.ended_s - t_fault, 0.0)
    _recover(dep, fault)
    idle, state, _ = wait_idle(dep.servers, idle_kv, timeout_s=timeout_s)
    after = stream(dep.url, {**body, "max_tokens": 4}, timeout_s=60.0)
    return FaultOutcome(fault, policy, out.kind, seconds,
                        (out.text == reference) if out.kind == "answer" else None,
                        leaked=not idle, left_behind=len(left), recovered=after.kind == "answer",
                        detail=f"{what}; client: {out.message or out.kind}; engines after recovery: {state}")


#: The two front doors :func:`silent_fallback` compares, in the order it runs them.
FALLBACK_DOORS = ("healthy proxy", "proxy drops kv_transfer_params")


@dataclass
class FallbackRun:
    """One front door's run in :func:`silent_fallback`: the client's summary (``pdlab.metrics.summarize``,
    seconds), the prompt tokens it sent, and the decode server's verdict from its own ``/metrics``."""

    front_door: str
    summary: dict[str, Any]
    prompt_tokens: int
    verdict: KVTransferVerdict

    @property
    def decode_tokens_per_s(self) -> float:
        """Per-stream decode speed (tokens/s): 1 / the median time per output token after the first."""
        tpot_s = self.summary.get("tpot_p50_s")
        return 1.0 / tpot_s if tpot_s and tpot_s == tpot_s else float("nan")


def silent_fallback(dep, requests, *, port: int, client=None, seed: int = 0) -> dict[str, FallbackRun]:
    """Run ``requests`` through ``dep``'s own proxy, then through a second proxy on ``port`` in front of the
    same servers, started with ``--drop-kv-transfer-params``; return :class:`FallbackRun` by front door
    (:data:`FALLBACK_DOORS`).

    Each run sends its own prompt text (seeds ``seed`` and ``seed + 1``), so the second cannot find the
    first's prompts in a prefix cache. The decode server's ``/metrics`` is scraped before and after each
    run; ``client``: :class:`~pdlab.serve.client.bench.ClientOptions` (None: the defaults).
    """
    from pdlab.serve.client.bench import ClientOptions, run_bench
    from pdlab.serve.engines.deploy import start_proxy

    if not requests:
        raise ValueError("silent_fallback needs at least one request")
    client = client or ClientOptions()
    decode = dep.decode[0]
    runs: dict[str, FallbackRun] = {}
    for k, door in enumerate(FALLBACK_DOORS):
        proxy = None if k == 0 else start_proxy([s.url for s in dep.prefill], [s.url for s in dep.decode], port=port,
                                                extra_args=["--drop-kv-transfer-params"])
        try:
            url = dep.url if proxy is None else f"http://127.0.0.1:{port}"
            before = scrape_metrics(decode.url)
            res = run_bench(url, requests, client=client, progress=False, seed=seed + k)
            after = scrape_metrics(decode.url)
        finally:
            if proxy is not None:
                proxy.stop()
        if res.summary["failed"]:
            raise RuntimeError(f"{res.summary['failed']} requests failed behind the {door}: {res.summary['errors'][:3]}")
        sent = sum(r.server_prompt_tokens or r.prompt_tokens for r in res.records if r.ok)  # the server's count
        runs[door] = FallbackRun(door, res.summary, sent, check_kv_transfer_is_used(before, after, sent))
    return runs
