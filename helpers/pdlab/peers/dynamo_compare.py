"""Our simulator beside NVIDIA Dynamo's (the offline trace replay of its Rust mocker), on one trace
with matched settings: workers, KV block size, prefix caching, router, batch limits, KV capacity,
KV link bandwidth, and the same latency model.

The latency model is converted, not hand-tuned: Dynamo's mocker takes a "profile" NPZ (its
``dynamo_profile`` timing provider, what ``--planner-profile-data`` loads) with a 1-D prefill table
(``prefill_isl`` → ``prefill_ttft_ms``, linearly interpolated) and a 2-D decode table
(``decode_active_kv_tokens`` × ``decode_context_length`` → ``decode_itl`` in ms, bilinear).
:func:`dynamo_profile_arrays` fills both tables by calling our model's ``step_time_s`` at the grid
points, so wherever Dynamo asks the same question as our simulator it gets our answer.

Where the two still disagree, the cause is a mechanism, not a number (Dynamo source read:
``lib/mocker/src/common/perf_model.rs`` and ``lib/mocker/src/scheduler/vllm/core.rs`` of
ai-dynamo/dynamo; :data:`MECHANISMS` says which metric each one moves):

- *mixed-step cost* — Dynamo times a pass as prefill time + decode time; our roofline times one
  forward pass over all tokens, max(FLOPs, bytes), so decodes riding on a compute-bound prefill
  chunk cost almost nothing;
- *prefill attention* — Dynamo's prefill table is indexed by the pass's total new tokens
  (batch × (isl − prefix)); a chunk after p earlier tokens, or a prompt after a prefix hit, is
  priced like a fresh prompt of that length, and prompts batched together like one long prompt.
  Ours counts attention as Σ c·(2p + c);
- *decode load* — Dynamo indexes decode by the engine's active KV blocks × block size (all
  running requests, prefix blocks counted once) and the mean context; ours by Σ context of the
  decoding requests and their count;
- *hand-off* — Dynamo adds prompt × KV bytes / bandwidth per request, with no sharing of the
  prefill node's link; ours queues transfers on each prefill instance's link (FIFO) and the
  decode instance reserves the prompt's KV before the pull;
- *cache eviction* — Dynamo's prefix cache is the engine's block pool (free blocks keep their
  content until reused, LRU); ours is an LRU of prefix blocks as large as the KV capacity, kept
  beside the running requests' KV.

A run needs the peers environment (``scripts/install_peers.sh`` → ``.venv-peers``); Dynamo runs in
a subprocess (:mod:`pdlab.peers.dynamo_replay`) and answers in JSON. Everything else here (settings,
conversion, table) works without it.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pdlab.hardware import get_link
from pdlab.metrics import SLO
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.paths import peers_venv
from pdlab.sim.cluster import build_simulator
from pdlab.sim.latency import LatencyModel, kv_capacity_tokens, roofline_latency
from pdlab.workloads import Request

__all__ = ["PeerSettings", "PEER_MODES", "METRICS", "MECHANISMS", "peers_python", "dynamo_profile_arrays",
           "write_dynamo_profile", "dynamo_engine_args", "dynamo_replay_kwargs", "dynamo_metrics",
           "run_pdlab", "run_dynamo", "require_peers_python", "run_in_peers", "compare_rows", "format_table", "disagreements", "write_trace_slice",
           "chunked_prefill_s", "diff_summary",
           "prefill_busy_fraction", "max_context"]

PEER_MODES = ("colocated", "disaggregated")

#: The metrics of the side-by-side table (seconds), in print order.
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "itl_p50_s", "itl_p90_s")

#: Mechanism → (modes it applies to, metrics it moves, one-line reason); printed beside each metric
#: that disagrees.
MECHANISMS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "prefill attention": (PEER_MODES, ("ttft", "tpot", "itl"),
                          "Dynamo prices a prefill chunk (or a prefix-hit suffix) as a fresh prompt of that "
                          "length and a batch of prompts as one long prompt; pdlab counts attention as "
                          "sum c(2p+c). Chunked long prompts are cheaper in Dynamo, batched short ones dearer"),
    "mixed-step cost": (("colocated",), ("tpot", "itl", "ttft"),
                        "Dynamo: pass = prefill time + decode time; pdlab: one roofline pass over all tokens, "
                        "max(FLOPs, bytes), so decodes beside a compute-bound prefill chunk are nearly free"),
    "decode load": (PEER_MODES, ("tpot", "itl"),
                    "Dynamo indexes decode by active KV blocks x block size (all running requests) and the "
                    "mean context; pdlab by the decoding requests' context sum and count"),
    "hand-off": (("disaggregated",), ("ttft", "tpot"),
                 "Dynamo: prompt x KV bytes / bandwidth per request, no link sharing; pdlab: FIFO on each "
                 "prefill link, decode reserves the prompt's KV before the pull"),
    "cache eviction": (PEER_MODES, ("ttft",),
                       "Dynamo's prefix cache is the engine's free block pool (LRU, shrinks under load); "
                       "pdlab's is an LRU of prefix blocks beside the running KV"),
}


def chunked_prefill_s(latency: LatencyModel, prompt_tokens: int, chunk_tokens: int) -> tuple[float, float]:
    """One prompt's prefill compute (seconds) in chunks of ``chunk_tokens``, as pdlab prices it (chunk c
    after p tokens: attention c(2p+c)) and as Dynamo's profile lookup does (each chunk a fresh prompt
    of c tokens, the table filled from the same ``latency``). The gap is the *prefill attention*
    mechanism, measured."""
    if prompt_tokens < 1 or chunk_tokens < 1:
        raise ValueError("prompt_tokens and chunk_tokens must be >= 1")
    ours = theirs = 0.0
    done = 0
    while done < prompt_tokens:
        c = min(chunk_tokens, prompt_tokens - done)
        ours += latency.step_time_s(c, float(c) * (2 * done + c), 0, 0)
        theirs += latency.step_time_s(c, float(c) * c, 0, 0)
        done += c
    return ours, theirs


@dataclass(frozen=True)
class PeerSettings:
    """One deployment described once for both simulators.

    ``mode``: ``colocated`` (``instances`` workers, chunked prefill: pdlab's ``chunked`` scheduler,
    Dynamo's vLLM mocker with chunked prefill) or ``disaggregated`` (``prefill`` + ``decode``
    workers, KV over ``link``). Each worker is ``tp`` GPUs of catalog ``gpu`` serving ``model``
    (bf16, 90 % of memory: KV capacity from :func:`pdlab.sim.latency.kv_capacity_tokens`).
    ``block_tokens``: KV block = prefix-cache block (the Mooncake trace's 512-token hash blocks).
    ``max_batched_tokens``: tokens per pass (pdlab's token budget). Routing is round robin in both.
    ``link`` None: the KV hand-off is instantaneous in both (an ablation of the hand-off model).
    """

    mode: str = "colocated"
    gpu: str = "h100-sxm"
    model: str = "llama-3-70b"
    tp: int = 4
    instances: int = 8
    prefill: int = 4
    decode: int = 4
    block_tokens: int = 512
    prefix_caching: bool = True
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    link: str | None = "ib-ndr"

    def __post_init__(self) -> None:
        if self.mode not in PEER_MODES:
            raise ValueError(f"mode must be one of {', '.join(PEER_MODES)}, got {self.mode!r}")
        for name in ("tp", "instances", "prefill", "decode", "block_tokens", "max_num_seqs", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def latency(self) -> LatencyModel:
        """The per-worker latency model both simulators use (the catalog roofline)."""
        return roofline_latency(self.gpu, self.model, tp=self.tp)

    def kv_capacity_tokens(self) -> int:
        """KV tokens one worker holds, rounded down to whole blocks."""
        cap = kv_capacity_tokens(self.gpu, self.model, self.tp)
        return cap // self.block_tokens * self.block_tokens


def peers_python(root: str | Path | None = None) -> Path | None:
    """The peers environment's python (``$PDLAB_PEERS_VENV`` or ``<repo>/.venv-peers``), or None."""
    venv = Path(root) / ".venv-peers" if root else peers_venv()
    py = venv / "bin" / "python"
    return py if py.exists() else None


def dynamo_profile_arrays(latency: LatencyModel, *, max_prefill_tokens: int, max_kv_tokens: int,
                          max_context: int, max_batch: int, points: int = 96) -> dict[str, np.ndarray]:
    """Dynamo's mocker profile tables from ``latency`` (times in ms, as the NPZ format wants).

    Prefill: one prompt of l tokens, ``step_time_s(l, l², 0, 0)``, at ``points`` lengths from 1 to
    ``max_prefill_tokens`` (geometric). Decode: at active KV x (linear, 0..``max_kv_tokens``) and
    mean context y (geometric, 1..``max_context``) the batch is b = clip(round(x / y), 1,
    ``max_batch``) and the step ``step_time_s(0, 0, b, min(x, b·y))``.
    """
    for name, v in (("max_prefill_tokens", max_prefill_tokens), ("max_kv_tokens", max_kv_tokens),
                    ("max_context", max_context), ("max_batch", max_batch)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    isl = np.unique(np.round(np.geomspace(1, max_prefill_tokens, points)))
    ttft = np.array([latency.step_time_s(int(n), float(n) * n, 0, 0) for n in isl]) * 1e3
    kv = np.linspace(0.0, float(max_kv_tokens), points)
    ctx = np.unique(np.round(np.geomspace(1, max_context, points)))
    itl = np.empty((kv.size, ctx.size))
    for i, x in enumerate(kv):
        for j, y in enumerate(ctx):
            b = int(min(max(round(x / y), 1), max_batch))
            itl[i, j] = latency.step_time_s(0, 0.0, b, int(min(x, b * y)))
    return {"prefill_isl": isl.astype(float), "prefill_ttft_ms": ttft, "decode_active_kv_tokens": kv,
            "decode_context_length": ctx.astype(float), "decode_itl": itl * 1e3}


def write_dynamo_profile(settings: PeerSettings, path: str | Path, *, max_context: int) -> Path:
    """Write the profile NPZ of ``settings``' latency model (see :func:`dynamo_profile_arrays`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cap = settings.kv_capacity_tokens()
    arrays = dynamo_profile_arrays(settings.latency(), max_prefill_tokens=max(settings.max_batched_tokens, max_context),
                                   max_kv_tokens=cap, max_context=max_context, max_batch=settings.max_num_seqs)
    np.savez(path, **arrays)
    return path


def dynamo_engine_args(settings: PeerSettings, profile: str | Path, role: str = "aggregated") -> dict[str, Any]:
    """Dynamo's canonical mocker config for one worker of ``role`` (aggregated, prefill, decode)."""
    if role not in ("aggregated", "prefill", "decode"):
        raise ValueError(f"role must be aggregated, prefill or decode, got {role!r}")
    engine: dict[str, Any] = {
        "backend": "vllm", "worker_type": role, "block_size": settings.block_tokens,
        "num_gpu_blocks": settings.kv_capacity_tokens() // settings.block_tokens,
        "max_num_seqs": settings.max_num_seqs, "max_num_batched_tokens": settings.max_batched_tokens,
        "enable_prefix_caching": settings.prefix_caching, "enable_chunked_prefill": True,
        "timing_model": {"type": "external", "provider": "dynamo_profile", "config": {"path": str(profile)}},
    }
    if role != "aggregated" and settings.link is not None:
        engine["kv_transfer_bandwidth"] = get_link(settings.link).bytes_per_s / 1e9  # decimal GB/s
        engine["kv_transfer_bytes_per_token"] = kv_bytes_per_token(get_model(settings.model), "bf16")
    return {"engine": engine}


def dynamo_replay_kwargs(settings: PeerSettings, profile: str | Path) -> dict[str, Any]:
    """Keywords of ``dynamo.replay.run_trace_replay`` for ``settings`` (JSON-ready)."""
    kw: dict[str, Any] = {"replay_mode": "offline", "router_mode": "round_robin",
                          "trace_block_size": settings.block_tokens}
    if settings.mode == "colocated":
        kw |= {"num_workers": settings.instances, "extra_engine_args": dynamo_engine_args(settings, profile)}
    else:
        kw |= {"num_prefill_workers": settings.prefill, "num_decode_workers": settings.decode,
               "prefill_engine_args": dynamo_engine_args(settings, profile, "prefill"),
               "decode_engine_args": dynamo_engine_args(settings, profile, "decode")}
    return kw


def dynamo_metrics(report: Mapping[str, Any]) -> dict[str, Any]:
    """pdlab's names and units (seconds) from the runner's JSON (Dynamo's summary is in ms)."""
    s = report["summary"]
    out: dict[str, Any] = {"wall_s": s["wall_time_ms"] / 1e3, "outer_wall_s": report.get("outer_wall_s"),
                           "requests": s["num_requests"], "completed": s["completed_requests"],
                           "prefix_hit_share": s.get("prefix_cache_reused_ratio")}
    for name in ("ttft", "tpot", "itl"):
        out[f"{name}_p50_s"] = s[f"median_{name}_ms"] / 1e3
        out[f"{name}_p90_s"] = s[f"p90_{name}_ms"] / 1e3
    return out


def run_pdlab(requests: Sequence[Request], settings: PeerSettings) -> dict[str, Any]:
    """Replay ``requests`` through pdlab's simulator as ``settings`` describes; the table's metrics."""
    s = settings
    common = dict(tp=s.tp, max_num_seqs=s.max_num_seqs, max_batched_tokens=s.max_batched_tokens,
                  prefix_caching=s.prefix_caching, record_token_times=True)
    if s.mode == "colocated":
        sim = build_simulator("chunked", s.gpu, s.model, instances=s.instances, token_budget=s.max_batched_tokens,
                              **common)
    else:
        sim = build_simulator("disaggregated", s.gpu, s.model, prefill=s.prefill, decode=s.decode, link=s.link,
                              dispatch="round_robin", decode_dispatch="round_robin", **common)
    res = sim.run(list(requests))
    summ = res.summary(SLO(ttft_s=30.0, tpot_s=0.1))
    hits = sum(i.get("prefix_hit_tokens", 0) for i in res.instances)
    seen = sum(r.prompt_tokens for r in requests)
    out = {"wall_s": res.sim_wall_s, "requests": summ["requests"], "completed": summ["completed"],
           "prefix_hit_share": hits / seen if seen else float("nan")}
    return out | {m: summ[m] for m in METRICS}


def require_peers_python(python: str | Path | None = None) -> Path:
    """``python``, or the peers environment's python; FileNotFoundError naming the install script without it."""
    py = Path(python) if python else peers_python()
    if py is None or not Path(py).exists():
        raise FileNotFoundError("no peers environment (.venv-peers): run scripts/install_peers.sh")
    return Path(py)


def run_in_peers(python: Path, runner: str, request: Mapping[str, Any], *, timeout_s: float = 600.0,
                 cwd: str | Path | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """Run the script ``runner`` (beside this module) with ``python``, ``request`` as JSON on its
    stdin: (exit code, its last stdout line read as JSON or None, the tail of its stderr)."""
    proc = subprocess.run([str(python), str(Path(__file__).with_name(runner))], input=json.dumps(request),
                          capture_output=True, text=True, timeout=timeout_s, check=False, cwd=cwd)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr[-2000:]


def run_dynamo(trace: str | Path, settings: PeerSettings, workdir: str | Path, *, python: str | Path | None = None,
               timeout_s: float = 600.0) -> dict[str, Any]:
    """Replay the Mooncake JSONL ``trace`` through Dynamo (subprocess in the peers environment).

    Writes the converted profile under ``workdir``. Raises FileNotFoundError without the peers
    environment and RuntimeError (with Dynamo's stderr tail) when the replay fails.
    """
    py = require_peers_python(python)
    max_ctx = max_context(trace)
    profile = write_dynamo_profile(settings, Path(workdir) / f"dynamo_profile_{settings.mode}.npz", max_context=max_ctx)
    request = {"trace": str(trace), "kwargs": dynamo_replay_kwargs(settings, profile)}
    code, report, err = run_in_peers(py, "dynamo_replay.py", request, timeout_s=timeout_s)
    if code != 0 or report is None:
        raise RuntimeError(f"Dynamo replay failed (exit {code}): {err}")
    return dynamo_metrics(report) | {"dynamo_version": report.get("dynamo_version")}


def max_context(trace: str | Path) -> int:
    """Longest prompt + output in a Mooncake JSONL file (tokens): the profile tables' range."""
    longest = 1
    with open(trace) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                longest = max(longest, int(d["input_length"]) + int(d["output_length"]))
    return longest


def write_trace_slice(src: str | Path, dst: str | Path, limit: int) -> Path:
    """Copy the first ``limit`` requests of a Mooncake JSONL file to ``dst``."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src) as f, open(dst, "w") as out:
        n = 0
        for line in f:
            if line.strip():
                out.write(line if line.endswith("\n") else line + "\n")
                n += 1
                if n == limit:
                    break
    return dst


def compare_rows(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of the side-by-side table: wall time (ratio = Dynamo / pdlab, the speed-up), prefix-hit
    share, then each of :data:`METRICS` (ratio = pdlab / Dynamo − 1, the relative difference)."""
    rows = [{"metric": "wall_s", "pdlab": ours["wall_s"], "dynamo": theirs["wall_s"],
             "ratio": theirs["wall_s"] / ours["wall_s"] if ours["wall_s"] > 0 else math.inf},
            {"metric": "prefix_hit_share", "pdlab": ours["prefix_hit_share"], "dynamo": theirs["prefix_hit_share"],
             "ratio": None}]
    for m in METRICS:
        a, b = float(ours[m]), float(theirs[m])
        rows.append({"metric": m, "pdlab": a, "dynamo": b, "ratio": a / b - 1.0 if b > 0 else math.nan})
    return rows


def disagreements(rows: Sequence[Mapping[str, Any]], mode: str, tolerance: float = 0.2
                  ) -> list[tuple[str, list[str]]]:
    """Metrics whose relative difference exceeds ``tolerance`` (NaN counts), each with the
    mechanisms of :data:`MECHANISMS` that move it in ``mode``."""
    if mode not in PEER_MODES:
        raise ValueError(f"mode must be one of {', '.join(PEER_MODES)}, got {mode!r}")
    out = []
    for r in rows:
        if r["metric"] in METRICS and not abs(r["ratio"]) <= tolerance:
            kind = r["metric"].split("_")[0]
            out.append((r["metric"], [name for name, (modes, moves, _) in MECHANISMS.items()
                                      if mode in modes and kind in moves]))
    return out


def prefill_busy_fraction(requests: Sequence[Request], latency: LatencyModel, workers: int,
                          chunk_tokens: int) -> tuple[float, float]:
    """Share of time the ``workers`` that prefill would be busy with the prompts of ``requests``
    (prefix hits ignored), with each prompt priced by :func:`chunked_prefill_s` as pdlab and as
    Dynamo do: the load whose queueing the *prefill attention* mechanism changes."""
    if workers < 1 or not requests:
        raise ValueError("need workers >= 1 and at least one request")
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    if span <= 0:
        raise ValueError("the requests arrive at one instant: no busy fraction")
    ours = theirs = 0.0
    for r in requests:
        a, b = chunked_prefill_s(latency, r.prompt_tokens, chunk_tokens)
        ours, theirs = ours + a, theirs + b
    return ours / workers / span, theirs / workers / span


def diff_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line of the relative differences (pdlab vs Dynamo) of :data:`METRICS`, e.g. for an ablation."""
    return ", ".join(f"{r['metric'].removesuffix('_s')} {r['ratio']:+.0%}" for r in rows if r["metric"] in METRICS)


def format_table(title: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as aligned text: times in ms, the wall-time row as seconds and Dynamo/pdlab speed-up."""
    lines = [title, f"  {'metric':<18}{'pdlab':>12}{'dynamo':>12}   note"]
    for r in rows:
        m = r["metric"]
        if m == "wall_s":
            lines.append(f"  {'wall time (s)':<18}{r['pdlab']:>12.3f}{r['dynamo']:>12.3f}   "
                         f"pdlab {r['ratio']:.1f}x faster")
        elif m == "prefix_hit_share":
            lines.append(f"  {'prefix hit share':<18}{r['pdlab']:>12.3f}{r['dynamo']:>12.3f}")
        else:
            lines.append(f"  {m.replace('_s', ' (ms)'):<18}{r['pdlab'] * 1e3:>12.1f}{r['dynamo'] * 1e3:>12.1f}   "
                         f"pdlab {r['ratio']:+.0%}")
    return "\n".join(lines)
