"""KV-cache transfer: napkin arithmetic (and, in submodules, measured transports)."""

from pdlab.transfer.napkin import (
    disaggregation_gain_s,
    kv_transfer,
    resolve_bandwidth,
)

__all__ = ["kv_transfer", "resolve_bandwidth", "disaggregation_gain_s"]
