"""Plotly figures in one house style: titles, axis titles with units, log axes for rooflines.

Call :func:`use_house_style` once at the top of a notebook (it sets the template and a renderer
that works in JupyterLab and in exported HTML); build figures with :func:`new_figure`; draw a
labelled reference line with :func:`reference_line` (right on log axes too). :func:`figure_problems`
lists what makes a figure hard to read (the notebook tests run it on every figure they produce).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["use_house_style", "new_figure", "COLORS", "check_labelled", "reference_line", "figure_problems"]

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


def reference_line(fig: go.Figure, y: float, text: str, *, row: int | None = None, col: int | None = None,
                   color: str = "#555", dash: str = "dash", font_size: int = 11, anchor: str = "right") -> go.Figure:
    """A horizontal line at ``y`` (data units) with ``text`` above its ``anchor`` ("right"/"left") end.

    ``fig.add_hline(annotation_text=...)`` puts the label at ``y`` even on a log axis, where plotly
    reads annotation coordinates as log10: a label at 20 ms lands at 1e20 and drags the axis there.
    """
    kw = {} if row is None else {"row": row, "col": col}
    fig.add_hline(y=y, line=dict(color=color, dash=dash, width=1), **kw)
    axis = fig.layout.yaxis if row is None else fig.get_subplot(row, col).yaxis
    y_ann = math.log10(y) if axis.type == "log" else y
    yref = "y" if row is None else axis.plotly_name.replace("axis", "")
    xref = "x domain" if row is None else fig.get_subplot(row, col).xaxis.plotly_name.replace("axis", "") + " domain"
    fig.add_annotation(x=1 if anchor == "right" else 0, xref=xref, y=y_ann, yref=yref, text=text, showarrow=False,
                       xanchor=anchor, yanchor="bottom", font=dict(size=font_size, color=color))
    return fig


_RAW_FACET = re.compile(r"^[A-Za-z_][\w.]*=")


def _text(title: Any) -> str | None:
    if isinstance(title, dict):
        return title.get("text")
    return title if isinstance(title, str) else None


def _log_data_range(traces: list, letter: str, ref: str) -> tuple[float | None, float | None]:
    """log10 of the smallest and largest positive value the traces on axis ``ref`` plot along ``letter``."""
    values = []
    for trace in traces:
        if (trace.get(f"{letter}axis", letter) or letter) != ref:
            continue
        data = trace.get(letter)
        if isinstance(data, dict):  # plotly's typed-array encoding ({"dtype": ..., "bdata": ...})
            try:
                import base64

                import numpy as np

                data = np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
            except (KeyError, ValueError, TypeError):
                continue
        for v in data if isinstance(data, (list, tuple)) else (data.tolist() if hasattr(data, "tolist") else []):
            if isinstance(v, (int, float)) and v > 0 and math.isfinite(v):
                values.append(math.log10(v))
    return (min(values), max(values)) if values else (None, None)


def figure_problems(fig: go.Figure | dict) -> list[str]:
    """What makes ``fig`` (a figure or its JSON dict) hard to read; empty when nothing does.

    Checks: a title; a title on every x and y axis (an axis that ``matches`` a titled one may go
    without); no facet labels made of raw column names (``workload=chat``); no annotation on a log
    axis placed at a data value instead of its log10 (it lands far from its line or outside the
    data, and stretches the axis); no axis with its tick labels switched off unless it matches another axis."""
    d = fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else fig
    layout = d.get("layout", {}) or {}
    problems = []
    if not _text(layout.get("title")):
        problems.append("no title")
    axes = {k: v or {} for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k)}
    for trace in d.get("data", []):
        for letter in "xy":
            ref = trace.get(f"{letter}axis", letter)
            axes.setdefault(f"{letter}axis{ref[1:]}", {})
    for name, ax in sorted(axes.items()):
        if not isinstance(ax, dict):
            continue
        matched = bool(ax.get("matches")) or bool(ax.get("overlaying"))
        if not _text(ax.get("title")) and not matched:
            problems.append(f"{name} has no title")
        if ax.get("showticklabels") is False and not matched:
            problems.append(f"{name} has no tick labels")
    for ann in layout.get("annotations", []) or []:
        text = ann.get("text") or ""
        if _RAW_FACET.match(text):
            problems.append(f"raw facet label {text!r} (name the facet: for_each_annotation)")
        for letter in "xy":
            ref = ann.get(f"{letter}ref", letter) or letter
            if "domain" in ref or ref == "paper":
                continue
            axis_name = f"{letter}axis{ref[1:]}"
            value = ann.get(letter)
            if axes.get(axis_name, {}).get("type") != "log" or not isinstance(value, (int, float)):
                continue
            lo, hi = _log_data_range(d.get("data", []), letter, ref)
            on_a_line = any(sh.get(f"{letter}ref", letter) == ref and sh.get(f"{letter}0") == value
                            and sh.get(f"{letter}1") == value for sh in layout.get("shapes", []) or [])
            if on_a_line or (lo is not None and not lo - 2 <= value <= hi + 2):
                problems.append(f"annotation {text!r} at {letter}={value:g} on a log axis: plotly reads it as "
                                f"1e{value:g} (use log10 of the value: pdlab.plots.reference_line)")
    return problems
