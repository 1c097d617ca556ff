"""``pdlab bench``: an async streaming benchmark client for OpenAI-compatible servers.

Requests come from :mod:`pdlab.workloads` (token counts and arrival times: Poisson, gamma-bursty,
or a trace's own schedule such as Mooncake's); prompts are synthesised to *exact* token counts
with the server's tokenizer; each request is streamed (``/v1/completions`` or
``/v1/chat/completions``) and becomes a :class:`pdlab.metrics.RequestRecord`, summarised by
:func:`pdlab.metrics.summarize` (TTFT, TPOT, ITL, E2E, SLO attainment, goodput).

Timing follows ``vllm bench serve`` (``vllm/benchmarks/lib/endpoint_request_func.py``, vLLM 0.32):
the clock starts just before the HTTP request is sent; TTFT is the first streamed chunk carrying
a choice; every later chunk adds one inter-token gap; the request's latency ends at its last
content chunk; output tokens come from the server's ``usage`` (``stream_options.include_usage``).
Stricter than vLLM in one place: a stream that ends without ``[DONE]`` or with an ``error`` event
is a failed request (vLLM would count it as a success if one chunk arrived).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord, json_default, summarize, write_records
from pdlab.paths import build_dir
from pdlab.serve.client.streaming import outcome_record, run_sync, stream_request
from pdlab.workloads import Request, gamma_arrivals, make_requests, named_workload, with_rate
from pdlab.workloads.tokens import single_token_words

__all__ = [
    "PromptSynthesizer",
    "ClientOptions",
    "BenchResult",
    "interference_requests",
    "build_workload",
    "server_models",
    "server_model",
    "run_requests",
    "run_bench",
    "retry_after_s",
    "retry_counts",
    "format_summary",
]

_ENDPOINTS = ("completions", "chat")


# ---------------------------------------------------------------- prompts of exact token counts
class PromptSynthesizer:
    """Random prompts of an exact number of tokens for a given tokenizer.

    A string of words that are each one token after a space (:func:`pdlab.workloads.tokens.single_token_words`)
    has exactly one token per word: the synthesiser draws ``n`` of them and verifies the count;
    where a tokenizer merges across words it trims and re-encodes until the count is exact.
    """

    def __init__(self, tokenizer_path: str | Path):
        from tokenizers import Tokenizer

        path = Path(tokenizer_path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"no tokenizer.json at {file}: pass --tokenizer DIR (a model folder)")
        self.tokenizer = Tokenizer.from_file(str(file))
        self.words = [" " + w for w in single_token_words(self.tokenizer)]
        if len(self.words) < 50:
            raise ValueError(f"tokenizer {file} has too few single-token words ({len(self.words)})")

    def count(self, text: str) -> int:
        """Tokens in ``text`` (without special tokens)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt(self, n_tokens: int, rng: np.random.Generator) -> str:
        """A random prompt of exactly ``n_tokens`` tokens."""
        if n_tokens < 1:
            raise ValueError(f"a prompt needs at least one token, got {n_tokens}")
        picks = rng.integers(0, len(self.words), size=n_tokens)
        text = "".join(self.words[i] for i in picks)
        for _ in range(20):
            have = self.count(text)
            if have == n_tokens:
                return text
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            if have > n_tokens:
                text = self.tokenizer.decode(ids[:n_tokens])
            else:
                text += "".join(self.words[i] for i in rng.integers(0, len(self.words), size=n_tokens - have))
        raise ValueError(f"could not make a prompt of exactly {n_tokens} tokens with this tokenizer")


# ---------------------------------------------------------------- workloads
def interference_requests(n: int, rate_rps: float, *, short_prompt: int = 64, short_output: int = 96,
                          long_prompt: int = 1536, long_output: int = 4, long_every: int = 4,
                          arrival: str = "poisson", cv: float = 1.0, seed: int = 0,
                          shuffle_long: bool = False) -> list[Request]:
    """Decode-heavy requests with a long-prompt request every ``long_every``-th arrival.

    With ``shuffle_long`` the same number of long prompts sit at random arrivals (seeded by ``seed``):
    a round-robin front door over replicas would otherwise send every long prompt to the same one
    whenever the replica count divides ``long_every``.

    Long prefills land while the short requests are decoding: on a colocated server each one
    stalls every running decode for the length of its prefill (ITL spikes); a disaggregated
    deployment runs them on the prefill instance and leaves decode's ITL alone.
    """
    if long_every < 1:
        raise ValueError(f"long_every must be >= 1, got {long_every}")
    arrivals = gamma_arrivals(rate_rps, n, cv=cv if arrival == "gamma" else 1.0, seed=seed)
    is_long = (np.arange(n) % long_every) == (long_every - 1)
    if shuffle_long:
        is_long = np.random.default_rng([seed, 1]).permutation(is_long)
    prompts = np.where(is_long, long_prompt, short_prompt)
    outputs = np.where(is_long, long_output, short_output)
    return make_requests(arrivals, prompts, outputs)


def build_workload(name: str, *, rate_rps: float, n: int | None = None, duration_s: float | None = None,
                   arrival: str = "poisson", cv: float = 1.0, seed: int = 0,
                   max_prompt_tokens: int | None = None, max_output_tokens: int | None = None,
                   use_trace_schedule: bool = False) -> list[Request]:
    """Requests for a named workload.

    ``name``: ``interference``, ``fixed-P-O``, ``sharegpt``, ``mooncake-conversation``,
    ``mooncake-synthetic`` (see :data:`pdlab.workloads.WORKLOADS`). The count is ``n`` or
    ``rate × duration``. Arrivals: ``poisson`` or ``gamma`` (burstiness ``cv``) at ``rate_rps``;
    with ``use_trace_schedule`` a Mooncake trace keeps its own timestamps (the first ``n``
    requests, from time 0). Token counts are clipped to ``max_prompt_tokens``/``max_output_tokens``.
    """
    if n is None:
        if duration_s is None:
            raise ValueError("give n or duration_s")
        n = max(1, int(round(rate_rps * duration_s)))
    if arrival not in ("poisson", "gamma"):
        raise ValueError(f"arrival must be poisson or gamma, got {arrival!r}")
    if name == "interference":
        reqs = interference_requests(n, rate_rps, arrival=arrival, cv=cv, seed=seed)
    elif use_trace_schedule and name.startswith("mooncake-"):
        from pdlab.workloads import mooncake_trace_path, read_mooncake_jsonl

        trace = read_mooncake_jsonl(mooncake_trace_path(name.split("-", 1)[1]), limit=n)
        t0 = trace[0].arrival_s if trace else 0.0
        reqs = [Request(i, r.arrival_s - t0, r.prompt_tokens, r.output_tokens, r.hash_ids)
                for i, r in enumerate(trace)]
    else:
        reqs = named_workload(name, n, rate_rps, seed)
        if arrival == "gamma":
            reqs = with_rate(reqs, rate_rps, seed=seed, arrival="gamma", cv=cv)
    out = []
    for r in reqs:
        p = min(r.prompt_tokens, max_prompt_tokens) if max_prompt_tokens else r.prompt_tokens
        o = min(r.output_tokens, max_output_tokens) if max_output_tokens else r.output_tokens
        out.append(Request(r.request_id, r.arrival_s, max(1, p), max(1, o), r.hash_ids))
    return out


# ---------------------------------------------------------------- the client
def server_models(url: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The model cards of ``GET {url}/v1/models`` (vLLM's carry ``id``, ``root``, ``max_model_len``)."""
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout_s) as resp:
        return json.loads(resp.read())["data"]


def server_model(url: str, timeout_s: float = 10.0) -> tuple[str, str | None]:
    """``(model id, local folder or None)`` from ``GET {url}/v1/models``."""
    first = server_models(url, timeout_s)[0]
    root = first.get("root") or first["id"]
    return first["id"], root if Path(root).is_dir() else None


@dataclass(frozen=True)
class ClientOptions:
    """How the benchmark client talks to the server: the same for every request of a run.

    ``endpoint``: ``"completions"`` (``/v1/completions``) or ``"chat"`` (``/v1/chat/completions``).
    ``model``: the model id sent in each request (None: the server's first, ``GET /v1/models``).
    ``tokenizer``: a model folder (or ``tokenizer.json``) whose tokenizer builds prompts of exact
    token counts (None: the server's model folder, when it is a local one).
    ``ignore_eos``: ask the server to generate exactly ``max_tokens`` (vLLM's ``ignore_eos``).
    ``request_timeout_s``: the longest silence while reading a streamed response (s).
    ``extra_body``: more JSON fields merged into every request body (None: none).
    ``max_retries``: how many times a request refused with HTTP 503 and ``Retry-After`` is sent again,
    each after the seconds the server gave (capped at ``max_retry_after_s``); 0: never. The record
    keeps the first attempt's send time as its arrival, so its TTFT includes the waits.
    """

    endpoint: str = "completions"
    model: str | None = None
    tokenizer: str | Path | None = None
    ignore_eos: bool = True
    request_timeout_s: float = 300.0
    extra_body: dict[str, Any] | None = None
    max_retries: int = 0
    max_retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.endpoint not in _ENDPOINTS:
            raise ValueError(f"endpoint must be completions or chat, got {self.endpoint!r}")
        if self.max_retries < 0 or not self.max_retry_after_s >= 0:
            raise ValueError(f"max_retries and max_retry_after_s must be ≥ 0, got {self.max_retries} and "
                             f"{self.max_retry_after_s}")

    def payload(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The JSON body of one streamed request for ``model`` (the resolved id)."""
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}, "temperature": 0.0}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra_body or {})
        return body


def retry_after_s(error: str, headers: dict[str, str]) -> float | None:
    """Seconds a refused request should wait before it is sent again: an HTTP 503's ``Retry-After``
    (delta-seconds), else None (not a refusal to retry).

    >>> retry_after_s("HTTP 503: overloaded", {"Retry-After": "2"}), retry_after_s("HTTP 500: x", {"Retry-After": "2"})
    (2.0, None)
    """
    value = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    if not error.startswith("HTTP 503") or value is None:
        return None
    try:
        wait = float(value)
    except ValueError:
        return None  # an HTTP date or garbage: not a delay this client can honour
    return wait if wait >= 0 and math.isfinite(wait) else None


async def _one(session, url: str, body: dict[str, Any], req: Request, bar, client: ClientOptions) -> RequestRecord:
    """Send one request (streamed), again after each ``Retry-After`` refusal while retries are left;
    its record, with absolute ``perf_counter`` times. ``extra``: ``rejections`` (503s with
    ``Retry-After`` received) and ``retries`` (attempts after the first)."""
    sent = time.perf_counter()
    rejections = retries = 0
    while True:
        outcome = await stream_request(session, url, body, timeout_s=client.request_timeout_s)
        wait = None if outcome.ok else retry_after_s(outcome.error or "", outcome.headers or {})
        if wait is None:
            break
        rejections += 1
        if retries >= client.max_retries:
            break
        retries += 1
        await asyncio.sleep(min(wait, client.max_retry_after_s))
    rec = outcome_record(outcome, request_id=req.request_id, sent_s=sent, prompt_tokens=req.prompt_tokens,
                         extra={"target_output_tokens": req.output_tokens, "rejections": rejections,
                                "retries": retries})
    if bar is not None:
        bar.update(1)
    return rec


async def run_requests(url: str, requests: Sequence[Request], *, client: ClientOptions | None = None,
                       max_concurrency: int | None = None, progress: bool = True, seed: int = 0,
                       should_stop: Callable[[], bool] | None = None,
                       prompts: Sequence[str] | None = None) -> list[RequestRecord]:
    """Send ``requests`` at their arrival times (seconds from now); return one record each.

    ``client``: endpoint, model, tokenizer, time-out … (:class:`ClientOptions`; default: its
    defaults). ``max_concurrency``: requests in flight at most (None: no limit). ``seed``: of the
    synthesised prompts. ``should_stop``: checked just before each request is sent; requests not
    sent once it returns True are left out of the result. ``prompts``: one prompt text per request,
    sent instead of synthesised ones (for example prompts that share prefixes,
    :func:`pdlab.serve.engines.dynamo.prefix_prompts`).
    """
    import aiohttp
    from tqdm.auto import tqdm

    client = client or ClientOptions()
    request_timeout_s = client.request_timeout_s
    url = url.rstrip("/")
    model, tokenizer = client.model, client.tokenizer
    if model is None or tokenizer is None:
        served, root = await asyncio.to_thread(server_model, url)
        model = model or served
        tokenizer = tokenizer or root
    if tokenizer is None and prompts is None:
        raise ValueError("the server's model is not a local folder: pass tokenizer=DIR (--tokenizer)")
    if prompts is not None:
        if len(prompts) != len(requests):
            raise ValueError(f"got {len(prompts)} prompts for {len(requests)} requests")
        texts = list(prompts)
    else:
        synth = await asyncio.to_thread(PromptSynthesizer, tokenizer)
        rng = np.random.default_rng(seed)
        texts = [synth.prompt(r.prompt_tokens, rng) for r in requests]
    bodies = [client.payload(model, text, r.output_tokens) for r, text in zip(requests, texts, strict=True)]
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, force_close=False)
    bar = tqdm(total=len(requests), desc="bench", unit="req", disable=not progress, leave=False)

    async def scheduled(session, req: Request, body: dict[str, Any], start: float) -> RequestRecord | None:
        delay = start + req.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is None:
            if should_stop is not None and should_stop():
                return None
            return await _one(session, url, body, req, bar, client)
        async with sem:
            if should_stop is not None and should_stop():
                return None
            return await _one(session, url, body, req, bar, client)

    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            start = time.perf_counter()
            tasks = [asyncio.create_task(scheduled(session, r, b, start)) for r, b in zip(requests, bodies, strict=True)]
            records = await asyncio.gather(*tasks)
    finally:
        bar.close()
    return [r for r in records if r is not None]


@dataclass
class BenchResult:
    """Records, their summary (``pdlab.metrics.summarize``) and the run's settings."""

    records: list[RequestRecord]
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)

    def save(self, out_dir: str | Path | None = None, name: str = "bench") -> dict[str, str]:
        """Write ``<name>-summary.json`` and ``<name>-records.jsonl`` under ``build/bench/``."""
        out = Path(out_dir) if out_dir else build_dir() / "bench"
        out.mkdir(parents=True, exist_ok=True)
        summary_path, records_path = out / f"{name}-summary.json", out / f"{name}-records.jsonl"
        summary_path.write_text(json.dumps({"config": self.config, "summary": self.summary}, indent=2,
                                           default=json_default))
        write_records(self.records, records_path)
        self.paths = {"summary": str(summary_path), "records": str(records_path)}
        return self.paths


def run_bench(url: str, requests: Sequence[Request], *, slo: SLO | None = None, client: ClientOptions | None = None,
              max_concurrency: int | None = None, progress: bool = True, seed: int = 0, save: bool | str = False,
              should_stop: Callable[[], bool] | None = None, prompts: Sequence[str] | None = None) -> BenchResult:
    """Run a benchmark (blocking; works in Jupyter too) and summarise it against ``slo``.

    The other keywords are :func:`run_requests`'s (``client``: :class:`ClientOptions`).
    ``save=True`` (or a name) writes the summary JSON and the records JSONL under ``build/bench/``.
    """
    client = client or ClientOptions()
    records = run_sync(run_requests(url, requests, client=client, max_concurrency=max_concurrency,
                                    progress=progress, seed=seed, should_stop=should_stop, prompts=prompts))
    summary = summarize(records, slo)
    errors = sorted({r.error for r in records if not r.ok})
    summary["errors"] = errors[:10]
    summary.update(retry_counts(records))
    config = {"url": url, "endpoint": client.endpoint, "requests": len(requests), "max_concurrency": max_concurrency,
              "ignore_eos": client.ignore_eos, "slo": None if slo is None else {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s,
                                                                          "e2e_s": slo.e2e_s},
              "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in requests])) if requests else 0.0,
              "mean_output_tokens": float(np.mean([r.output_tokens for r in requests])) if requests else 0.0}
    result = BenchResult(records, summary, config)
    if save:
        result.save(name=save if isinstance(save, str) else "bench")
    return result


def retry_counts(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Requests refused at least once (``rejected``), sent again at least once (``retried``), and
    still failed with a refusal when their retries ran out (``failed_after_retries``)."""
    refused = [r for r in records if r.extra.get("rejections", 0) > 0]
    return {"rejected": len(refused), "retried": sum(r.extra.get("retries", 0) > 0 for r in refused),
            "failed_after_retries": sum(not r.ok for r in refused)}


def format_summary(summary: dict[str, Any], title: str = "benchmark") -> str:
    """A short human-readable table of a summary (milliseconds for latencies)."""
    def ms(key: str) -> str:
        v = summary.get(key)
        return "   n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:8.1f}"

    lines = [f"{title}: {summary['completed']}/{summary['requests']} completed, {summary['failed']} failed, "
             f"{summary['duration_s']:.1f} s, {summary['request_throughput_rps']:.2f} req/s, "
             f"{summary['output_token_throughput_tps']:.0f} output tok/s",
             "            mean      p50      p90      p99   (ms)"]
    for m in ("ttft", "tpot", "itl", "e2e"):
        lines.append(f"  {m.upper():<6} {ms(f'{m}_mean_s')} {ms(f'{m}_p50_s')} {ms(f'{m}_p90_s')} {ms(f'{m}_p99_s')}")
    if "goodput_rps" in summary:
        lines.append(f"  SLO attainment {summary['slo_attainment']:.0%}, goodput {summary['goodput_rps']:.2f} req/s")
    if summary.get("rejected"):
        lines.append(f"  refused (503 + Retry-After) {summary['rejected']}, retried {summary['retried']}, "
                     f"still refused after retries {summary['failed_after_retries']}")
    if summary.get("errors"):
        lines.append(f"  errors: {summary['errors'][:3]}")
    return "\n".join(lines)
