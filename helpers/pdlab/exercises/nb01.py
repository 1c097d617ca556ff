"""Checks for notebook 01 (roofline of prefill and decode). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.roofline.analytic import analyze, critical_decode_batch
from pdlab.roofline.measure import DeviceProfile, LayerPoint, LayerShape

__all__ = ["check_critical_decode_batch", "check_decode_step_70b_tp8_s", "check_predicted_prefill_s"]


def check_critical_decode_batch(value, model: str = "llama-3-8b", gpu: str = "h100-sxm",
                                dtype: str = "bf16") -> CheckResult:
    """Exercise 1: smallest decode batch at which ``model``'s weight matmuls turn compute-bound on
    ``gpu`` in ``dtype`` (the notebook passes its own GPU, one that is in none of its tables). The
    napkin answer (the ridge point) and the exact one (with the activations' bytes, a little
    higher) both pass."""
    expected = critical_decode_batch(model, gpu, dtype=dtype, linear_only=True)
    return check_close("Exercise 1", value, expected, rel_tol=0.15, unit="sequences",
                       hint="A decode GEMM at batch B does 2·B FLOPs per 2-byte weight: AI ≈ B. "
                            "Compare with the ridge point peak/bandwidth.")


def check_decode_step_70b_tp8_s(value) -> CheckResult:
    """Exercise 2: lower bound of one decode step of Llama-3-70B (bf16, batch 1, short context)
    on 8 H100 SXM with tensor parallelism 8, in seconds."""
    expected = analyze("llama-3-70b", "h100-sxm", "decode", batch=1, context=1, tp=8).time_s
    return check_close("Exercise 2", value, expected, rel_tol=0.05, unit="s",
                       hint="Each GPU streams 1/8 of the weights every step: weight bytes / 8 / 3.35e12 B/s.")


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
