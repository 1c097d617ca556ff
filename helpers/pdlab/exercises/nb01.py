"""Checks for notebook 01 (roofline of prefill and decode). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_gpu
from pdlab.models import get_model, kv_bytes_per_token, weight_bytes
from pdlab.roofline.analytic import analyze
from pdlab.roofline.measure import DeviceProfile, LayerPoint, LayerShape

__all__ = ["check_weight_only_critical_batch", "check_kv_equals_weights_context", "check_predicted_prefill_s",
           "ONE_CALL_OK"]

# Exercises whose answer may be one call to a helper on the page (tests/test_exercise_effort.py).
ONE_CALL_OK = {
    "Exercise 3": "the exercise applies section 1's analytic model (analyze) to the roofline measured in section 5; "
                  "its lesson is the comparison the check prints afterwards: predicted against the measured time "
                  "of a point the page has not shown",
}


def check_weight_only_critical_batch(value, gpu: str = "a10g", weight_bytes: float = 0.5) -> CheckResult:
    """Exercise 1: smallest decode batch at which the weight matmuls turn compute-bound on ``gpu``
    when the weights are stored in ``weight_bytes`` bytes each and multiplied in bf16 (weight-only
    quantisation, e.g. 4-bit AWQ/GPTQ: W4A16). A decode GEMM at batch B does 2·B FLOPs per weight,
    i.e. 2·B / weight_bytes FLOPs per byte read; it turns compute-bound where that reaches the bf16
    ridge point: B = ridge · weight_bytes / 2. The napkin ignores activation bytes (a few % here)."""
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes must be positive, got {weight_bytes}")
    g = get_gpu(gpu)
    expected = g.peak_flops("bf16") / g.hbm_bytes_per_s * weight_bytes / 2
    return check_close("Exercise 1", value, expected, rel_tol=0.15, unit="sequences",
                       hint="FLOPs per weight byte at batch B: 2·B / bytes per weight. Set it equal to the bf16 "
                            "ridge point (peak bf16 FLOP/s ÷ HBM B/s): the multiply runs in bf16 whatever the storage.")


def check_kv_equals_weights_context(value, model: str = "llama-3-70b", batch: int = 32,
                                    dtype: str = "bf16") -> CheckResult:
    """Exercise 2: the context (tokens per sequence) at which a decode step of ``batch`` sequences
    reads as many KV-cache bytes as weight bytes: ``weights = batch · context · KV bytes per token``.
    Tensor parallelism splits both by the same factor, so the answer does not depend on it."""
    m = get_model(model)
    expected = weight_bytes(m, dtype) / (batch * kv_bytes_per_token(m, dtype))
    return check_close("Exercise 2", value, expected, rel_tol=0.02, unit="tokens",
                       hint="Weight bytes = batch × context × KV bytes per token (2 × layers × KV heads × head_dim "
                            "× 2 B); TP divides both sides.")


def check_predicted_prefill_s(value, profile: DeviceProfile, point: LayerPoint) -> CheckResult:
    """Exercise 3: the predicted time of the measured prefill ``point`` on this device's measured
    roofline (per operator ``max(FLOPs/peak, bytes/bandwidth)``, summed). Prints the measured time too."""
    shape = LayerShape(**{k: v for k, v in profile.layer.items() if k != "dtype"})
    expected = analyze(shape.to_model(), profile, "prefill", batch=point.batch, tokens=point.tokens,
                       dtype=profile.layer_dtype, head=False).time_s
    result = check_close("Exercise 3", value, expected, rel_tol=0.10, unit="s",
                         hint="Use analyze(shape.to_model(), profile, 'prefill', ..., head=False) or "
                              "FLOPs / measured peak for the matmuls plus bytes / bandwidth for the rest.")
    if value is not None and result.passed:
        print(f"   measured {point.time_s:.4g} s: the prediction is {float(value) / point.time_s:.0%} "
              "of the measurement")
    return result
