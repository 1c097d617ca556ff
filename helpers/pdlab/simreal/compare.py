"""Stage 4 of sim-to-real: how far the replay is from the live run, and how far it could be.

Per run: :func:`compare_runs` (median and p99 TTFT and TPOT, SLO attainment) and
:func:`paired_error` (request by request). Across rates: :func:`heldout_validation` fits on one rate
(:func:`pdlab.simreal.runfit.fit_on_run`), predicts every other rate and reports the errors of the
medians with bootstrap intervals and the paired per-request error; :func:`host_floor` measures what
the host itself allows, from the run's repeated blocks of each rate (how far one block's medians are
from the other's) and a perfect model's chance of meeting a ±``bar`` verdict under that scatter.

For a prediction made before the run (:mod:`pdlab.simreal.predict`), :func:`prediction_floor` is
the same floor for a model that predicts each rate exactly: its error is the live run's own scatter.

Targets from the literature: Vidur (MLSys'24, arXiv 2405.05465v2) reports < 9 % error on request
latencies; BLIS (``inference-sim/inference-sim``) a median of 7–9 % on GPUs, as the llm-d blog
reports it; DistServe (OSDI'24, arXiv 2401.09670v3 §6.5) < 2 % on SLO attainment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdlab.metrics import SLO, RequestRecord, percentiles, slo_attainment, tpot_s, ttft_s
from pdlab.sim.latency import FittedLatency
from pdlab.simreal.calibration import Calibration
from pdlab.simreal.replay import replay, replay_pairs, requests_from_records
from pdlab.workloads import Request

__all__ = ["ErrorRows", "ERROR_COLUMNS", "compare_runs", "paired_error", "error_table", "rate_for_load",
           "median_error", "HeldOut", "heldout_validation", "HostFloor", "host_floor", "block_log_ratios", "perfect_model_chance",
           "perfect_prediction_chance", "prediction_floor", "calibration_differences"]


#: Columns of :func:`error_table` (relative errors are (sim − live) / live; attainment in points).
ERROR_COLUMNS = ("setup", "rate_rps", "requests", "ttft_p50_live_s", "ttft_p50_sim_s", "ttft_p50_err",
                 "ttft_p99_live_s", "ttft_p99_sim_s", "ttft_p99_err", "tpot_p50_live_s", "tpot_p50_sim_s",
                 "tpot_p50_err", "tpot_p99_live_s", "tpot_p99_sim_s", "tpot_p99_err", "attainment_live",
                 "attainment_sim", "attainment_diff_pp")


def _rel(sim: float, live: float) -> float:
    if not (math.isfinite(sim) and math.isfinite(live)) or live == 0:
        return float("nan")
    return (sim - live) / live


def compare_runs(live: Sequence[RequestRecord], sim: Sequence[RequestRecord], slo: SLO, **labels: Any
                 ) -> dict[str, Any]:
    """One row: median and p99 TTFT and TPOT of both runs (s), their relative errors
    ((sim − live) / live), and SLO attainment of both with the difference in percentage points.

    ``labels`` (e.g. ``setup="colocated", rate_rps=4``) are put first in the row. Raises
    ValueError when either run is empty.
    """
    if not live or not sim:
        raise ValueError(f"both runs need records, got {len(live)} live and {len(sim)} simulated")
    row: dict[str, Any] = dict(labels)
    row["requests"] = len(live)
    for metric, fn in (("ttft", ttft_s), ("tpot", tpot_s)):
        lv, sv = percentiles(fn(live), (50, 99)), percentiles(fn(sim), (50, 99))
        for p in ("p50", "p99"):
            row[f"{metric}_{p}_live_s"] = lv[p]
            row[f"{metric}_{p}_sim_s"] = sv[p]
            row[f"{metric}_{p}_err"] = _rel(sv[p], lv[p])
    row["attainment_live"] = slo_attainment(live, slo)
    row["attainment_sim"] = slo_attainment(sim, slo)
    row["attainment_diff_pp"] = 100.0 * (row["attainment_sim"] - row["attainment_live"])
    return row


def paired_error(live: Sequence[RequestRecord], sim: Sequence[RequestRecord], metric: str = "ttft") -> float:
    """Median over requests of (simulated − live) / live of ``metric`` (``"ttft"`` or ``"tpot"``),
    request by request (:func:`replay_pairs`). Unlike the error of the medians it does not jump when
    the median falls between two groups of prompt lengths; NaN without a pair that has the metric."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be ttft or tpot, got {metric!r}")
    rel = [getattr(s, f"{metric}_s") / getattr(r, f"{metric}_s") - 1 for r, s in replay_pairs(live, sim)
           if getattr(r, f"{metric}_s") and getattr(s, f"{metric}_s") is not None]
    return float(np.median(rel)) if rel else float("nan")


def error_table(rows: Sequence[Mapping[str, Any]]):
    """A pandas DataFrame of :func:`compare_runs` rows, columns in :data:`ERROR_COLUMNS` order."""
    import pandas as pd

    if not rows:
        raise ValueError("no comparison rows")
    df = pd.DataFrame(list(rows))
    cols = [c for c in ERROR_COLUMNS if c in df.columns] + [c for c in df.columns if c not in ERROR_COLUMNS]
    return df[cols]


def rate_for_load(requests: Sequence[Request], latency: FittedLatency, load: float) -> float:
    """Arrival rate (req/s) at which ``requests``' prompts offer ``load`` to one server with
    ``latency``: ``load`` ÷ their mean isolated prefill time (s). Rates set this way put a fast and
    a slow machine, or a CPU and a GPU, at the same point of their queueing curve
    (the run's offered prefill load comes out near ``load``). Raises ValueError for no
    requests or a load outside (0, 1)."""
    if not requests:
        raise ValueError("rate_for_load needs at least one request")
    if not 0 < load < 1:
        raise ValueError(f"load must be in (0, 1): at 1 or more the queue grows without bound, got {load}")
    mean_s = float(np.mean([latency.prefill_time_s([r.prompt_tokens]) for r in requests]))
    return load / mean_s


def _metric(rec: RequestRecord, metric: str) -> float | None:
    return rec.ttft_s if metric == "ttft" else rec.tpot_s


def median_error(live: Sequence[RequestRecord], sim: Sequence[RequestRecord], metric: str = "ttft", *,
                 boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """The replay's error of the median ``metric`` (``"ttft"`` or ``"tpot"``): median(sim) ÷
    median(live) − 1 over the requests that completed on both sides (:func:`pdlab.simreal.replay.replay_pairs`),
    with its bootstrap interval at ``level`` (``boot`` resamples of the requests, in pairs, ``seed``).
    Returns (error, low, high); NaNs without a pair that has the metric."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be ttft or tpot, got {metric!r}")
    pairs = [(_metric(r, metric), _metric(s, metric)) for r, s in replay_pairs(live, sim)]
    pairs = [(a, b) for a, b in pairs if a and b is not None]
    if not pairs:
        return (math.nan, math.nan, math.nan)
    lv, sv = np.array(pairs).T
    err = float(np.median(sv) / np.median(lv) - 1)
    idx = np.random.default_rng(seed).integers(0, len(lv), (boot, len(lv)))
    draws = np.median(sv[idx], axis=1) / np.median(lv[idx], axis=1) - 1
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return err, float(lo), float(hi)


class ErrorRows:
    """Mean absolute errors over ``rows`` (each with ``ttft_p50_err``, ``tpot_p50_err`` and
    ``paired_ttft_err``, fractions (sim − live) / live), shared by :class:`HeldOut` and
    :class:`pdlab.simreal.predict.PredictionErrors`."""

    rows: tuple[Mapping[str, Any], ...]

    def _mean_abs(self, key: str) -> float:
        vals = [abs(r[key]) for r in self.rows if math.isfinite(r[key])]
        return float(np.mean(vals)) if vals else math.nan

    @property
    def ttft_mae(self) -> float:
        """Mean |error| of the median TTFT over the rows (fraction)."""
        return self._mean_abs("ttft_p50_err")

    @property
    def tpot_mae(self) -> float:
        """Mean |error| of the median TPOT over the rows (fraction)."""
        return self._mean_abs("tpot_p50_err")

    @property
    def paired_ttft_mae(self) -> float:
        """Mean |median per-request TTFT error| over the rows (fraction)."""
        return self._mean_abs("paired_ttft_err")

    def met(self, bar: float = 0.10) -> bool:
        """Whether both mean absolute errors (median TTFT and TPOT) are <= ``bar``."""
        return self.ttft_mae <= bar and self.tpot_mae <= bar

    def table(self):
        """The rows as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(list(self.rows))


@dataclass(frozen=True)
class HeldOut(ErrorRows):
    """Held-out predictions of one set-up (:func:`heldout_validation`).

    ``mode``: the set-up. ``fits``: the calibration fitted on each rate (req/s → record).
    ``rows``: one per (fitted rate, predicted rate ≠ it): ``fit_rps``, ``rate_rps``, ``requests``,
    ``ttft_p50_err`` with ``ttft_lo``/``ttft_hi`` (bootstrap interval), the same for ``tpot``, and
    ``paired_ttft_err`` (median per-request relative error); errors are (sim − live) / live.
    """

    mode: str
    fits: Mapping[float, Calibration]
    rows: tuple[Mapping[str, Any], ...]


def heldout_validation(probe: Calibration, live: Mapping[float, Sequence[RequestRecord]], mode: str, *,
                       fit: Callable[[Calibration, float], Calibration] | None = None, boot: int = 1000,
                       seed: int = 0, **sim_options: Any) -> HeldOut:
    """Observe one rate, predict the others: for each rate of ``live`` (req/s → that rate's live
    records), fit ``probe`` on its run (``fit(probe, rate)``; default
    :func:`pdlab.simreal.runfit.fit_on_run` on ``live[rate]`` with ``mode`` and ``sim_options``),
    replay every *other* rate's requests with that fit (:func:`pdlab.simreal.replay.replay`) and
    compare: errors of the medians with bootstrap intervals (:func:`median_error`, ``boot``,
    ``seed``) and the paired per-request TTFT error (:func:`paired_error`). Raises ValueError with
    fewer than two rates."""
    from pdlab.simreal.runfit import fit_on_run

    if len(live) < 2:
        raise ValueError(f"held-out validation needs >= 2 rates (fit on one, predict another), got {len(live)}")
    if fit is None:
        def fit(cal: Calibration, rate: float) -> Calibration:
            return fit_on_run(cal, live[rate], mode, **sim_options)
    fits = {rate: fit(probe, rate) for rate in sorted(live)}
    rows = []
    for fit_rate, fitted in fits.items():
        for rate in sorted(live):
            if rate == fit_rate:
                continue
            recs = live[rate]
            sims = replay(requests_from_records(recs), mode, fitted, **sim_options)
            ttft = median_error(recs, sims, "ttft", boot=boot, seed=seed)
            tpot = median_error(recs, sims, "tpot", boot=boot, seed=seed)
            rows.append({"fit_rps": fit_rate, "rate_rps": rate, "requests": len(recs),
                         "ttft_p50_err": ttft[0], "ttft_lo": ttft[1], "ttft_hi": ttft[2],
                         "tpot_p50_err": tpot[0], "tpot_lo": tpot[1], "tpot_hi": tpot[2],
                         "paired_ttft_err": paired_error(recs, sims, "ttft")})
    return HeldOut(mode, fits, tuple(rows))


def perfect_model_chance(sigma_ttft: float, sigma_tpot: float, *, rates: int, blocks: int, bar: float = 0.10,
                         draws: int = 20000, seed: int = 0) -> tuple[float, np.ndarray, np.ndarray]:
    """What a model exact in everything but the host's drift scores in :func:`heldout_validation`.

    Each block's log level of the median TTFT / TPOT scatters independently by ``sigma_ttft`` /
    ``sigma_tpot`` (log units); a rate's run is the mean of its ``blocks`` blocks; fitting on rate
    i and predicting rate j is off by exp(level_i − level_j) − 1. Returns the chance (Monte Carlo,
    ``draws``, ``seed``) that both mean absolute errors over all ``rates`` × (``rates`` − 1)
    predictions are <= ``bar``, and each draw's TTFT and TPOT mean absolute errors."""
    if rates < 2 or blocks < 1:
        raise ValueError(f"need >= 2 rates and >= 1 block, got {rates} and {blocks}")
    rng = np.random.default_rng(seed)

    def mae(sigma: float) -> np.ndarray:
        level = rng.normal(0.0, sigma, (draws, rates, blocks)).mean(axis=2)
        errs = [np.abs(np.exp(level[:, i] - level[:, j]) - 1) for i in range(rates) for j in range(rates) if i != j]
        return np.mean(errs, axis=0)

    m_ttft, m_tpot = mae(sigma_ttft), mae(sigma_tpot)
    return float(np.mean((m_ttft <= bar) & (m_tpot <= bar))), m_ttft, m_tpot


@dataclass(frozen=True)
class HostFloor:
    """What the host allows, measured on a run's repeated blocks (:func:`host_floor`).

    ``pairs``: consecutive blocks of one rate compared (count). ``block_rms_ttft`` /
    ``block_rms_tpot``: rms of the log ratio of their median TTFT / TPOT (≈ relative difference).
    ``floor_ttft_mae`` / ``floor_tpot_mae``: a perfect model's mean held-out MAE under that
    scatter; ``floor_ttft_p95`` / ``floor_tpot_p95``: the MAE it stays under in 95 % of runs.
    ``chance_met``: its chance that both MAEs are <= ``bar`` (:func:`perfect_model_chance`).
    """

    pairs: int
    block_rms_ttft: float
    block_rms_tpot: float
    floor_ttft_mae: float
    floor_tpot_mae: float
    floor_ttft_p95: float
    floor_tpot_p95: float
    chance_met: float
    bar: float

    def within(self, heldout: HeldOut) -> bool:
        """Whether ``heldout``'s TTFT and TPOT MAEs are both no larger than a perfect model's 95th
        percentile: an error the host's own scatter explains."""
        return heldout.ttft_mae <= self.floor_ttft_p95 and heldout.tpot_mae <= self.floor_tpot_p95


def block_log_ratios(blocks: Mapping[float, Sequence[Sequence[RequestRecord]]], metric: str = "tpot") -> list[float]:
    """log(median of block k+1 ÷ median of block k) of ``metric`` (``"ttft"`` or ``"tpot"``) for
    every pair of consecutive blocks of every rate of ``blocks`` (rate → its blocks' records, in
    the order they ran)."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be ttft or tpot, got {metric!r}")
    fn = ttft_s if metric == "ttft" else tpot_s
    return [float(np.log(np.median(fn(b)) / np.median(fn(a))))
            for parts in blocks.values() for a, b in zip(parts[:-1], parts[1:], strict=True)]


def host_floor(blocks: Mapping[float, Sequence[Sequence[RequestRecord]]], *, bar: float = 0.10,
               draws: int = 20000, seed: int = 0) -> HostFloor:
    """The host's floor from a run's repeated blocks: ``blocks`` maps each rate (req/s) to its
    blocks' records in the order they ran (each block the same mix of requests). Consecutive
    blocks of one rate differ by the host's drift, their own Poisson arrivals and their own prompt
    text (the sampling of requests): the rms of
    the log ratio of their median TTFT and TPOT gives each block's scatter (÷ √2), and
    :func:`perfect_model_chance` what that leaves a perfect model over these rates. Raises
    ValueError without two rates or without a rate of two blocks."""
    logs = {metric: block_log_ratios(blocks, metric) for metric in ("ttft", "tpot")}
    n_blocks = min(len(parts) for parts in blocks.values()) if blocks else 0
    if len(blocks) < 2 or not logs["ttft"] or n_blocks < 2:
        raise ValueError("the host floor needs >= 2 rates, each run in >= 2 blocks")
    rms = {m: float(np.sqrt(np.mean(np.square(v)))) for m, v in logs.items()}
    chance, m_ttft, m_tpot = perfect_model_chance(rms["ttft"] / math.sqrt(2), rms["tpot"] / math.sqrt(2),
                                                  rates=len(blocks), blocks=n_blocks, bar=bar, draws=draws, seed=seed)
    return HostFloor(len(logs["ttft"]), rms["ttft"], rms["tpot"], float(m_ttft.mean()), float(m_tpot.mean()),
                     float(np.quantile(m_ttft, 0.95)), float(np.quantile(m_tpot, 0.95)), chance, bar)


def perfect_prediction_chance(sigma_ttft: float, sigma_tpot: float, *, rates: int, blocks: int, bar: float = 0.10,
                              draws: int = 20000, seed: int = 0) -> tuple[float, np.ndarray, np.ndarray]:
    """What a model that predicts every rate exactly scores against a live run (no fit on the run).

    Each block's log level of the median TTFT / TPOT scatters independently by ``sigma_ttft`` /
    ``sigma_tpot`` (log units) around the truth; a rate's live level is the mean of its ``blocks``
    blocks, so the exact prediction is off by exp(−level) − 1. Returns the chance (Monte Carlo,
    ``draws``, ``seed``) that both mean absolute errors over the ``rates`` rates are <= ``bar``,
    and each draw's TTFT and TPOT mean absolute errors."""
    if rates < 1 or blocks < 1:
        raise ValueError(f"need >= 1 rate and >= 1 block, got {rates} and {blocks}")
    rng = np.random.default_rng(seed)

    def mae(sigma: float) -> np.ndarray:
        level = rng.normal(0.0, sigma, (draws, rates, blocks)).mean(axis=2)
        return np.abs(np.exp(-level) - 1).mean(axis=1)

    m_ttft, m_tpot = mae(sigma_ttft), mae(sigma_tpot)
    return float(np.mean((m_ttft <= bar) & (m_tpot <= bar))), m_ttft, m_tpot


def prediction_floor(blocks: Mapping[float, Sequence[Sequence[RequestRecord]]], *, bar: float = 0.10,
                     draws: int = 20000, seed: int = 0) -> HostFloor:
    """The floor of a prediction made before the run, from the run's repeated blocks: ``blocks``
    maps each rate (req/s) to its blocks' records in the order they ran. As :func:`host_floor`,
    but the perfect model predicts each rate exactly (:func:`perfect_prediction_chance`) instead
    of fitting one rate and predicting the others. Two blocks of one rate differ by the host's
    drift, their own Poisson arrivals and their own prompt text, so the floor holds all three.
    Raises ValueError without a rate of two blocks."""
    logs = {metric: block_log_ratios(blocks, metric) for metric in ("ttft", "tpot")}
    n_blocks = min(len(parts) for parts in blocks.values()) if blocks else 0
    if not logs["ttft"] or n_blocks < 2:
        raise ValueError("the prediction floor needs >= 1 rate run in >= 2 blocks")
    rms = {m: float(np.sqrt(np.mean(np.square(v)))) for m, v in logs.items()}
    chance, m_ttft, m_tpot = perfect_prediction_chance(rms["ttft"] / math.sqrt(2), rms["tpot"] / math.sqrt(2),
                                                       rates=len(blocks), blocks=n_blocks, bar=bar, draws=draws,
                                                       seed=seed)
    return HostFloor(len(logs["ttft"]), rms["ttft"], rms["tpot"], float(m_ttft.mean()), float(m_tpot.mean()),
                     float(np.quantile(m_ttft, 0.95)), float(np.quantile(m_tpot, 0.95)), chance, bar)


def calibration_differences(first: Calibration, second: Calibration, *, prompt_tokens: Sequence[int] = (256, 1024),
                            decode_points: Sequence[tuple[int, int]] = ((1, 256), (16, 512)),
                            handoff_tokens: int = 512, front_end_rate_rps: float = 7.5) -> list[dict[str, Any]]:
    """Two calibrations of one engine compared coefficient by coefficient (a probe's own scatter
    when they ran back to back): one row per coefficient with its ``unit``, its value in each
    (``first``, ``second``, in that unit) and ``rel_diff`` = second ÷ first − 1 (NaN where the
    first is 0 or missing). Rows: the prefill row (a_p, b_p, c_p), the decode row (a_d, b_d, c_d),
    the prefill stall's fixed cost, the KV link's and the front end's on its core (where both hold
    them), then what the replay uses (NNLS may trade one coefficient for another): a prefill of
    each of ``prompt_tokens``, a decode step of each (batch, context tokens per sequence) of
    ``decode_points``, a hand-off of ``handoff_tokens`` and the front end's share of its core at
    ``front_end_rate_rps`` requests/s."""
    def row(name: str, unit: str, scale: float, a: float | None, b: float | None) -> dict[str, Any]:
        a = math.nan if a is None else float(a) * scale
        b = math.nan if b is None else float(b) * scale
        return {"coefficient": name, "unit": unit, "first": a, "second": b,
                "rel_diff": b / a - 1 if a and math.isfinite(a) and math.isfinite(b) else math.nan}

    (ap, bp, cp), (ad, bd, cd) = first.latency.prefill, first.latency.decode
    (ap2, bp2, cp2), (ad2, bd2, cd2) = second.latency.prefill, second.latency.decode
    rows = [row("a_p", "ms", 1e3, ap, ap2), row("b_p", "µs/token", 1e6, bp, bp2), row("c_p", "ns/token²", 1e9, cp, cp2),
            row("a_d", "ms", 1e3, ad, ad2), row("b_d", "µs/ctx token", 1e6, bd, bd2), row("c_d", "µs/seq", 1e6, cd, cd2)]
    if first.prefill_stall is not None and second.prefill_stall is not None:
        rows.append(row("stall fixed_s", "ms", 1e3, first.prefill_stall.fixed_s, second.prefill_stall.fixed_s))
    if first.kv_link is not None and second.kv_link is not None:
        rows += [row("link latency_s", "ms", 1e3, first.kv_link.latency_s, second.kv_link.latency_s),
                 row("link s_per_token", "µs/token", 1e6, first.kv_link.s_per_token, second.kv_link.s_per_token)]
    fe, fe2 = first.front_end_core, second.front_end_core
    if fe is not None and fe2 is not None:
        rows += [row("front end base", "cores", 1, fe.base_cores, fe2.base_cores),
                 row("front end CPU", "ms/request", 1e3, fe.cpu_s_per_request, fe2.cpu_s_per_request)]
    for n in prompt_tokens:
        rows.append(row(f"prefill of {n} tokens", "ms", 1e3, first.latency.prefill_time_s([n]),
                        second.latency.prefill_time_s([n])))
    for batch, ctx in decode_points:
        rows.append(row(f"decode step, {batch} × {ctx} tokens", "ms", 1e3, first.latency.decode_time_s([ctx] * batch),
                        second.latency.decode_time_s([ctx] * batch)))
    if first.kv_link is not None and second.kv_link is not None:
        rows.append(row(f"hand-off of {handoff_tokens} tokens", "ms", 1e3,
                        first.kv_link.latency_s + handoff_tokens * first.kv_link.s_per_token,
                        second.kv_link.latency_s + handoff_tokens * second.kv_link.s_per_token))
    if fe is not None and fe2 is not None:
        rows.append(row(f"front end at {front_end_rate_rps:g} req/s", "cores", 1, fe.share(front_end_rate_rps),
                        fe2.share(front_end_rate_rps)))
    return rows
