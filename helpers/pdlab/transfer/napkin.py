"""Napkin math for moving a request's KV cache from a prefill to a decode instance.

Decimal units throughout (1 GB = 1e9 B); link bandwidth is per direction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pdlab.hardware import resolve_link_bandwidth
from pdlab.models import ModelConfig, kv_bytes_per_token

__all__ = ["KVTransfer", "kv_transfer", "resolve_bandwidth", "disaggregation_gain_s"]


@dataclass(frozen=True)
class KVTransfer:
    """The size of one request's KV cache and, with a bandwidth, the time to ship it."""

    model: str
    dtype: str
    kv_bytes_per_token: int
    tokens: int
    kv_bytes: int
    bandwidth_bytes_per_s: float | None = None
    transfer_s: float | None = None

    def as_dict(self) -> dict:
        """JSON-ready dict (keys of ``pdlab kv --json``); bandwidth keys only when set."""
        d = asdict(self)
        if self.bandwidth_bytes_per_s is None:
            d.pop("bandwidth_bytes_per_s")
            d.pop("transfer_s")
        return d


def resolve_bandwidth(link: str | None = None, bandwidth_gbs: float | None = None) -> float | None:
    """Bytes/s from a catalog link name or a bandwidth in GB/s (decimal); None when neither."""
    return resolve_link_bandwidth(link, None if bandwidth_gbs is None else bandwidth_gbs * 1e9)


def kv_transfer(model: ModelConfig, tokens: int, dtype: str = "bf16",
                bandwidth_bytes_per_s: float | None = None) -> KVTransfer:
    """KV bytes for ``tokens`` tokens and, given a bandwidth (B/s), the transfer time in seconds."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    per_token = kv_bytes_per_token(model, dtype)
    total = per_token * tokens
    seconds = None if bandwidth_bytes_per_s is None else total / bandwidth_bytes_per_s
    return KVTransfer(model.name, dtype, per_token, tokens, total, bandwidth_bytes_per_s, seconds)


def disaggregation_gain_s(prefill_saved_s: float, decode_saved_s: float, transfer_s: float) -> float:
    """DistServe's condition as a margin in seconds: > 0 means disaggregation pays.

    Disaggregating pays when the prefill time saved (no decode interference) plus the decode
    time saved (no prefill stalls) exceeds the time to move the KV cache between instances.
    """
    return prefill_saved_s + decode_saved_s - transfer_s
