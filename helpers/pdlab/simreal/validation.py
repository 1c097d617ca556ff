"""Sim-to-real as a statistical validation: simulated against measured latency samples.

What LLMServingSim 2.0 (ISPASS'26) and BLIS report, for any latency metric (TTFT, TPOT, E2E; seconds):

- **relative error of the median and of the p90** — ``(sim − real) / real`` — and, over several rows
  (rates × metrics), their **MAPE** (mean absolute percentage error, in percent);
- a **two-sample Kolmogorov–Smirnov test** (:func:`scipy.stats.ks_2samp`): the largest gap between
  the two empirical CDFs and the p-value of "same distribution". With thousands of samples it
  rejects tiny, harmless differences, so read the statistic, not only the p-value;
- a **TOST equivalence test on the medians at ±10 %** (:func:`tost_median_ratio`): the null
  hypothesis is "the medians differ by more than the margin", so a small p-value is evidence
  *for* agreement — the opposite of the KS test, and what "within 10 %" should mean;
- **CDF overlays** of simulated against measured (:func:`cdf_overlay`).

TOST method (why bootstrap): Schuirmann's two one-sided tests at level α are equivalent to checking
that the (1 − 2α) confidence interval of the effect lies inside the margin. The effect here is the
ratio of medians, median(sim) / median(real), and the margin ±10 % is [0.9, 1.1]. A median has no
simple parametric standard error, and latency samples are skewed and of unequal shape (queueing
tails), so the interval comes from a percentile bootstrap (resample both samples independently,
``n_boot`` times). A Mann–Whitney based TOST would test a location *shift* (Hodges–Lehmann) and
assume both samples have the same shape; a relative margin on the medians is what the course's
"median within 10 %" goal states, so the bootstrap of that exact quantity is used. The one-sided
p-values are the bootstrap fractions of ratios at or beyond each bound; the TOST p-value is the
larger one.

Pure functions of arrays (or :class:`pdlab.metrics.RequestRecord` lists through
:func:`validation_table`); scipy and plotly are imported only by the functions that need them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "TostResult",
    "relative_error",
    "mape",
    "ks_test",
    "tost_median_ratio",
    "interval_verdict",
    "compare_samples",
    "validation_table",
    "mape_summary",
    "cdf_overlay",
    "METRICS",
]

#: Metrics :func:`validation_table` compares, as (column name, pdlab.metrics function name).
METRICS = ("ttft_s", "tpot_s", "e2e_s")


def _arr(x: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        raise ValueError("need at least one finite sample")
    return a


def relative_error(sim: float, real: float) -> float:
    """(sim − real) / real; raises on a zero reference."""
    if real == 0:
        raise ValueError("relative error against a zero reference")
    return (sim - real) / real


def mape(sim: Sequence[float], real: Sequence[float]) -> float:
    """Mean absolute percentage error of paired values, in percent: 100 · mean(|sim − real| / |real|)."""
    s, r = np.asarray(sim, dtype=float), np.asarray(real, dtype=float)
    if s.shape != r.shape or s.size == 0:
        raise ValueError(f"need paired, non-empty values; got shapes {s.shape} and {r.shape}")
    if np.any(r == 0):
        raise ValueError("MAPE against a zero reference value")
    return float(100.0 * np.mean(np.abs(s - r) / np.abs(r)))


def ks_test(sim: Sequence[float], real: Sequence[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov–Smirnov (statistic, p-value), :func:`scipy.stats.ks_2samp`, two-sided."""
    from scipy.stats import ks_2samp

    res = ks_2samp(_arr(sim), _arr(real))
    return float(res.statistic), float(res.pvalue)


@dataclass(frozen=True)
class TostResult:
    """TOST on median(sim) / median(real) against [1 − margin, 1 + margin]."""

    ratio: float            # median(sim) / median(real)
    ci_low: float           # (1 − 2α) bootstrap interval of the ratio
    ci_high: float
    p_lower: float          # H0: ratio ≤ 1 − margin
    p_upper: float          # H0: ratio ≥ 1 + margin
    p_value: float          # max(p_lower, p_upper)
    equivalent: bool        # interval inside the margin (⇔ p_value < α)
    margin: float
    alpha: float
    n_boot: int


def tost_median_ratio(sim: Sequence[float], real: Sequence[float], *, margin: float = 0.10, alpha: float = 0.05,
                      n_boot: int = 2000, seed: int = 0, max_draws: int = 4_000_000) -> TostResult:
    """Bootstrap TOST: are the medians of ``sim`` and ``real`` within ±``margin`` (relative)?

    Both samples are resampled independently ``n_boot`` times (in chunks of at most ``max_draws``
    values in memory); see the module docstring for why a bootstrap of the median ratio.
    """
    if not 0 < margin < 1:
        raise ValueError(f"margin must be in (0, 1), got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    s, r = _arr(sim), _arr(real)
    if np.median(r) <= 0:
        raise ValueError("the measured median must be > 0")
    rng = np.random.default_rng(seed)

    def boot_medians(x: np.ndarray) -> np.ndarray:
        out = np.empty(n_boot)
        step = max(1, max_draws // x.size)
        for i in range(0, n_boot, step):
            m = min(step, n_boot - i)
            out[i:i + m] = np.median(x[rng.integers(0, x.size, size=(m, x.size))], axis=1)
        return out

    ratios = boot_medians(s) / boot_medians(r)
    lo_b, hi_b = 1.0 - margin, 1.0 + margin
    ci_low, ci_high = (float(v) for v in np.quantile(ratios, [alpha, 1.0 - alpha]))
    p_lower = float(np.mean(ratios <= lo_b))
    p_upper = float(np.mean(ratios >= hi_b))
    p = max(p_lower, p_upper)
    return TostResult(float(np.median(s) / np.median(r)), ci_low, ci_high, p_lower, p_upper, p,
                      bool(lo_b < ci_low and ci_high < hi_b), margin, alpha, n_boot)


def interval_verdict(lo: float, hi: float, *, bound: float = 0.10) -> str:
    """``met``, ``missed`` or ``unresolved``: a ratio's interval [``lo``, ``hi``] against [1 − bound, 1 + bound].

    ``met`` when the whole interval lies inside, ``missed`` when it lies wholly outside, and
    ``unresolved`` when it straddles a bound (more samples would decide) or is not finite.

    >>> interval_verdict(0.95, 1.04), interval_verdict(0.80, 0.88), interval_verdict(0.85, 1.02)
    ('met', 'missed', 'unresolved')
    """
    if not 0 < bound < 1:
        raise ValueError(f"bound must be in (0, 1), got {bound}")
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "unresolved"
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] has its low end above its high end")
    if 1 - bound <= lo and hi <= 1 + bound:
        return "met"
    return "missed" if hi < 1 - bound or lo > 1 + bound else "unresolved"


def compare_samples(sim: Sequence[float], real: Sequence[float], *, margin: float = 0.10, alpha: float = 0.05,
                    n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """One row: medians and p90s with relative errors (%), KS statistic and p-value, TOST verdict."""
    s, r = _arr(sim), _arr(real)
    med_s, med_r = float(np.median(s)), float(np.median(r))
    p90_s, p90_r = float(np.percentile(s, 90)), float(np.percentile(r, 90))
    ks, ks_p = ks_test(s, r)
    tost = tost_median_ratio(s, r, margin=margin, alpha=alpha, n_boot=n_boot, seed=seed)
    return {"n_sim": int(s.size), "n_real": int(r.size),
            "median_sim": med_s, "median_real": med_r, "median_err_pct": 100 * relative_error(med_s, med_r),
            "p90_sim": p90_s, "p90_real": p90_r, "p90_err_pct": 100 * relative_error(p90_s, p90_r),
            "ks_stat": ks, "ks_p": ks_p, "tost_p": tost.p_value, "ratio_ci_low": tost.ci_low,
            "ratio_ci_high": tost.ci_high, "equivalent": tost.equivalent}


def validation_table(runs: Mapping[Any, tuple[Sequence[Any], Sequence[Any]]], *, metrics: Sequence[str] = METRICS,
                     margin: float = 0.10, alpha: float = 0.05, n_boot: int = 2000, seed: int = 0):
    """A pandas DataFrame, one row per (run, metric): :func:`compare_samples` of simulated against
    measured records.

    ``runs`` maps a label (e.g. ``("colocated", 4.0)`` for mode and rate) to ``(sim_records,
    real_records)``, lists of :class:`pdlab.metrics.RequestRecord`. ``metrics`` are names of
    :mod:`pdlab.metrics` sample functions: ``ttft_s``, ``tpot_s``, ``e2e_s``, ``itl_s``.
    """
    import pandas as pd

    from pdlab import metrics as M

    rows = []
    for label, (sim_recs, real_recs) in runs.items():
        for metric in metrics:
            fn = getattr(M, metric, None)
            if fn is None or metric not in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
                raise ValueError(f"unknown metric {metric!r}; use ttft_s, tpot_s, e2e_s or itl_s")
            s, r = fn(sim_recs), fn(real_recs)
            if s.size == 0 or r.size == 0:
                continue
            row = {"run": label, "metric": metric}
            row.update(compare_samples(s, r, margin=margin, alpha=alpha, n_boot=n_boot, seed=seed))
            rows.append(row)
    return pd.DataFrame(rows)


def mape_summary(table: Any) -> dict[str, float]:
    """MAPE (%) of the medians and of the p90s over the rows of a :func:`validation_table`,
    overall and per metric, plus the share of rows that pass TOST."""
    out: dict[str, float] = {
        "median_mape_pct": mape(table["median_sim"], table["median_real"]),
        "p90_mape_pct": mape(table["p90_sim"], table["p90_real"]),
        "tost_pass_share": float(np.mean(table["equivalent"].astype(bool))),
    }
    for metric, part in table.groupby("metric"):
        out[f"{metric}_median_mape_pct"] = mape(part["median_sim"], part["median_real"])
        out[f"{metric}_p90_mape_pct"] = mape(part["p90_sim"], part["p90_real"])
    return out


def _ecdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs = np.sort(x)
    return xs, np.arange(1, xs.size + 1) / xs.size


def cdf_overlay(sim: Sequence[float], real: Sequence[float], *, title: str, x_title: str, scale: float = 1.0,
                labels: tuple[str, str] = ("simulated", "measured"), fig: Any = None, log_x: bool = False) -> Any:
    """A plotly figure with the empirical CDFs of ``sim`` and ``real`` (values × ``scale``, e.g.
    1000 for ms; put the unit in ``x_title``). Pass ``fig`` to add to an existing figure."""
    from pdlab.plots import new_figure

    if fig is None:
        fig = new_figure(title, x_title, "fraction of requests ≤ x", log_x=log_x)
    for name, data, dash in ((labels[0], sim, "dash"), (labels[1], real, "solid")):
        xs, ys = _ecdf(_arr(data) * scale)
        fig.add_scatter(x=xs, y=ys, mode="lines", name=name, line=dict(shape="hv", dash=dash))
    return fig
