"""Dynamo's planner, run offline inside its trace replay, beside ``pdlab place`` on the same
workload and SLOs: which P:D split does each choose?

Dynamo (ai-dynamo 1.6.1) runs its planner in the offline replay when ``run_trace_replay`` gets a
``planner_config``: the Rust replay ticks the planner on simulated time, the planner returns target
prefill/decode counts, the replay starts or drains mocker workers, and the report carries every tick
(``PlannerReplayDetails``). The mocker's timing is the profile :func:`pdlab.peers.dynamo_compare.write_dynamo_profile`
writes from our latency model, so both sides price a forward pass alike.

Two planner targets matter here (see :mod:`pdlab.peers.dynamo_planner_replay` for what each needs):

- ``sla`` — TTFT/ITL targets, throughput-based scaling: each interval it predicts the load and
  sizes each pool with its performance model (``aisimulate_core``'s forward-pass regression, tuned
  on the workers' forward-pass metrics). That model cannot be installed here, so the run is reported
  *unavailable* (:class:`PlannerUnavailable`) with the missing piece.
- ``throughput`` (the default "easy" target) — reactive thresholds: prefill scales on queued prompt
  tokens per worker, decode on KV-cache utilisation; the SLOs are not consulted. This runs here.

``pdlab place`` answers a different question: the per-GPU goodput of one TP-4 prefill and one TP-4
decode instance under the SLOs (binary search on the rate with our simulator), then n = ⌈R/g_p⌉,
m = ⌈R/g_d⌉ for the trace's mean rate R (DistServe's Alg. 1). :data:`WHY_DIFFERENT` names the
mechanisms that separate the two answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdlab.metrics import SLO
from pdlab.peers.dynamo_compare import (
    PeerSettings,
    dynamo_engine_args,
    dynamo_replay_kwargs,
    max_context,
    require_peers_python,
    run_in_peers,
    write_dynamo_profile,
)
from pdlab.workloads import read_mooncake_jsonl

__all__ = ["PLANNER_TARGETS", "WHY_DIFFERENT", "PlannerUnavailable", "PlannerRun", "TraceWorkload",
           "planner_config", "planner_replay_kwargs", "parse_planner_report", "run_dynamo_planner",
           "trace_workload", "place_split", "split_rows", "format_split_table"]

PLANNER_TARGETS = ("sla", "throughput", "latency")

#: Why Dynamo's planner and ``pdlab place`` can pick different P:D splits (printed under the table).
WHY_DIFFERENT: dict[str, str] = {
    "question": "Dynamo's planner resizes a running deployment interval by interval from what it "
                "observes (or, in SLA mode, predicts) for the next interval; pdlab place sizes once for the "
                "trace's mean rate from per-instance goodput at the attainment goal",
    "signal": "threshold mode scales prefill on queued prompt tokens per worker and decode on KV "
              "utilisation, without the SLOs; SLA mode uses its own forward-pass regression (tuned on live "
              "FPMs) to find the load one engine sustains at the TTFT/ITL targets; pdlab place bisects the "
              "rate in its discrete-event simulator until 90% of requests meet the SLO",
    "tail": "pdlab place sizes for the attainment goal over the whole length distribution, so the "
            "long-prompt tail (p99 ~87k tokens here) dominates the prefill count; a queue threshold "
            "reacts only when the queue builds",
    "granularity": "the planner moves each pool by bounded steps with cooldowns and never below "
                   "min_endpoint (1); pdlab place rounds each pool up once",
}


class PlannerUnavailable(RuntimeError):
    """The planner cannot run in the peers environment; ``missing`` names what is absent."""

    def __init__(self, missing: Sequence[str], detail: str) -> None:
        super().__init__(f"Dynamo planner replay unavailable: missing {', '.join(missing)} ({detail})")
        self.missing = list(missing)
        self.detail = detail


@dataclass(frozen=True)
class TraceWorkload:
    """What ``pdlab place`` needs of a trace: mean rate (req/s) and the length means."""

    requests: int
    duration_s: float
    rate_rps: float
    mean_prompt_tokens: float
    mean_output_tokens: float


@dataclass
class PlannerRun:
    """Dynamo's planner over a replay: the P:D it asked for at each tick and at the end."""

    target: str
    start: tuple[int, int]
    timeline: list[tuple[float, int, int]]
    final: tuple[int, int]
    ticks: int
    scaling_events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stubbed: list[str] = field(default_factory=list)
    dynamo_version: str | None = None

    def changes(self) -> list[tuple[float, int, int]]:
        """The timeline's points where the chosen P:D changes (the first point included)."""
        out: list[tuple[float, int, int]] = []
        for t, p, d in self.timeline:
            if not out or (p, d) != out[-1][1:]:
                out.append((t, p, d))
        return out

    def at(self, t_s: float) -> tuple[int, int]:
        """The P:D chosen at the last tick at or before ``t_s`` (the start before the first tick)."""
        cur = self.start
        for t, p, d in self.timeline:
            if t > t_s:
                break
            cur = (p, d)
        return cur

    def time_weighted(self, until_s: float | None = None) -> tuple[float, float]:
        """Mean prefill and decode counts chosen, weighted by how long each choice held, from the
        first tick to ``until_s`` (default: the last tick), e.g. the last arrival, so that the
        scale-down while the replay drains does not count."""
        pts = [x for x in self.timeline if until_s is None or x[0] <= until_s]
        end = pts[-1][0] if until_s is None and pts else until_s
        if not pts or end is None or end <= pts[0][0]:
            p, d = self.at(until_s) if until_s is not None else self.final
            return float(p), float(d)
        nxt = [x[0] for x in pts[1:]] + [end]
        p = sum((b - a[0]) * a[1] for a, b in zip(pts, nxt, strict=True))
        d = sum((b - a[0]) * a[2] for a, b in zip(pts, nxt, strict=True))
        return p / (end - pts[0][0]), d / (end - pts[0][0])


def planner_config(slo: SLO, settings: PeerSettings, *, target: str = "sla", adjustment_interval_s: int = 30,
                   load_interval_s: int = 10, max_gpu_budget: int = 64, report_dir: str | Path | None = None
                   ) -> dict[str, Any]:
    """Dynamo's ``PlannerConfig`` (JSON form) for a disaggregated planner over ``settings``' workers.

    ``target`` ``sla``: throughput-based scaling every ``adjustment_interval_s`` toward
    ``slo.ttft_s``/``slo.tpot_s`` (TTFT and ITL targets, ms), load scaling every ``load_interval_s``
    as the fast loop. ``throughput``/``latency``: Dynamo's threshold ("easy") modes, load scaling
    every ``load_interval_s`` (the SLOs are passed along but Dynamo ignores them there).
    ``max_gpu_budget`` caps prefill·TP + decode·TP.
    """
    if target not in PLANNER_TARGETS:
        raise ValueError(f"target must be one of {', '.join(PLANNER_TARGETS)}, got {target!r}")
    if slo.ttft_s is None or slo.tpot_s is None:
        raise ValueError("the planner needs both a TTFT and a TPOT (ITL) SLO")
    if settings.mode != "disaggregated":
        raise ValueError("the P:D comparison needs PeerSettings(mode='disaggregated')")
    if load_interval_s < 1 or adjustment_interval_s <= load_interval_s or adjustment_interval_s % load_interval_s:
        raise ValueError("need 1 <= load_interval_s < adjustment_interval_s, the latter a multiple of the former")
    if max_gpu_budget < 2 * settings.tp:
        raise ValueError(f"max_gpu_budget must hold one prefill and one decode worker ({2 * settings.tp} GPUs)")
    cfg: dict[str, Any] = {
        "mode": "disagg", "backend": "mocker", "environment": "virtual", "optimization_target": target,
        "ttft_ms": slo.ttft_s * 1e3, "itl_ms": slo.tpot_s * 1e3,
        "load_adjustment_interval_seconds": load_interval_s, "max_gpu_budget": max_gpu_budget,
        "prefill_engine_num_gpu": settings.tp, "decode_engine_num_gpu": settings.tp,
        "scheduling": {"scale_interval_seconds": load_interval_s}, "pre_deployment_sweeping_mode": "none",
        "enable_load_scaling": True, "enable_throughput_scaling": target == "sla",
    }
    if target == "sla":
        cfg |= {"throughput_adjustment_interval_seconds": adjustment_interval_s, "load_predictor": "constant"}
    if report_dir is not None:
        cfg["report_output_dir"] = str(report_dir)
    return cfg


def planner_replay_kwargs(settings: PeerSettings, profile: str | Path, config: Mapping[str, Any], *,
                          max_model_len: int) -> dict[str, Any]:
    """Keywords of ``run_trace_replay`` with the planner: :func:`pdlab.peers.dynamo_compare.dynamo_replay_kwargs`
    (starting at ``settings.prefill``:``settings.decode``) plus each role's TP (the planner counts
    GPUs per worker from it) and context length (its prefill thresholds need it)."""
    kw = dynamo_replay_kwargs(settings, profile)
    for role in ("prefill", "decode"):
        args = dynamo_engine_args(settings, profile, role)
        args["tensor_parallel_size"] = settings.tp
        args["engine"]["max_model_len"] = int(max_model_len)
        kw[f"{role}_engine_args"] = args
    kw["planner_config"] = dict(config)
    return kw


def parse_planner_report(report: Mapping[str, Any], *, start: tuple[int, int], target: str) -> PlannerRun:
    """The runner's JSON → :class:`PlannerRun`. At each tick the chosen P:D is the planner's
    ``scale_to`` when it issued one, else the previous choice (starting from ``start``)."""
    if report.get("error"):
        raise PlannerUnavailable(report.get("missing", []), report.get("detail", report["error"]))
    planner = report["planner"]
    cur = tuple(start)
    timeline = []
    for t in planner["ticks"]:
        s = t.get("scale_to")
        if s:
            cur = (int(s.get("num_prefill") or cur[0]), int(s.get("num_decode") or cur[1]))
        timeline.append((float(t["at_s"]), cur[0], cur[1]))
    return PlannerRun(target=target, start=(int(start[0]), int(start[1])), timeline=timeline, final=cur,
                      ticks=int(planner["total_ticks"]), scaling_events=list(planner.get("scaling_events", [])),
                      summary=dict(report.get("summary", {})), stubbed=list(report.get("stubbed", [])),
                      dynamo_version=report.get("dynamo_version"))


def run_dynamo_planner(trace: str | Path, settings: PeerSettings, slo: SLO, workdir: str | Path, *,
                       target: str = "sla", python: str | Path | None = None, timeout_s: float = 600.0,
                       **config: Any) -> PlannerRun:
    """Replay ``trace`` through Dynamo with its planner (subprocess in the peers environment).

    Raises FileNotFoundError without the peers environment, :class:`PlannerUnavailable` when the
    planner cannot run there (what is missing), RuntimeError when the replay fails. ``config``: more
    keywords of :func:`planner_config`.
    """
    py = require_peers_python(python)
    workdir = Path(workdir)
    max_ctx = max_context(trace)
    profile = write_dynamo_profile(settings, workdir / "dynamo_profile_planner.npz", max_context=max_ctx)
    cfg = planner_config(slo, settings, target=target, report_dir=workdir / "planner_reports", **config)
    request = {"trace": str(trace), "kwargs": planner_replay_kwargs(settings, profile, cfg, max_model_len=max_ctx)}
    code, report, err = run_in_peers(py, "dynamo_planner_replay.py", request, timeout_s=timeout_s, cwd=workdir)
    if code == 3 and report is not None:
        raise PlannerUnavailable(report.get("missing", []), report.get("detail", ""))
    if code != 0 or report is None:
        raise RuntimeError(f"Dynamo planner replay failed (exit {code}): {err}")
    return parse_planner_report(report, start=(settings.prefill, settings.decode), target=target)


def trace_workload(trace: str | Path) -> TraceWorkload:
    """Mean rate (requests over the arrival span) and mean prompt/output lengths of a Mooncake JSONL."""
    reqs = read_mooncake_jsonl(str(trace))
    if len(reqs) < 2:
        raise ValueError("need at least two requests for a rate")
    span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
    if span <= 0:
        raise ValueError("the requests arrive at one instant: no rate")
    n = len(reqs)
    return TraceWorkload(n, span, n / span, sum(r.prompt_tokens for r in reqs) / n,
                         sum(r.output_tokens for r in reqs) / n)


def place_split(trace: str | Path, settings: PeerSettings, slo: SLO, *, rate_rps: float | None = None,
                profile: str = "smoke", attainment: float = 0.9) -> dict[str, Any]:
    """``pdlab place``'s Alg. 1 for ``settings``' GPU, model and TP (PP 1) on the trace's lengths
    (sampled, Poisson arrivals) at its mean rate (or ``rate_rps``): the phase goodputs of one
    instance under ``slo`` and n = ⌈R/g_p⌉ prefill, m = ⌈R/g_d⌉ decode instances. The prefill
    simulation gets ``settings.max_batched_tokens`` per pass, as the mocker does."""
    from pdlab.sched.placement import (
        SEARCH_PROFILES,
        ParallelConfig,
        decode_goodput,
        make_env,
        prefill_goodput,
    )

    rate = rate_rps if rate_rps is not None else trace_workload(trace).rate_rps
    env = make_env(settings.model, settings.gpu, str(trace), slo, attainment=attainment,
                   settings=SEARCH_PROFILES[profile])
    env = replace(env, max_batched_tokens=settings.max_batched_tokens)
    cfg = ParallelConfig(settings.tp, 1)
    g_p, g_d = prefill_goodput(env, cfg).goodput_rps, decode_goodput(env, cfg).goodput_rps
    n = math.ceil(rate / g_p) if g_p > 0 else None
    m = math.ceil(rate / g_d) if g_d > 0 else None
    return {"rate_rps": rate, "prefill_goodput_rps": g_p, "decode_goodput_rps": g_d, "prefill": n, "decode": m,
            "attainment": attainment, "profile": profile}


def _ratio(p: float | None, d: float | None) -> str:
    if not p or not d:
        return "n/a"
    return f"{p / d:.2f}"


def split_rows(place: Mapping[str, Any], runs: Sequence[PlannerRun | PlannerUnavailable], *,
               last_arrival_s: float | None = None) -> list[dict[str, Any]]:
    """Rows of the P:D table: pdlab place, then each planner run: its final choice, the choice at
    ``last_arrival_s`` (when given: before the drain's scale-down) and the time-weighted mean up to it."""
    rows = [{"who": f"pdlab place (Alg. 1, {place['profile']})", "prefill": place["prefill"],
             "decode": place["decode"], "ratio": _ratio(place["prefill"], place["decode"]),
             "note": f"g_p {place['prefill_goodput_rps']:.2f}, g_d {place['decode_goodput_rps']:.2f} req/s per "
                     f"instance at R = {place['rate_rps']:.2f} req/s"}]
    for run in runs:
        if isinstance(run, PlannerUnavailable):
            rows.append({"who": "Dynamo planner (sla)", "prefill": None, "decode": None, "ratio": "n/a",
                         "note": f"unavailable: missing {', '.join(run.missing)}"})
            continue
        mp, md = run.time_weighted(last_arrival_s)
        path = " -> ".join(f"{p}:{d}@{t:.0f}s" for t, p, d in run.changes())
        rows.append({"who": f"Dynamo planner ({run.target}), final", "prefill": run.final[0],
                     "decode": run.final[1], "ratio": _ratio(*run.final),
                     "note": f"from {run.start[0]}:{run.start[1]}, {run.ticks} ticks; chosen {path}"})
        if last_arrival_s is not None:
            p, d = run.at(last_arrival_s)
            rows.append({"who": f"Dynamo planner ({run.target}), last arr.", "prefill": p, "decode": d,
                         "ratio": _ratio(p, d), "note": f"at the last arrival, {last_arrival_s:.0f} s"})
        rows.append({"who": f"Dynamo planner ({run.target}), mean", "prefill": round(mp, 2), "decode": round(md, 2),
                     "ratio": _ratio(mp, md), "note": "time-weighted from the first tick"
                     + (" to the last arrival" if last_arrival_s is not None else "")})
    return rows


def format_split_table(title: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as aligned text, then the mechanisms of :data:`WHY_DIFFERENT`."""
    lines = [title, f"  {'who':<36}{'prefill':>9}{'decode':>8}{'P/D':>7}   note"]
    for r in rows:
        p = "-" if r["prefill"] is None else r["prefill"]
        d = "-" if r["decode"] is None else r["decode"]
        lines.append(f"  {r['who']:<36}{p!s:>9}{d!s:>8}{r['ratio']:>7}   {r['note']}")
    lines.append("  why they can differ:")
    lines += [f"  - {k}: {v}" for k, v in WHY_DIFFERENT.items()]
    return "\n".join(lines)
