"""Checks for notebook 03 (measured KV-cache transfer). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_link
from pdlab.models import get_model
from pdlab.transfer import kv_transfer

__all__ = ["check_loopback_transfer_s", "check_min_compute_per_layer_s", "check_exposed_layerwise_s",
           "best_bandwidth"]


def best_bandwidth(report) -> float:
    """The highest median bandwidth (B/s) of any transport in a :class:`pdlab.transfer.BenchReport`."""
    return max(b["bandwidth_bytes_per_s"] for b in report.best())


def check_loopback_transfer_s(value, report, model: str = "llama-3-8b", tokens: int = 4096,
                              dtype: str = "bf16") -> CheckResult:
    """Exercise 1: seconds to ship ``tokens`` tokens of ``model`` KV at the best bandwidth measured here."""
    kv_bytes = kv_transfer(get_model(model), tokens, dtype).kv_bytes
    expected = kv_bytes / best_bandwidth(report)
    return check_close("Exercise 1", value, expected, rel_tol=0.02, unit="s",
                       hint="KV bytes (kv_transfer(...).kv_bytes) ÷ the best bandwidth in report.best().")


def check_min_compute_per_layer_s(value, model: str = "llama-3-70b", tokens: int = 8192, dtype: str = "bf16",
                                  link: str = "ib-ndr") -> CheckResult:
    """Exercise 2: the per-layer compute time (s) below which layer-wise streaming stops hiding the transfer."""
    m = get_model(model)
    per_layer = kv_transfer(m, tokens, dtype).kv_bytes / m.num_layers
    expected = per_layer / get_link(link).bytes_per_s
    return check_close("Exercise 2", value, expected, rel_tol=0.02, unit="s",
                       hint="One layer's KV bytes ÷ the link's bytes/s: compute must take at least that long.")


def check_exposed_layerwise_s(value, layers: int, compute_per_layer_s: float,
                              transfer_per_layer_s: float) -> CheckResult:
    """Exercise 3: exposed transfer time of layer-wise streaming when the link is the bottleneck."""
    from pdlab.transfer.overlap import predicted_exposed_s

    expected = predicted_exposed_s(layers, compute_per_layer_s, transfer_per_layer_s, "layerwise")
    return check_close("Exercise 3", value, expected, rel_tol=0.02, unit="s",
                       hint="Finish time F_i = max(F_{i-1}, (i+1)·c) + x; exposed = F_L − L·c.")
