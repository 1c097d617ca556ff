"""Exercise checks in both modes, and the explorer's headless and live paths."""

from __future__ import annotations

import pytest
from pdlab.exercises import FAILED, NOT_ATTEMPTED, PASSED, check_close
from pdlab.exercises.nb02 import check_kv_bytes_70b_fp8, check_transfer_ms_ndr
from pdlab.widgets import kv_explorer, kv_link_figure


def test_checks_pass_fail_and_not_attempted(monkeypatch):
    monkeypatch.setenv("PDLAB_STRICT_CHECKS", "0")
    assert check_kv_bytes_70b_fp8(163_840).status == PASSED
    assert check_kv_bytes_70b_fp8(327_680).status == FAILED
    assert check_kv_bytes_70b_fp8(None).status == NOT_ATTEMPTED
    assert check_transfer_ms_ndr(32.77).status == PASSED
    assert check_transfer_ms_ndr(0.0328).status == FAILED  # seconds, not ms
    assert check_close("x", "abc", 1.0).status == FAILED
    assert "NOT ATTEMPTED" in repr(check_kv_bytes_70b_fp8(None))


def test_strict_mode_raises_unless_passed(monkeypatch):
    monkeypatch.setenv("PDLAB_STRICT_CHECKS", "1")
    assert check_kv_bytes_70b_fp8(163_840).passed
    with pytest.raises(AssertionError, match="FAILED"):
        check_kv_bytes_70b_fp8(1)
    with pytest.raises(AssertionError, match="NOT ATTEMPTED"):
        check_kv_bytes_70b_fp8(None)


def test_kv_figure_is_labelled_and_follows_the_inputs():
    from pdlab.plots import check_labelled

    a = check_labelled(kv_link_figure("llama-3-70b", "bf16", 10_000))
    b = kv_link_figure("llama-3-70b", "fp8", 10_000)
    assert list(b.data[0].y) == pytest.approx([y / 2 for y in a.data[0].y])


def test_explorer_headless_returns_a_static_figure(monkeypatch):
    import plotly.graph_objects as go

    monkeypatch.setenv("PDLAB_HEADLESS", "1")
    fig = kv_explorer(tokens=10_000)
    assert isinstance(fig, go.Figure) and fig.data and len(fig.data[0].y) > 0
    assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_explorer_live_updates_its_figure_when_a_control_changes(monkeypatch):
    monkeypatch.delenv("PDLAB_HEADLESS", raising=False)
    box = kv_explorer(tokens=10_000)
    before = list(box.children[1].data[0].y)
    slider = box.children[0].children[2]
    slider.value = 20_480
    after = list(box.children[1].data[0].y)
    assert after[0] == pytest.approx(before[0] * 2.048)
