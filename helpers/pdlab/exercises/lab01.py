"""Checks for lab 01 (vLLM colocated vs disaggregated). Expected values are computed from the data."""

from __future__ import annotations

from collections.abc import Sequence

from pdlab.exercises import CheckResult, check_close
from pdlab.metrics import RequestRecord
from pdlab.serve.measure.evidence import KVTransferEvidence

__all__ = ["check_tpot_from_record", "check_transferred_fraction", "check_short_request_tpot_us"]


def check_tpot_from_record(value, record: RequestRecord) -> CheckResult:
    """Exercise 1: TPOT = (finish − first token) / (output tokens − 1), as ``vllm bench serve``."""
    expected = (record.finish_s - record.first_token_s) / (record.output_tokens - 1)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="s", measured=True,
                       hint="TPOT leaves out the first token: divide the time after it by output tokens − 1.")


def check_transferred_fraction(value, evidence: KVTransferEvidence) -> CheckResult:
    """Exercise 2: external_kv_transfer tokens / all prompt tokens seen by the decode server."""
    expected = evidence.external_kv_tokens / evidence.prompt_tokens if evidence.prompt_tokens else 0.0
    return check_close("Exercise 2", value, expected, rel_tol=1e-6, measured=True,
                       hint="Use the decode server's counters: external_kv_tokens over prompt_tokens.")


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
