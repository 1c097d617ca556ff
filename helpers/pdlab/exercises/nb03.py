"""Checks for notebook 03 (measured KV-cache transfer). Expected values are computed, not stored."""

from __future__ import annotations

from pdlab.exercises import CheckResult, check_close
from pdlab.hardware import get_link
from pdlab.models import get_model
from pdlab.transfer import kv_transfer

__all__ = ["check_loopback_transfer_s", "check_min_compute_per_layer_s", "check_layerwise_min_bandwidth_gbs",
           "layerwise_min_bandwidth_bytes_per_s", "best_bandwidth"]


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


def layerwise_min_bandwidth_bytes_per_s(layers: int, compute_per_layer_s: float, layer_bytes: float,
                                        max_exposed_s: float) -> float:
    """The lowest link bandwidth (B/s) at which layer-wise streaming leaves at most ``max_exposed_s``
    of transfer exposed after the prefill's last layer.

    With ``x`` = one layer's transfer time and ``c`` its compute time, layer-wise streaming exposes
    ``x`` when the link keeps up (``x ≤ c``) and ``c + L·(x − c)`` when it does not (the backlog
    grows by ``x − c`` per layer after the first layer's compute). Inverting: ``x_max = E`` for
    ``E ≤ c``, else ``c + (E − c) / L``; the bandwidth is ``layer_bytes / x_max``."""
    if layers <= 0 or compute_per_layer_s < 0 or layer_bytes <= 0 or max_exposed_s <= 0:
        raise ValueError("layers, layer_bytes and max_exposed_s must be positive, compute_per_layer_s non-negative")
    c, e = compute_per_layer_s, max_exposed_s
    x_max = e if e <= c else c + (e - c) / layers
    return layer_bytes / x_max


def check_layerwise_min_bandwidth_gbs(value, layers: int, compute_per_layer_s: float, layer_bytes: float,
                                      max_exposed_s: float) -> CheckResult:
    """Exercise 3: the lowest link bandwidth (GB/s, 1e9 B/s) at which layer-wise streaming leaves at
    most ``max_exposed_s`` exposed (see :func:`layerwise_min_bandwidth_bytes_per_s`)."""
    expected = layerwise_min_bandwidth_bytes_per_s(layers, compute_per_layer_s, layer_bytes, max_exposed_s) / 1e9
    return check_close("Exercise 3", value, expected, rel_tol=0.02, unit="GB/s",
                       hint="Layer-wise exposure is c + L·(x − c) once the link is the bottleneck (x > c): solve "
                            "for the largest x that keeps it ≤ the budget, then bandwidth = bytes per layer ÷ x "
                            "(GB = 1e9 B).")
