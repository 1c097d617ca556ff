"""Checks for lab 01 (vLLM colocated vs disaggregated). Expected values are computed from the data."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.metrics import RequestRecord
from pdlab.serve.evidence import KVTransferEvidence

__all__ = ["check_tpot_from_record", "check_transferred_fraction"]


def check_tpot_from_record(value, record: RequestRecord) -> CheckResult:
    """Exercise 1: TPOT = (finish − first token) / (output tokens − 1), as ``vllm bench serve``."""
    expected = (record.finish_s - record.first_token_s) / (record.output_tokens - 1)
    return check_close("Exercise 1", value, expected, rel_tol=1e-6, unit="s",
                       hint="TPOT leaves out the first token: divide the time after it by output tokens − 1.")


def check_transferred_fraction(value, evidence: KVTransferEvidence) -> CheckResult:
    """Exercise 2: external_kv_transfer tokens / all prompt tokens seen by the decode server."""
    expected = evidence.external_kv_tokens / evidence.prompt_tokens if evidence.prompt_tokens else 0.0
    return check_close("Exercise 2", value, expected, rel_tol=1e-6,
                       hint="Use the decode server's counters: external_kv_tokens over prompt_tokens.")
