"""Checks for notebook 08 (Splitwise heterogeneous pools). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_gpu
from pdlab.sched.pools import reference_latencies

__all__ = ["check_iso_power_saving", "check_e2e_p90_limit_s"]


def check_iso_power_saving(value, prompt_machines: int = 5, token_machines: int = 7) -> CheckResult:
    """Exercise 1: USD per hour saved by turning HH (``prompt_machines`` + ``token_machines`` DGX-H100) into HA,
    the H100 token machines replaced by as many whole DGX-A100 as the same GPU TDP allows."""
    h, a = get_gpu("h100-sxm"), get_gpu("a100-80gb")
    n_a = int(token_machines * h.tdp_w // a.tdp_w)
    expected = 8 * (token_machines * h.price_per_hour - n_a * a.price_per_hour)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="USD/h",
                       hint="A100 machines = floor(token machines × H100 TDP ÷ A100 TDP); the prompt machines are the "
                            "same in both designs; 8 GPUs per machine × catalog price_per_hour.")


def check_e2e_p90_limit_s(value, model: str, prompt_tokens: int, output_tokens: int) -> CheckResult:
    """Exercise 2: Splitwise's E2E P90 limit = 1.5 × the E2E of the request alone on a DGX-A100 (seconds);
    the expected value is the simulator's, the student's is the latency model summed step by step."""
    expected = 1.5 * reference_latencies(model, prompt_tokens, output_tokens).e2e_ref_s
    return check_close("Exercise 2", value, expected, rel_tol=1e-3, unit="s",
                       hint="prefill step (it yields the first token) + one batch-1 decode step per further token, "
                            "context = prompt + tokens before it; then × 1.5.")
