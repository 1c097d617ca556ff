"""Plotly figures in one house style: titles, axis titles with units, log axes for rooflines.

Call :func:`use_house_style` once at the top of a notebook (it sets the template and a renderer
that works in JupyterLab and in exported HTML); build figures with :func:`new_figure`.
"""

from __future__ import annotations

import os

import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["use_house_style", "new_figure", "COLORS", "check_labelled"]

COLORS = {
    "prefill": "#d62728",
    "decode": "#1f77b4",
    "colocated": "#7f7f7f",
    "disaggregated": "#2ca02c",
    "chunked": "#ff7f0e",
    "transfer": "#9467bd",
}

_TEMPLATE = go.layout.Template(
    layout=go.Layout(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        title=dict(x=0.02, xanchor="left"),
        margin=dict(l=70, r=30, t=70, b=60),
        legend=dict(bgcolor="rgba(255,255,255,0.7)"),
        hovermode="closest",
    )
)


def use_house_style() -> None:
    """Set the course template and a renderer that embeds plotly.js (offline HTML, JupyterLab)."""
    pio.templates["pdlab"] = _TEMPLATE
    pio.templates.default = "plotly_white+pdlab"
    # mimetype for JupyterLab, "notebook" embeds plotly.js so exported HTML works offline.
    pio.renderers.default = os.environ.get("PDLAB_PLOTLY_RENDERER", "plotly_mimetype+notebook")


def new_figure(title: str, x_title: str, y_title: str, *, log_x: bool = False, log_y: bool = False,
               height: int = 450) -> go.Figure:
    """An empty figure with a title and axis titles (include units in the axis titles)."""
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=height)
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def check_labelled(fig: go.Figure) -> go.Figure:
    """Raise ValueError unless the figure has a title and titled x and y axes; return it."""
    layout = fig.layout
    missing = [name for name, text in (("title", layout.title.text), ("x axis", layout.xaxis.title.text),
                                       ("y axis", layout.yaxis.title.text)) if not text]
    if missing:
        raise ValueError(f"figure lacks: {', '.join(missing)}")
    return fig
