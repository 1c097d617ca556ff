"""Write-ups: an executed notebook exported to HTML or Markdown, and a lab's results as a small
notebook of markdown, tables and plotly figures.

A lab builds its write-up from the results it computed (no re-execution, :func:`writeup_notebook`),
saves it under ``build/writeups/`` and exports it with ``pdlab course export NOTEBOOK --no-input``
(:func:`export_writeup`) — the command a reader would type — so the HTML holds the prose, the
result tables and the interactive plots without code.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from pdlab.course.generate import cell_tags
from pdlab.paths import build_dir

__all__ = ["export", "writeup_notebook", "export_writeup"]


def export(notebook: Path, *, to: str = "html", out: Path | None = None, no_input: bool = False) -> Path:
    """Turn an executed notebook into a write-up (HTML or Markdown); ``no_input`` hides code."""
    from nbconvert import HTMLExporter, MarkdownExporter

    exporters = {"html": (HTMLExporter, ".html"), "markdown": (MarkdownExporter, ".md")}
    if to not in exporters:
        raise ValueError(f"unknown export format {to!r}; use html or markdown")
    cls, suffix = exporters[to]
    exporter = cls()
    exporter.exclude_input = no_input
    exporter.exclude_input_prompt = no_input
    exporter.exclude_output_prompt = no_input
    nb = nbformat.read(notebook, as_version=4)
    nb.cells = [c for c in nb.cells if "papermill-error-cell-tag" not in cell_tags(c)]
    body, resources = exporter.from_notebook_node(nb)
    out = out or build_dir() / "writeups" / (Path(notebook).stem + suffix)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    for name, data in (resources.get("outputs") or {}).items():
        (out.parent / name).write_bytes(data)
    return out


def _output_cell(data: dict[str, Any]) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    return cell


def writeup_notebook(items: Sequence[Any], path: str | Path) -> Path:
    """Save a notebook from ``items``: strings (markdown), pandas DataFrames (HTML tables) and plotly
    figures (interactive HTML; plotly.js is embedded once, so the file works offline)."""
    cells = []
    first_fig = True
    for item in items:
        if isinstance(item, str):
            cells.append(nbformat.v4.new_markdown_cell(item))
        elif hasattr(item, "to_html") and hasattr(item, "to_plotly_json"):
            html = item.to_html(include_plotlyjs=True if first_fig else False, full_html=False)
            first_fig = False
            cells.append(_output_cell({"text/html": html, "text/plain": "<plotly figure>"}))
        elif hasattr(item, "to_html"):
            cells.append(_output_cell({"text/html": item.to_html(float_format=lambda x: f"{x:.4g}"),
                                       "text/plain": str(item)}))
        else:
            raise TypeError(f"cannot put a {type(item).__name__} in a write-up")
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def export_writeup(notebook: str | Path, out: str | Path | None = None) -> Path:
    """Run ``pdlab course export NOTEBOOK --no-input --out OUT`` (default ``build/writeups/<stem>.html``)."""
    notebook = Path(notebook)
    out = Path(out) if out else build_dir() / "writeups" / f"{notebook.stem}.html"
    cmd = [sys.executable, "-m", "pdlab.cli", "course", "export", str(notebook), "--no-input", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"export failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return out
