"""Predict a deployment before running it, then judge the prediction live (lab 05).

One calibration of an engine on its core and of the KV link (:class:`~pdlab.simreal.calibration.Calibration`)
predicts any deployment built from those engines (:class:`~pdlab.simreal.replay.Deployment`):
:func:`predict_blocks` replays each planned block of each rate on it, the same
:func:`~pdlab.simreal.replay.replay` that ``pdlab sim run --profile`` runs (:func:`sim_run_flags`
gives that command's flags for a deployment). After the live run:

- :func:`prediction_errors` — per rate, the error of the median TTFT and TPOT and the paired
  per-request TTFT error; their mean absolute error (MAE) over the rates;
- :func:`decide` / :func:`decision_table` — at each rate, which deployment the simulator says has
  the higher goodput within the SLO, which one won live, and whether they agree, disagree, or the
  live gap is within the floor (smaller than the goodput scatter between the run's repeated blocks).

The floor of the errors themselves is :func:`pdlab.simreal.compare.prediction_floor`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord, goodput_rps
from pdlab.simreal.calibration import Calibration
from pdlab.simreal.compare import ErrorRows, median_error, paired_error
from pdlab.simreal.replay import Deployment, replay
from pdlab.workloads import Request

__all__ = ["TWO_CORE_DEPLOYMENTS", "two_core_deployments", "sim_run_flags", "with_link", "predict_blocks", "PredictionErrors",
           "prediction_errors", "block_goodputs", "goodput_floor_rps", "Decision", "decide", "decision_table",
           "VERDICTS"]

#: The two deployments of one engine per core that lab 05 predicts and runs on a two-core host:
#: two colocated replicas behind vllm-router's plain round robin, and one prefill + one decode engine.
TWO_CORE_DEPLOYMENTS: dict[str, Deployment] = {
    "2 replicas": Deployment("colocated", instances=2, dispatch="round_robin"),
    "1P1D": Deployment("disaggregated"),
}


def two_core_deployments(*, front_end_shares_core: bool = False) -> dict[str, Deployment]:
    """:data:`TWO_CORE_DEPLOYMENTS`, with ``front_end_shares_core`` set on both: each engine's
    API server on the engine's own core (a CPU host where each server is pinned to its core with
    its whole process tree), charged by the calibration's ``front_end_core`` term."""
    return {name: replace(dep, front_end_shares_core=front_end_shares_core)
            for name, dep in TWO_CORE_DEPLOYMENTS.items()}

#: The marks of a decision (:class:`Decision`).
VERDICTS = ("agree", "disagree", "within the floor")


def sim_run_flags(deployment: Deployment) -> list[str]:
    """The ``pdlab sim run --profile`` flags that simulate ``deployment`` (mode, instances or
    xPyD, dispatch, front ends on the engines' cores)."""
    dep = Deployment.of(deployment)
    flags = ["--mode", dep.mode]
    if dep.disaggregated:
        flags += ["--prefill", str(dep.prefill), "--decode", str(dep.decode)]
    else:
        flags += ["--instances", str(dep.instances)]
    if dep.dispatch:
        flags += ["--dispatch", dep.dispatch]
    if dep.front_end_shares_core:
        flags.append("--front-end-shares-core")
    return flags


def with_link(engine: Calibration, handoff: Sequence[Any]) -> Calibration:
    """``engine`` (one colocated engine's calibration) with the KV link fitted on ``handoff``: the
    points of the hand-off probe through a prefill/decode pair's proxy (each a mapping or a
    dataclass with ``tokens``, ``ttft_s`` and ``prefill_leg_s``), the hand-off being what is left
    of each TTFT after the prefill leg and one decode step of ``engine``
    (:func:`pdlab.simreal.fit.fit_handoff`). Raises ValueError with fewer than two lengths."""
    from pdlab.simreal.fit import fit_handoff

    points = [asdict(p) if is_dataclass(p) else dict(p) for p in handoff]
    return replace(engine, kv_link=fit_handoff(points, engine.latency), handoff_points=points)


def predict_blocks(blocks: Mapping[float, Sequence[Sequence[Request]]], deployment: Deployment | str,
                   calibration: Calibration, **sim_options: Any) -> dict[float, list[list[RequestRecord]]]:
    """The simulated records of every planned block: ``blocks`` maps a rate (req/s) to its blocks'
    requests (arrivals from 0 in each), each block replayed alone on ``deployment`` with
    ``calibration`` (:func:`~pdlab.simreal.replay.replay`, ``sim_options`` its keywords), as the
    live run sends each block alone."""
    if not blocks:
        raise ValueError("no blocks to predict")
    return {rate: [replay(list(b), deployment, calibration, **sim_options) for b in parts]
            for rate, parts in blocks.items()}


def _pooled(parts: Sequence[Sequence[RequestRecord]]) -> list[RequestRecord]:
    return [r for part in parts for r in part]


@dataclass(frozen=True)
class PredictionErrors(ErrorRows):
    """How far one deployment's predictions are from its live run (:func:`prediction_errors`).

    ``rows``: one per rate: ``rate_rps``, ``requests``, ``ttft_p50_err``, ``tpot_p50_err`` (the
    error of the median over the rate's blocks pooled, (sim − live) / live, requests paired by id)
    and ``paired_ttft_err`` (the median of each request's own relative TTFT error).
    """

    rows: tuple[Mapping[str, Any], ...]


def prediction_errors(predicted: Mapping[float, Sequence[Sequence[RequestRecord]]],
                      live: Mapping[float, Sequence[Sequence[RequestRecord]]]) -> PredictionErrors:
    """The errors of ``predicted`` (rate → its blocks' simulated records, :func:`predict_blocks`)
    against ``live`` (rate → its blocks' live records, the same request ids), rate by rate. Raises
    ValueError when the rates differ."""
    if set(predicted) != set(live) or not live:
        raise ValueError(f"predicted rates {sorted(predicted)} and live rates {sorted(live)} must be the same")
    rows = []
    for rate in sorted(live):
        lv, sv = _pooled(live[rate]), _pooled(predicted[rate])
        rows.append({"rate_rps": rate, "requests": len(lv),
                     "ttft_p50_err": median_error(lv, sv, "ttft", boot=1)[0],
                     "tpot_p50_err": median_error(lv, sv, "tpot", boot=1)[0],
                     "paired_ttft_err": paired_error(lv, sv, "ttft")})
    return PredictionErrors(tuple(rows))


def block_goodputs(parts: Sequence[Sequence[RequestRecord]], slo: SLO) -> list[float]:
    """Each block's goodput within ``slo`` (req/s, :func:`pdlab.metrics.goodput_rps`: requests that
    met every objective over the block's first arrival to last finish)."""
    return [goodput_rps(list(p), slo) for p in parts]


def goodput_floor_rps(runs: Sequence[Sequence[Sequence[RequestRecord]]], slo: SLO) -> float:
    """The goodput scatter between repeated blocks (req/s): the root mean square of the difference
    in goodput between consecutive blocks of one run, over every run of ``runs`` (each a sequence
    of blocks, in the order they ran). A gap between two deployments smaller than this is one the
    blocks of a single deployment show. NaN without two blocks in any run."""
    diffs = []
    for parts in runs:
        g = block_goodputs(parts, slo)
        diffs += [b - a for a, b in zip(g[:-1], g[1:], strict=True) if math.isfinite(a) and math.isfinite(b)]
    return float(np.sqrt(np.mean(np.square(diffs)))) if diffs else math.nan


@dataclass(frozen=True)
class Decision:
    """One rate of the decision table (:func:`decide`).

    ``sim_goodput_rps`` / ``live_goodput_rps``: each deployment's goodput within the SLO, the mean
    over its blocks (req/s). ``sim_choice`` / ``live_choice``: the deployment with the higher one.
    ``gap_rps``: the live goodput of the winner minus the other's. ``floor_rps``: the goodput
    scatter between the run's repeated blocks (:func:`goodput_floor_rps`, both deployments'
    blocks). ``verdict``: "within the floor" when ``gap_rps`` < ``floor_rps``, else "agree" or
    "disagree" (:data:`VERDICTS`).
    """

    rate_rps: float
    sim_goodput_rps: Mapping[str, float]
    live_goodput_rps: Mapping[str, float]
    sim_choice: str
    live_choice: str
    gap_rps: float
    floor_rps: float
    verdict: str


def _best(goodput: Mapping[str, float]) -> str:
    return max(goodput, key=lambda name: (goodput[name] if math.isfinite(goodput[name]) else -math.inf))


def decide(predicted: Mapping[str, Mapping[float, Sequence[Sequence[RequestRecord]]]],
           live: Mapping[str, Mapping[float, Sequence[Sequence[RequestRecord]]]], slo: SLO) -> list[Decision]:
    """At each rate, the deployment the simulator picks and the one that won live.

    ``predicted`` and ``live`` map each deployment's name to rate → its blocks' records (simulated,
    :func:`predict_blocks`; live, in the order they ran). A deployment's goodput at a rate is the
    mean over its blocks of :func:`block_goodputs`. The live gap (winner − the other) is compared
    with :func:`goodput_floor_rps` over both deployments' blocks at that rate. Raises ValueError
    unless both name the same two or more deployments at the same rates."""
    names = list(live)
    if len(names) < 2 or set(predicted) != set(names):
        raise ValueError(f"need the same >= 2 deployments predicted and live, got {sorted(predicted)} and {names}")
    rates = sorted(next(iter(live.values())))
    for name in names:
        if sorted(live[name]) != rates or sorted(predicted[name]) != rates:
            raise ValueError(f"{name}: every deployment needs the rates {rates}, predicted and live")
    out = []
    for rate in rates:
        sim = {n: float(np.mean(block_goodputs(predicted[n][rate], slo))) for n in names}
        real = {n: float(np.mean(block_goodputs(live[n][rate], slo))) for n in names}
        sim_choice, live_choice = _best(sim), _best(real)
        gap = real[live_choice] - max(v for n, v in real.items() if n != live_choice)
        floor = goodput_floor_rps([live[n][rate] for n in names], slo)
        verdict = ("within the floor" if math.isfinite(floor) and gap < floor
                   else "agree" if sim_choice == live_choice else "disagree")
        out.append(Decision(rate, sim, real, sim_choice, live_choice, gap, floor, verdict))
    return out


def decision_table(decisions: Sequence[Decision]):
    """The decisions as a pandas DataFrame, one row per rate: each deployment's simulated and live
    goodput (req/s), the simulator's and the live choice, the live gap, the floor and the verdict."""
    import pandas as pd

    if not decisions:
        raise ValueError("no decisions")
    rows = []
    for d in decisions:
        row: dict[str, Any] = {"rate (req/s)": d.rate_rps}
        row.update({f"sim {n} (req/s)": v for n, v in d.sim_goodput_rps.items()})
        row.update({f"live {n} (req/s)": v for n, v in d.live_goodput_rps.items()})
        row.update({"simulator picks": d.sim_choice, "live winner": d.live_choice, "live gap (req/s)": d.gap_rps,
                    "block floor (req/s)": d.floor_rps, "verdict": d.verdict})
        rows.append(row)
    return pd.DataFrame(rows).set_index("rate (req/s)")
