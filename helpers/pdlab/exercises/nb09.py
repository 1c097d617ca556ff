"""Checks for notebook 09 (when to disaggregate). Expected values are computed, not stored."""

from __future__ import annotations

import math

from pdlab.exercises import CheckResult, check_close
from pdlab.sched.pools import nexus_gpu

__all__ = ["check_balanced_per_gpu_goodput", "check_nexus_best_split", "nexus_contended_split"]


def check_balanced_per_gpu_goodput(value, rate_rps: float, prefill_rps: float, decode_rps: float,
                                   gpus_per_instance: int) -> CheckResult:
    """Exercise 1: per-GPU goodput of the smallest disaggregated design serving ``rate_rps``, from the
    goodput of one prefill-only and one decode-only instance (DistServe Alg. 1's n = ⌈R/g⌉)."""
    n_p, n_d = math.ceil(rate_rps / prefill_rps), math.ceil(rate_rps / decode_rps)
    expected = rate_rps / ((n_p + n_d) * gpus_per_instance)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="req/s per GPU",
                       hint="n_p = ceil(R / prefill goodput), n_d = ceil(R / decode goodput); divide R by all GPUs.")


def nexus_contended_split(gpu: str, model: str, prompt_tokens: int, output_tokens: int, tpot_slo_s: float,
                          contention: float) -> float:
    """The prefill share x of the SMs (0–1) where the Nexus model's prefill bound meets its decode bound when
    prefill on ``x`` of the SMs also takes ``contention · x`` of the HBM bandwidth decode would get.
    Bisection to 1e-9; raises ValueError when the bounds do not cross in (0, 1)."""
    if not 0 <= contention < 1:
        raise ValueError(f"contention must be in [0, 1), got {contention}")
    nx = nexus_gpu(gpu, model)
    ctx = prompt_tokens + output_tokens / 2

    def gap(x: float) -> float:  # prefill bound − decode bound, rises with x
        lam_p = nx.max_prefill_utilization * nx.prefill_rate(x) / (prompt_tokens * nx.flops_per_prompt_token)
        bw = nx.decode_bandwidth(x) * (1 - contention * x)
        lam_d = max(0.0, (bw - nx.weight_bytes / tpot_slo_s) / (output_tokens * ctx * nx.kv_bytes_per_token))
        return lam_p - lam_d

    lo, hi = 1e-9, 1 - 1e-9
    if gap(lo) >= 0 or gap(hi) <= 0:
        raise ValueError("the prefill and decode bounds do not cross for this shape and SLO")
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def check_nexus_best_split(value, gpu: str, model: str, prompt_tokens: int, output_tokens: int,
                           tpot_slo_s: float, contention: float) -> CheckResult:
    """Exercise 2: the best static prefill SM fraction of the notebook's Nexus model with bandwidth
    contention ``contention`` (within 0.2 %, about ±0.002)."""
    expected = nexus_contended_split(gpu, model, prompt_tokens, output_tokens, tpot_slo_s, contention)
    return check_close("Exercise 2", value, expected, rel_tol=0.002, unit="of the SMs",
                       hint="Bisect on x for the crossing of the two bounds, with the decode bandwidth "
                            "nx.decode_bandwidth(x) · (1 − EX2_CONTENTION · x); nx.best_split models no contention "
                            "and steps x by 0.01, too coarse for three decimals.")
