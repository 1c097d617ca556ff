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

__all__ = ["headless", "explorer", "kv_link_figure", "kv_explorer",
           "roofline_point_figure", "roofline_explorer", "queueing_figure", "queueing_explorer",
           "interference_figure", "interference_explorer"]


def headless() -> bool:
    """True when running without a live front end (papermill, CI)."""
    return os.environ.get("PDLAB_HEADLESS", "") == "1"


def kv_link_figure(model: str = "llama-3-70b", dtype: str = "bf16", tokens: int = 10_000) -> go.Figure:
    """Bar chart: time (ms) to move one request's KV cache over every catalog link (log y)."""
    m = get_model(model)
    links = list_links()
    times_ms = [kv_transfer(m, tokens, dtype, link.bytes_per_s).transfer_s * 1e3 for link in links]
    kv = kv_transfer(m, tokens, dtype)
    title = (f"KV transfer time: {m.name} ({m.attention_kind}), {dtype}, {tokens:,} tokens = "
             f"{kv.kv_bytes / 1e9:.2f} GB ({kv.kv_bytes_per_token:,} B/token)")
    fig = go.Figure()
    fig.add_bar(x=[link.key for link in links], y=times_ms,
                text=[f"{t:,.1f} ms" for t in times_ms], textposition="outside",
                hovertext=[link.name for link in links], marker_color="#9467bd", name="transfer time")
    fig.update_layout(title=title, xaxis_title="link (per-direction bandwidth)",
                      yaxis_title="transfer time (ms, log scale)", yaxis_type="log", height=460,
                      showlegend=False)
    return fig


def explorer(controls: dict[str, Any], draw: Callable[..., go.Figure]) -> Any:
    """Generic explorer: ``controls`` maps keyword → ipywidget; ``draw(**values)`` returns a figure.

    Returns a ``VBox`` (controls above a ``FigureWidget``, redrawn when a control changes; the
    current figure is ``box.children[1]``), or the static figure when headless.
    """
    values = {k: w.value for k, w in controls.items()}
    if headless():
        return draw(**values)
    import ipywidgets as widgets

    # Each redraw builds a new FigureWidget from a complete figure. With plotly 6+ (anywidget),
    # traces added to an empty FigureWidget, and in-place restyles of float arrays, can reach the
    # browser as an empty plot; a widget constructed from a full figure always renders.
    panel = widgets.HBox(list(controls.values()))
    box = widgets.VBox([panel, go.FigureWidget(draw(**values))])

    def _update(_change=None):
        box.children = (panel, go.FigureWidget(draw(**{k: w.value for k, w in controls.items()})))

    for w in controls.values():
        w.observe(_update, names="value")
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


# --- Roofline explorer (notebook 01) -------------------------------------------------------------

def roofline_point_figure(gpu: str = "h100-sxm", model: str = "llama-3-8b", phase: str = "decode",
                          batch: int = 1, length: int = 1024) -> go.Figure:
    """The GPU's bf16 roofline with one step's point (prefill: ``length`` new tokens; decode: context)."""
    from pdlab.hardware import get_gpu
    from pdlab.roofline import analyze
    from pdlab.roofline.plot import add_points, add_roof, roofline_figure

    g = get_gpu(gpu)
    kwargs = {"tokens": length} if phase == "prefill" else {"context": length}
    res = analyze(model, g, phase, batch=batch, **kwargs)
    fig = roofline_figure(f"{g.name}: {model} {phase}, batch {batch}, {'tokens' if phase == 'prefill' else 'context'} "
                          f"{length:,} → {res.bound}-bound, {res.time_s * 1e3:.2f} ms per step", height=480)
    add_roof(fig, f"{g.key} bf16", g.peak_flops("bf16"), g.hbm_bytes_per_s)
    add_points(fig, [res], f"{phase} step", labels=[f"AI {res.arithmetic_intensity:.0f}"],
               color="#d62728" if phase == "prefill" else "#1f77b4")
    return fig


def roofline_explorer(gpu: str = "h100-sxm", model: str = "llama-3-8b", phase: str = "decode",
                      batch: int = 1, length: int = 1024) -> Any:
    """GPU, model, phase, batch and length controls driving :func:`roofline_point_figure`."""
    import ipywidgets as widgets

    from pdlab.hardware import list_gpus

    controls = {
        "gpu": widgets.Dropdown(options=[g.key for g in list_gpus()], value=gpu, description="GPU"),
        "model": widgets.Dropdown(options=[m.name for m in list_models()], value=model, description="model"),
        "phase": widgets.ToggleButtons(options=["prefill", "decode"], value=phase, description="phase"),
        "batch": widgets.IntSlider(value=batch, min=1, max=512, description="batch", continuous_update=False),
        "length": widgets.IntSlider(value=length, min=16, max=32_768, step=16, description="length",
                                    continuous_update=False),
    }
    return explorer(controls, roofline_point_figure)


# --- Queueing explorer (notebook 05) -------------------------------------------------------------

def queueing_figure(rate: float = 0.5, service_s: float = 1.0, speedup: float = 1.5) -> go.Figure:
    """DistServe §3.1 average TTFT against arrival rate: one GPU, 2-way inter-op, 2-way intra-op."""
    import numpy as np

    from pdlab.sched.queueing import avg_ttft_inter_op, avg_ttft_intra_op, avg_ttft_single

    fig = go.Figure()
    curves = {
        "single device": (avg_ttft_single, 1.0 / service_s),
        "2-way inter-op (pipeline)": (avg_ttft_inter_op, 2.0 / service_s),
        f"2-way intra-op (K={speedup:g})": (lambda r, d: avg_ttft_intra_op(r, d, speedup), speedup / service_s),
    }
    for name, (fn, limit) in curves.items():
        xs = np.linspace(0.01 * limit, 0.98 * limit, 80)
        fig.add_scatter(x=xs, y=[fn(float(x), service_s) for x in xs], mode="lines", name=name)
    marks = [(name, fn(rate, service_s)) for name, (fn, limit) in curves.items() if rate < limit]
    fig.add_scatter(x=[rate] * len(marks), y=[v for _, v in marks], mode="markers", name=f"rate {rate:g} req/s",
                    marker=dict(size=10, color="black"), text=[n for n, _ in marks])
    fig.update_layout(title=f"M/D/1 average TTFT, service time D = {service_s:g} s (DistServe OSDI'24 §3.1)",
                      xaxis_title="arrival rate R (requests/s)", yaxis_title="average TTFT (s)",
                      yaxis_range=[0, 6 * service_s], height=460)
    return fig


def queueing_explorer(rate: float = 0.5, service_s: float = 1.0, speedup: float = 1.5) -> Any:
    """Rate, service time and intra-op speedup K controls driving :func:`queueing_figure`."""
    import ipywidgets as widgets

    controls = {
        "rate": widgets.FloatSlider(value=rate, min=0.05, max=1.9, step=0.05, description="rate (1/s)",
                                    continuous_update=False),
        "service_s": widgets.FloatSlider(value=service_s, min=0.1, max=2.0, step=0.1, description="D (s)",
                                         continuous_update=False),
        "speedup": widgets.FloatSlider(value=speedup, min=1.05, max=1.95, step=0.05, description="K",
                                       continuous_update=False),
    }
    return explorer(controls, queueing_figure)


# --- Interference explorer (notebook 06) ---------------------------------------------------------

def interference_figure(rate: float = 4.0, token_budget: int = 512, gpu: str = "h100-sxm",
                        model: str = "llama-3-8b", requests: int = 300, seed: int = 0,
                        link: str = "nvlink4") -> go.Figure:
    """Simulated p50/p99 TTFT and ITL for colocated, chunked (``token_budget``) and 1P1D serving.

    Same Poisson workload (ShareGPT lengths) for all three on two GPUs' worth of hardware:
    2 colocated instances, 2 chunked instances, or 1 prefill + 1 decode instance whose KV moves over ``link``.
    """
    from plotly.subplots import make_subplots

    from pdlab.sim import PoissonSource, simulate

    reqs = PoissonSource(n=requests, rate_rps=rate, lengths="sharegpt", seed=seed).requests()
    runs = {
        "colocated": simulate(reqs, "colocated", gpu, model, instances=2),
        f"chunked ({token_budget} tokens)": simulate(reqs, "chunked", gpu, model, instances=2,
                                                     token_budget=token_budget),
        "disaggregated 1P1D": simulate(reqs, "disaggregated", gpu, model, prefill=1, decode=1, link=link),
    }
    colors = ["#7f7f7f", "#ff7f0e", "#2ca02c"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "inter-token latency"))
    for (name, res), color in zip(runs.items(), colors, strict=True):
        s = res.summary()
        for col, metric in ((1, "ttft"), (2, "itl")):
            fig.add_bar(x=["p50", "p99"], y=[s[f"{metric}_p50_s"] * 1e3, s[f"{metric}_p99_s"] * 1e3], name=name,
                        marker_color=color, legendgroup=name, showlegend=col == 1, row=1, col=col)
    fig.update_layout(title=f"{model} on 2× {gpu}, Poisson {rate:g} req/s, ShareGPT lengths ({requests} requests)",
                      barmode="group", height=460)
    fig.update_yaxes(title_text="TTFT (ms)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="ITL (ms)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="percentile", row=1, col=1)
    fig.update_xaxes(title_text="percentile", row=1, col=2)
    return fig


def interference_explorer(rate: float = 4.0, token_budget: int = 512, gpu: str = "h100-sxm",
                          model: str = "llama-3-8b", link: str = "nvlink4") -> Any:
    """Arrival-rate and chunk-budget controls driving :func:`interference_figure` (re-simulated)."""
    import ipywidgets as widgets

    controls = {
        "rate": widgets.FloatSlider(value=rate, min=0.5, max=40.0, step=0.5, description="rate (1/s)",
                                    continuous_update=False),
        "token_budget": widgets.SelectionSlider(options=[128, 256, 512, 1024, 2048, 4096], value=token_budget,
                                                description="chunk budget", continuous_update=False),
    }

    def draw(rate: float, token_budget: int) -> go.Figure:
        return interference_figure(rate, token_budget, gpu, model, link=link)

    return explorer(controls, draw)
