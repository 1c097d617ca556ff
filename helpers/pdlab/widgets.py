"""ipywidgets explorers driving plotly ``FigureWidget``s; a static figure when run headless.

Headless means ``PDLAB_HEADLESS=1`` (set by ``pdlab course run`` and the notebook tests): papermill
cannot interact with widgets, so the explorer returns the plain figure for its default values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from pdlab.hardware import list_links
from pdlab.models import get_model, list_models
from pdlab.transfer import kv_transfer

__all__ = ["headless", "kv_link_figure", "kv_explorer", "explorer"]


def headless() -> bool:
    """True when running without a live front end (papermill, CI)."""
    return os.environ.get("PDLAB_HEADLESS", "") == "1"


def kv_link_figure(model: str = "llama-3-70b", dtype: str = "bf16", tokens: int = 10_000,
                   fig: go.Figure | None = None) -> go.Figure:
    """Bar chart: time (ms) to move one request's KV cache over every catalog link (log y)."""
    m = get_model(model)
    links = list_links()
    times_ms = [kv_transfer(m, tokens, dtype, link.bytes_per_s).transfer_s * 1e3 for link in links]
    kv = kv_transfer(m, tokens, dtype)
    title = (f"KV transfer time: {m.name} ({m.attention_kind}), {dtype}, {tokens:,} tokens = "
             f"{kv.kv_bytes / 1e9:.2f} GB ({kv.kv_bytes_per_token:,} B/token)")
    fig = fig if fig is not None else go.Figure()
    with fig.batch_update() if isinstance(fig, go.FigureWidget) else _nullcontext():
        fig.data = []
        fig.add_bar(x=[link.key for link in links], y=times_ms,
                    text=[f"{t:,.1f} ms" for t in times_ms], textposition="outside",
                    hovertext=[link.name for link in links], marker_color="#9467bd", name="transfer time")
        fig.update_layout(title=title, xaxis_title="link (per-direction bandwidth)",
                          yaxis_title="transfer time (ms, log scale)", yaxis_type="log", height=460,
                          showlegend=False)
    return fig


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def explorer(controls: dict[str, Any], draw: Callable[..., go.Figure]) -> Any:
    """Generic explorer: ``controls`` maps keyword → ipywidget; ``draw(fig=..., **values)`` redraws.

    Returns a ``VBox`` (controls above a ``FigureWidget``), or the static figure when headless.
    """
    values = {k: w.value for k, w in controls.items()}
    if headless():
        return draw(**values)
    import ipywidgets as widgets

    fig = go.FigureWidget()
    draw(fig=fig, **values)

    def _update(_change=None):
        draw(fig=fig, **{k: w.value for k, w in controls.items()})

    for w in controls.values():
        w.observe(_update, names="value")
    box = widgets.VBox([widgets.HBox(list(controls.values())), fig])
    box.figure = fig  # for tests and the browser check
    return box


def kv_explorer(model: str = "llama-3-70b", dtype: str = "bf16", tokens: int = 10_000) -> Any:
    """Model, dtype and prompt-length controls driving :func:`kv_link_figure`."""
    import ipywidgets as widgets

    controls = {
        "model": widgets.Dropdown(options=[m.name for m in list_models()], value=model, description="model"),
        "dtype": widgets.ToggleButtons(options=["bf16", "fp8"], value=dtype, description="KV dtype"),
        "tokens": widgets.IntSlider(value=tokens, min=512, max=131_072, step=512, description="tokens",
                                    continuous_update=False),
    }
    return explorer(controls, kv_link_figure)
