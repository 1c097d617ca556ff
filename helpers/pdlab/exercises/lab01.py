"""Checks for lab 01 (vLLM colocated vs disaggregated). Expected values are computed from the data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdlab.exercises import CheckResult, check_close, check_pair
from pdlab.metrics import RequestRecord
from pdlab.serve.measure.evidence import KVTransferEvidence

__all__ = ["check_short_request_tpot_us", "kv_transfer_totals", "check_kv_transfer_totals"]


def check_short_request_tpot_us(value, records: Sequence[RequestRecord], long_prompt: int) -> CheckResult:
    """Exercise 1 (run-level, unlike notebook 04's single record): the mean TPOT in **microseconds** of
    the short (chat) requests alone, those with fewer than ``long_prompt`` prompt tokens: completed,
    with at least two output tokens. It is what a chat user saw while the long prompts were being
    prefilled. Microseconds, because the page prints many millisecond figures with one decimal, and
    with a handful of requests one of them can equal this answer by chance."""
    tpots = [(r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in records
             if r.ok and r.output_tokens > 1 and r.prompt_tokens < long_prompt]
    expected = 1e6 * sum(tpots) / len(tpots) if tpots else float("nan")
    return check_close("Exercise 1", value, expected, rel_tol=1e-4, unit="µs",
                       hint="Keep the completed requests with a prompt shorter than the long prompt and 2+ output "
                            "tokens; per request (finish − first token) / (output tokens − 1); then the mean, in µs "
                            "(seconds × 1e6).")


def kv_transfer_totals(evidence: Mapping[float, KVTransferEvidence]) -> tuple[float, float]:
    """Over every rate's evidence pooled: (KV bytes that crossed the wire per token loaded through the
    connector, NIXL bandwidth in GB/s = all bytes moved ÷ all transfer time ÷ 1e9)."""
    runs = list(evidence.values())
    tokens = sum(ev.external_kv_tokens for ev in runs)
    seconds = sum(ev.nixl_xfer_time_s for ev in runs)
    moved = sum(ev.nixl_bytes for ev in runs)
    return (moved / tokens if tokens else float("nan")), (moved / seconds / 1e9 if seconds else float("nan"))


def check_kv_transfer_totals(value, evidence: Mapping[float, KVTransferEvidence]) -> CheckResult:
    """Exercise 2: ``(bytes_per_token, gb_per_s)`` over all rates pooled (:func:`kv_transfer_totals`). A
    rate's own figure, or the mean of the rates' figures, weighs the rates wrongly and fails; GB is 1e9 bytes."""
    name = "Exercise 2"
    expected = kv_transfer_totals(evidence)
    return check_pair(name, value, expected, labels=("bytes per transferred token", "bandwidth (GB/s)"),
                      pair="bytes per token, GB/s", variables="kv_bytes_per_token and kv_gb_per_s",
                      passed="{0:,.1f} bytes per token, {1:.4g} GB/s (exact)",
                      hint="Pool the rates: add up each quantity over every rate's evidence first, then divide once "
                           "(NIXL bytes ÷ tokens loaded through the connector; NIXL bytes ÷ transfer seconds ÷ 1e9).")
