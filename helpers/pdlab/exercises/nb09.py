"""Checks for notebook 09 (when to disaggregate). Expected values are computed, not stored."""

from __future__ import annotations

import math

from pdlab.exercises import CheckResult, check_close
from pdlab.sched.pools import nexus_gpu

__all__ = ["check_balanced_per_gpu_goodput", "check_nexus_best_split"]


def check_balanced_per_gpu_goodput(value, rate_rps: float, prefill_rps: float, decode_rps: float,
                                   gpus_per_instance: int) -> CheckResult:
    """Exercise 1: per-GPU goodput of the smallest disaggregated design serving ``rate_rps``, from the
    goodput of one prefill-only and one decode-only instance (DistServe Alg. 1's n = ⌈R/g⌉)."""
    n_p, n_d = math.ceil(rate_rps / prefill_rps), math.ceil(rate_rps / decode_rps)
    expected = rate_rps / ((n_p + n_d) * gpus_per_instance)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="req/s per GPU",
                       hint="n_p = ceil(R / prefill goodput), n_d = ceil(R / decode goodput); divide R by all GPUs.")


def check_nexus_best_split(value, gpu: str, model: str, prompt_tokens: int, output_tokens: int,
                           tpot_slo_s: float) -> CheckResult:
    """Exercise 2: the best static prefill SM fraction of the notebook's Nexus model (within 0.02)."""
    x, _ = nexus_gpu(gpu, model).best_split(prompt_tokens, output_tokens, tpot_slo_s)
    return check_close("Exercise 2", value, x, rel_tol=0.03, unit="of the SMs",
                       hint="sweep x in (0, 1) with NexusGPU.max_rate and take the argmax.")
