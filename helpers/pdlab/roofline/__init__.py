"""Roofline of prefill and decode: analytic per-operator costs, measured device peaks, plots.

- :mod:`pdlab.roofline.analytic` — FLOPs and HBM bytes per operator for any catalog GPU and model.
- :mod:`pdlab.roofline.measure` — matmul FLOP/s, memory bandwidth and a real layer on this device.
- :mod:`pdlab.roofline.plot` — log-log roofline figures in the house style (plotly; imported on
  first use of ``roofline_figure``, ``add_roof`` or ``add_points``, so the analysis imports no plotting).
"""

from typing import Any

from pdlab.roofline.analytic import (
    PHASES,
    OpCost,
    RooflineResult,
    analyze,
    attainable_flops,
    critical_decode_batch,
    layer_ops,
    link_bytes_per_s,
    model_ops,
)
from pdlab.roofline.measure import (
    DeviceProfile,
    LayerShape,
    list_profiles,
    load_device_profile,
    match_catalog_gpu,
    measure_device,
    save_device_profile,
)

_PLOT_NAMES = ("add_points", "add_roof", "roofline_figure")


def __getattr__(name: str) -> Any:
    if name in _PLOT_NAMES:
        from pdlab.roofline import plot

        return getattr(plot, name)
    raise AttributeError(f"module 'pdlab.roofline' has no attribute {name!r}")

__all__ = [
    "PHASES",
    "OpCost",
    "RooflineResult",
    "analyze",
    "attainable_flops",
    "critical_decode_batch",
    "layer_ops",
    "link_bytes_per_s",
    "model_ops",
    "DeviceProfile",
    "LayerShape",
    "list_profiles",
    "load_device_profile",
    "match_catalog_gpu",
    "measure_device",
    "save_device_profile",
    "add_points",
    "add_roof",
    "roofline_figure",
]
