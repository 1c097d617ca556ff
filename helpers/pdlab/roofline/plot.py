"""Log-log roofline figures (plotly, house style): roofs of devices and points of steps or layers.

x: arithmetic intensity in FLOP/byte; y: attainable or achieved throughput in TFLOP/s (1e12 FLOP/s).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import plotly.graph_objects as go

from pdlab.plots import new_figure

__all__ = ["roofline_figure", "add_roof", "add_points"]

_X_TITLE = "Arithmetic intensity (FLOP/byte, log)"
_Y_TITLE = "Throughput (TFLOP/s, log)"


def roofline_figure(title: str = "Roofline", *, height: int = 520) -> go.Figure:
    """An empty log-log roofline figure with titled axes (FLOP/byte vs TFLOP/s)."""
    return new_figure(title, _X_TITLE, _Y_TITLE, log_x=True, log_y=True, height=height)


def add_roof(fig: go.Figure, name: str, peak_flops_per_s: float, bytes_per_s: float, *,
             x_range: tuple[float, float] = (0.1, 1e5), color: str | None = None, dash: str | None = None,
             show_ridge: bool = True) -> go.Figure:
    """Add ``min(peak, AI × bandwidth)`` as a line, with the ridge point marked."""
    x = np.logspace(np.log10(x_range[0]), np.log10(x_range[1]), 200)
    y = np.minimum(peak_flops_per_s, x * bytes_per_s) / 1e12
    line = dict(color=color, dash=dash) if color or dash else None
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line=line, legendgroup=name,
                             hovertemplate=f"{name}<br>AI %{{x:.3g}} FLOP/B<br>%{{y:.4g}} TFLOP/s<extra></extra>"))
    if show_ridge:
        ridge = peak_flops_per_s / bytes_per_s
        fig.add_trace(go.Scatter(x=[ridge], y=[peak_flops_per_s / 1e12], mode="markers", showlegend=False,
                                 legendgroup=name, marker=dict(symbol="diamond-open", size=9, color=color),
                                 hovertemplate=f"{name} ridge: {ridge:.3g} FLOP/B<extra></extra>"))
    return fig


def _get(p: Any, key: str) -> Any:
    return p[key] if isinstance(p, dict) else getattr(p, key)


def add_points(fig: go.Figure, points: Iterable[Any], name: str, *, y: str = "attainable",
               color: str | None = None, symbol: str = "circle", labels: Iterable[str] | None = None,
               size: int = 9) -> go.Figure:
    """Add points at their arithmetic intensity.

    ``points``: :class:`~pdlab.roofline.analytic.RooflineResult` objects or dicts/objects with
    ``flops``, ``bytes`` and either ``time_s``. ``y="attainable"`` plots FLOPs / predicted time
    (analytic results); ``y="achieved"`` plots FLOPs / measured time (same formula, measured time).
    """
    pts = list(points)
    xs = [_get(p, "flops") / _get(p, "bytes") for p in pts]
    ys = [_get(p, "flops") / _get(p, "time_s") / 1e12 for p in pts]
    text = list(labels) if labels is not None else [""] * len(pts)
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers", name=name, text=text,
        marker=dict(symbol=symbol, size=size, color=color, line=dict(width=1, color="white")),
        hovertemplate=f"{name} ({y})<br>%{{text}}<br>AI %{{x:.3g}} FLOP/B<br>%{{y:.4g}} TFLOP/s<extra></extra>"))
    return fig
