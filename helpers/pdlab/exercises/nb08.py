"""Checks for notebook 08 (Splitwise heterogeneous pools). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.sched.pools import PoolDesign, reference_latencies

__all__ = ["check_ha_cost_per_hour", "check_e2e_p90_limit_s"]


def check_ha_cost_per_hour(value, prompt_machines: int = 2, token_machines: int = 3) -> CheckResult:
    """Exercise 1: USD per hour of an HA design with ``prompt_machines`` DGX-H100 prompt and
    ``token_machines`` DGX-A100 token machines."""
    expected = PoolDesign("h100-sxm", prompt_machines, "a100-80gb", token_machines).cost_per_hour
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="USD/h",
                       hint="8 GPUs per machine × catalog price_per_hour (USD per GPU-hour).")


def check_e2e_p90_limit_s(value, model: str, prompt_tokens: int, output_tokens: int) -> CheckResult:
    """Exercise 2: Splitwise's E2E P90 limit = 1.5 × the E2E of the request alone on a DGX-A100 (seconds);
    the expected value is the simulator's, the student's is the latency model summed step by step."""
    expected = 1.5 * reference_latencies(model, prompt_tokens, output_tokens).e2e_ref_s
    return check_close("Exercise 2", value, expected, rel_tol=1e-3, unit="s",
                       hint="prefill step (it yields the first token) + one batch-1 decode step per further token, "
                            "context = prompt + tokens before it; then × 1.5.")
