"""pdlab.plots: reference lines that land where they should on log axes, and the figure lint that
the notebook tests run on every figure (raw facet labels, untitled axes, misplaced annotations)."""

from __future__ import annotations

import math

import plotly.express as px
import plotly.graph_objects as go
from pdlab.plots import figure_problems, new_figure, reference_line


def _line_figure(log_y: bool) -> go.Figure:
    fig = new_figure("Transfer time against prompt length", "prompt length (tokens)", "transfer time (ms)",
                     log_x=True, log_y=log_y)
    fig.add_scatter(x=[512, 4096, 32768], y=[0.5, 4.0, 32.0], name="link")
    return fig


def test_a_labelled_figure_has_no_problems():
    assert figure_problems(_line_figure(log_y=True)) == []
    assert figure_problems(_line_figure(log_y=True).to_plotly_json()) == []


def test_reference_line_label_sits_on_its_line_on_log_and_linear_axes():
    for log_y in (True, False):
        fig = reference_line(_line_figure(log_y), 20.0, "one decode step (20 ms)")
        ann = fig.layout.annotations[-1]
        assert ann.y == (math.log10(20.0) if log_y else 20.0)
        assert fig.layout.shapes[-1].y0 == 20.0
        assert figure_problems(fig) == []


def test_add_hline_label_on_a_log_axis_is_reported():
    fig = _line_figure(log_y=True)
    fig.add_hline(y=20.0, annotation_text="one decode step (20 ms)")
    assert any("log axis" in p for p in figure_problems(fig))


def test_raw_facet_labels_and_untitled_axes_are_reported():
    import pandas as pd

    df = pd.DataFrame({"rate": [1, 2, 1, 2], "slo_attainment": [1.0, 0.9, 0.8, 0.5], "workload": ["a", "a", "b", "b"]})
    fig = px.line(df, x="rate", y="slo_attainment", facet_col="workload", title="SLO attainment")
    problems = figure_problems(fig)
    assert any("raw facet label 'workload=a'" in p for p in problems)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[1]))
    fig.update_xaxes(title_text="rate (requests/s)").update_yaxes(title_text="SLO attainment (fraction)", row=1, col=1)
    assert figure_problems(fig) == []
    assert figure_problems(go.Figure(go.Scatter(x=[1], y=[1]))) == ["no title", "xaxis has no title", "yaxis has no title"]
