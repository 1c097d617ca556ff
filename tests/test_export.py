"""Write-ups: offline math in HTML and PDF, the PDF itself (system Chromium), the write-up mode that
shows a student's answers and verdicts but no other code, and table precision."""

from __future__ import annotations

import re

import nbformat
import pytest
from pdlab.cli import main
from pdlab.course.export import ChromiumNotFoundError, export, find_chromium, table_html, writeup_cells
from pdlab.exercises import check_close

CDN_MATHJAX_SCRIPT = re.compile(r"<script[^>]*src=[\"'][^\"']*mathjax", re.I)


def _nb(*cells):
    nb = nbformat.v4.new_notebook(cells=list(cells))
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _code(source, *outputs, tags=()):
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = list(outputs)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _stdout(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _result(obj):
    return nbformat.v4.new_output("execute_result", data={"text/plain": repr(obj)}, execution_count=1)


def _student_notebook():
    """A small executed student notebook: the outputs are what its cells print when run (the
    verdicts come from the real checks), built here rather than executed to keep the test fast."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[2.0, 4.0, 8.0]))
    fig.update_layout(title="Decode step time against batch size", xaxis_title="batch (requests)",
                      yaxis_title="step time (ms)")
    plot = nbformat.v4.new_output("display_data", data={
        "text/html": fig.to_html(include_plotlyjs=True, full_html=False)
        + '<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/3.2.2/es5/tex-svg.min.js"></script>',
        "text/plain": "Figure"})
    return _nb(
        nbformat.v4.new_markdown_cell("# KV napkin write-up\n\nPer token $x^2$ bytes, and\n\n$$\\frac{a}{b}$$\n\n"
                                      "Prices: A100 $2.20, H100 $4.75 per hour."),
        _code("secret_helper_code = sum(range(10))\nprint('helpers ready')", _stdout("helpers ready\n")),
        _code("make_the_plot()", plot),
        _code("# Exercise 1: double the step time\ndoubled_ms = None  # milliseconds\ndoubled_ms = 2 * 21"),
        _code("check_doubled(doubled_ms)", _result(check_close("Exercise 1", 42, 42.0, unit="ms"))),
        _code("# Exercise 2: the transfer time\ntransfer_ms = None  # milliseconds\n"
              "raise NotImplementedError(\"Exercise 2: the transfer time\")",
              nbformat.v4.new_output("error", ename="NotImplementedError", evalue="Exercise 2: the transfer time",
                                     traceback=["Traceback (most recent call last)", "long traceback line"]),
              tags=["raises-exception"]),
        _code("check_transfer(transfer_ms)", _result(check_close("Exercise 2", None, 3.0))),
    )


def test_html_renders_math_offline_as_mathml(tmp_path):
    path = tmp_path / "math.ipynb"
    nbformat.write(_student_notebook(), path)
    text = export(path, to="html", out=tmp_path / "math.html").read_text()
    assert not CDN_MATHJAX_SCRIPT.search(text), "the HTML still loads MathJax from a CDN"
    assert re.search(r"<math[^>]*display=\"inline\"", text) and "<msup>" in text
    assert re.search(r"<math[^>]*display=\"block\"", text) and "<mfrac>" in text
    assert "\\frac{a}{b}" not in text and "$x^2$" not in text, "math left as TeX"
    assert "A100 $2.20, H100 $4.75" in text, "dollar amounts are not math"


def test_writeup_cells_keep_answers_and_outputs_and_hide_other_code():
    solution = _code("# Exercise 1: double it\nanswer = None\n### BEGIN SOLUTION\nanswer = reference_code()\n"
                     "### END SOLUTION")
    helper = _code("hidden_helper()", _stdout("table\n"))
    silent = _code("import os")
    prose = nbformat.v4.new_markdown_cell("the answer is 42")
    prose.metadata["tags"] = ["solution"]
    out = writeup_cells(_nb(helper, silent, solution, prose))
    assert len(out.cells) == 2, "a code cell with nothing to show and solution prose are left out"
    assert out.cells[0].metadata["transient"] == {"remove_source": True} and out.cells[0].outputs
    assert "reference_code" not in out.cells[1].source and "# Exercise 1: double it" in out.cells[1].source


def test_table_precision_follows_the_column_unit():
    import pandas as pd

    df = pd.DataFrame({"TTFT p90 (ms)": [123.456], "tpot_s": [0.0123456], "SLO attainment": [0.876543],
                       "goodput_rps": [1.23456], "speedup ×": [2.345678], "requests": [12.0], "other": [0.0012345]})
    html = table_html(df)
    for shown in ("123.5", "0.012", "0.88", "1.23", "2.35", ">12<", "0.00123"):
        assert shown in html, shown
    assert "123.456" not in html and "0.876543" not in html


def test_pdf_without_chromium_is_a_clear_cli_error(tmp_path, monkeypatch, capsys):
    path = tmp_path / "w.ipynb"
    nbformat.write(_nb(nbformat.v4.new_markdown_cell("# Title")), path)
    monkeypatch.setenv("PDLAB_CHROMIUM", str(tmp_path / "no-chromium-here"))
    with pytest.raises(ChromiumNotFoundError):
        find_chromium()
    assert main(["course", "export", str(path), "--to", "pdf", "--out", str(tmp_path / "w.pdf")]) == 2
    err = capsys.readouterr().err
    assert "no-chromium-here" in err and "not an executable" in err


@pytest.mark.slow
def test_writeup_pdf_holds_answers_verdicts_plots_and_no_solution_code(tmp_path):
    try:
        find_chromium()
    except ChromiumNotFoundError as exc:
        pytest.skip(str(exc))
    from pypdf import PdfReader

    path = tmp_path / "student.ipynb"
    nbformat.write(_student_notebook(), path)
    pdf = export(path, to="pdf", writeup=True, out=tmp_path / "student.pdf")
    reader = PdfReader(pdf)
    assert len(reader.pages) >= 1
    text = "\n".join(page.extract_text() for page in reader.pages)
    flat = " ".join(text.split())
    for expected in ("KV napkin write-up", "Exercise 1: double the step time", "Exercise 2: the transfer time",
                     "doubled_ms = 2 * 21", "Exercise 1: PASSED", "Exercise 2: NOT ATTEMPTED", "helpers ready",
                     "Decode step time against batch size", "step time (ms)"):
        assert expected in flat, f"{expected!r} not in the PDF: {flat[:800]}"
    for hidden in ("secret_helper_code", "make_the_plot", "check_doubled", "long traceback line"):
        assert hidden not in flat, f"{hidden!r} should not be in a write-up"
    # the same write-up as HTML shows nothing from a CDN for math either
    html = export(path, to="html", writeup=True, out=tmp_path / "student.html").read_text()
    assert not CDN_MATHJAX_SCRIPT.search(html) and "secret_helper_code" not in html
