"""Roofline of prefill and decode: analytic per-operator costs, measured device peaks, plots.

- :mod:`pdlab.roofline.analytic` — FLOPs and HBM bytes per operator for any catalog GPU and model.
- :mod:`pdlab.roofline.measure` — matmul FLOP/s, memory bandwidth and a real layer on this device.
- :mod:`pdlab.roofline.plot` — log-log roofline figures in the house style.
"""

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
    load_profile,
    match_catalog_gpu,
    measure_device,
    save_profile,
)
from pdlab.roofline.plot import add_points, add_roof, roofline_figure

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
    "load_profile",
    "match_catalog_gpu",
    "measure_device",
    "save_profile",
    "add_points",
    "add_roof",
    "roofline_figure",
]
