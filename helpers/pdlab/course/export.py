"""Write-ups: an executed notebook exported to HTML, PDF or Markdown, and a lab's results as a
small notebook of markdown, tables and plotly figures.

A lab builds its write-up from the results it computed (no re-execution, :func:`writeup_notebook`),
saves it under ``build/writeups/`` and exports it with ``pdlab course export NOTEBOOK --no-input``
(:func:`export_writeup`) — the command a reader would type — so the HTML holds the prose, the
result tables and the interactive plots without code.

Three ways to show code: all of it (default); none (``no_input``); or a student's write-up
(``writeup``): the input of each exercise's answer cell (``# Exercise N: ...``) with any
``### BEGIN SOLUTION`` block removed, every output (check verdicts, tables, plots), and no other
code. Cells tagged ``solution`` are left out of a write-up.

Offline by construction: math in markdown is rendered to MathML at export time (latex2mathml;
Chromium and Firefox draw MathML natively), so the HTML and PDF carry no MathJax and load nothing
from a CDN to show an equation. PDF is nbconvert's WebPDF, printed by the system Chromium
(``/usr/bin/chromium``, installed by ``scripts/install.sh``; ``PDLAB_CHROMIUM`` names another)
with every network request blocked.
"""

from __future__ import annotations

import copy
import html as html_lib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from pdlab.course.generate import BEGIN, END, cell_tags
from pdlab.paths import build_dir

__all__ = ["export", "writeup_notebook", "export_writeup", "writeup_cells", "latex_to_mathml", "table_html", "column_format",
           "find_chromium", "ChromiumNotFoundError", "EXPORT_FORMATS", "TABLE_FORMATS"]

EXPORT_FORMATS = {"html": ".html", "pdf": ".pdf", "markdown": ".md"}
_EXERCISE_LINE = re.compile(r"^\s*#\s*Exercise\s+[\w.]+", re.M)
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class ChromiumNotFoundError(RuntimeError):
    """No Chromium to print a PDF with."""


def find_chromium() -> str:
    """The Chromium executable for PDF export: ``$PDLAB_CHROMIUM``, else ``chromium`` on PATH, else
    ``/usr/bin/chromium``; raise :class:`ChromiumNotFoundError` naming what to install."""
    explicit = os.environ.get("PDLAB_CHROMIUM")
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise ChromiumNotFoundError(f"PDLAB_CHROMIUM={explicit} is not an executable file")
    for name in _CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    raise ChromiumNotFoundError(
        "PDF export needs Chromium and none was found (looked for $PDLAB_CHROMIUM, "
        f"{', '.join(_CHROMIUM_NAMES)} on PATH, /usr/bin/chromium). Install it with "
        "`apt-get install chromium` (scripts/install.sh does this as root), set PDLAB_CHROMIUM to a "
        "Chromium/Chrome binary, or export --to html.")


# --- math ------------------------------------------------------------------------------------------

def latex_to_mathml(tex: str, *, display: bool = False) -> str:
    """``tex`` (LaTeX math, no delimiters) as a MathML ``<math>`` element; on a conversion error the
    TeX itself in ``<code>`` so the page still says what was meant."""
    from latex2mathml.converter import convert

    try:
        return convert(tex.strip(), display="block" if display else "inline")
    except Exception:  # latex2mathml raises its own exception types for unsupported commands
        return f'<code class="tex">{html_lib.escape(tex)}</code>'


def _mathml_renderer_class():
    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class MathMLRenderer(IPythonRenderer):
        """nbconvert's markdown renderer with math drawn as MathML instead of left for MathJax."""

        def block_math(self, body: str) -> str:
            return latex_to_mathml(body, display=True)

        def latex_environment(self, name: str, body: str) -> str:
            return latex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

        def inline_math(self, body: str) -> str:
            # Pandoc's rule: "$ 5 and $ 6" is money, not math (no space just inside the dollars).
            if not body.strip() or body[0].isspace() or body[-1].isspace():
                return "$" + self.escape_html(body) + "$"
            return latex_to_mathml(body)

    return MathMLRenderer


_TEMPLATE = (
    "{%- extends 'index.html.j2' -%}\n"
    "{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}\n"
    "{% block extra_css %}<style>math[display=block] { margin: 0.6em 0; font-size: 1.1em; }\n"
    ".jp-RenderedHTMLCommon table { font-variant-numeric: tabular-nums; }\n"
    "@media print { pre { white-space: pre-wrap; overflow-wrap: anywhere; } }</style>{% endblock extra_css %}\n"
)


def _offline_exporter(pdf: bool):
    """An HTMLExporter (or WebPDFExporter) with MathML math, no MathJax, and the system Chromium."""
    from jinja2 import DictLoader, pass_context
    from nbconvert import HTMLExporter, WebPDFExporter
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    base = WebPDFExporter if pdf else HTMLExporter
    renderer_cls = _mathml_renderer_class()

    class OfflineExporter(base):  # type: ignore[misc, valid-type]
        @pass_context
        def markdown2html(self, context, source):
            cell = context.get("cell", {})
            path = context.get("resources", {}).get("metadata", {}).get("path", "")
            renderer = renderer_cls(escape=False, attachments=cell.get("attachments", {}),
                                    embed_images=self.embed_images, path=path,
                                    anchor_link_text=self.anchor_link_text,
                                    exclude_anchor_links=self.exclude_anchor_links, **self.lexer_options)
            return MarkdownWithMath(renderer=renderer).render(source)


        def run_playwright(self, html: str) -> bytes:
            return _print_pdf(html, find_chromium(), paginate=self.paginate)

    exporter = OfflineExporter(extra_loaders=[DictLoader({"pdlab_offline.html.j2": _TEMPLATE})],
                               template_file="pdlab_offline.html.j2")
    if pdf:
        exporter.exclude_anchor_links = True
    return exporter


_PAGE_WIDTH_PX = 816  # US Letter, 8.5 in at 96 CSS px per inch: Chromium's default PDF page
_PLOTS_DRAWN = ("() => [...document.querySelectorAll('.plotly-graph-div')]"
                ".every(d => d._fullLayout && d.querySelector('.main-svg'))")
# Each interactive plot becomes a static SVG image that fits the page (an interactive plot prints
# at the width it was drawn at, and a plot wider than the paper loses its right side and x axis).
_PLOTS_TO_IMAGES = """async () => {
  if (!window.Plotly) return 0;
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  for (const gd of divs) {
    const height = (gd._fullLayout && gd._fullLayout.height) || 450;
    const width = Math.max(600, Math.min(960, gd.getBoundingClientRect().width || 720));
    const url = await window.Plotly.toImage(gd, {format: 'svg', width: width, height: height});
    const img = document.createElement('img');
    img.src = url;
    img.style.width = '100%';
    img.style.height = 'auto';
    img.style.breakInside = 'avoid';
    if (gd.parentElement) gd.parentElement.style.height = 'auto';
    gd.replaceWith(img);
  }
  await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
  return divs.length;
}"""
# No emoji font on a bare Debian: the checks' verdict symbols print as boxes, so swap in DejaVu's.
_PRINTABLE_SYMBOLS = {"✅": "✔", "❌": "✘", "⏳": "○"}


def _print_pdf(html: str, chromium: str, *, paginate: bool = True, timeout_s: float = 120.0) -> bytes:
    """Print ``html`` to PDF with Chromium through Playwright; only file: and data: URLs load."""
    import asyncio
    import concurrent.futures
    import tempfile

    from playwright.async_api import async_playwright

    async def main(page_file: str) -> bytes:
        async with async_playwright() as pw:
            try:
                browser = await pw.chromium.launch(executable_path=chromium, args=_CHROMIUM_ARGS,
                                                   handle_sigint=False, handle_sigterm=False,
                                                   handle_sighup=False, timeout=timeout_s * 1000)
            except Exception as exc:
                raise ChromiumNotFoundError(f"Chromium at {chromium} did not start: {exc}") from exc
            try:
                page = await browser.new_page(viewport={"width": _PAGE_WIDTH_PX, "height": 1056})

                async def offline(route):
                    if route.request.url.startswith(("file:", "data:", "blob:", "about:")):
                        await route.continue_()
                    else:
                        await route.abort()

                await page.route("**/*", offline)
                await page.emulate_media(media="print")
                await page.goto(Path(page_file).as_uri(), wait_until="load", timeout=timeout_s * 1000)
                # plotly draws after load: wait until every plot is drawn, then make each an image
                await page.wait_for_function(_PLOTS_DRAWN, timeout=30_000)
                await page.evaluate(_PLOTS_TO_IMAGES)
                await page.wait_for_timeout(200)
                params: dict[str, Any] = {"print_background": True}
                if not paginate:
                    size = await page.evaluate("() => { const r = document.body.getBoundingClientRect();"
                                               " return {w: Math.ceil(r.width) + 1, h: Math.ceil(r.height) + 1}; }")
                    params.update(width=min(size["w"], 200 * 72), height=min(size["h"], 200 * 72))
                return await page.pdf(**params)
            finally:
                await browser.close()

    for symbol, printable in _PRINTABLE_SYMBOLS.items():
        html = html.replace(symbol, printable)
    with tempfile.TemporaryDirectory(prefix="pdlab-pdf-") as tmp:
        page_file = Path(tmp) / "writeup.html"
        page_file.write_text(html, encoding="utf-8")
        # its own thread and event loop: export may be called from inside a running loop (Jupyter)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, main(str(page_file))).result()


# plotly's notebook renderer adds MathJax from a CDN to every figure (for LaTeX in labels, which
# the course's figures do not use): an offline export drops it.
_CDN_MATHJAX = re.compile(r"<script[^>]*\bsrc=[\"'][^\"']*mathjax[^\"']*[\"'][^>]*>\s*</script>", re.I)


def _without_cdn_mathjax(nb) -> None:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html")
            if html:
                text = "".join(html) if isinstance(html, list) else html
                output["data"]["text/html"] = _CDN_MATHJAX.sub("", text)


# --- write-up mode --------------------------------------------------------------------------------

def _without_solution_blocks(source: str) -> str:
    out, inside = [], False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}...  # (reference solution not shown)")
        elif stripped == END:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def _short_error(output) -> dict:
    text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}\n"
    return nbformat.v4.new_output("stream", name="stderr", text=text)


def writeup_cells(nb) -> nbformat.NotebookNode:
    """A copy of ``nb`` for a student's write-up: exercise answer cells keep their input (solution
    blocks removed) and show an error as one line; every other code cell shows only its outputs;
    ``solution``-tagged cells are dropped."""
    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb.cells:
        if "solution" in cell_tags(cell):
            continue
        if cell.cell_type == "code":
            if _EXERCISE_LINE.search(cell.source):
                cell.source = _without_solution_blocks(cell.source)
                cell.outputs = [_short_error(o) if o.get("output_type") == "error" else o
                                for o in cell.get("outputs", [])]
            else:
                cell.metadata.setdefault("transient", {})["remove_source"] = True
                if not cell.get("outputs"):
                    continue
        cells.append(cell)
    nb.cells = cells
    return nb


# --- export ---------------------------------------------------------------------------------------

def export(notebook: Path, *, to: str = "html", out: Path | None = None, no_input: bool = False,
           writeup: bool = False) -> Path:
    """Turn an executed notebook into a write-up (HTML, PDF or Markdown) and return its path.

    ``no_input`` hides all code; ``writeup`` shows the exercise answers' code and every output but
    no other code (see the module docstring). Raise :class:`ChromiumNotFoundError` for PDF without
    a Chromium."""
    if to not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {to!r}; use {', '.join(EXPORT_FORMATS)}")
    if no_input and writeup:
        raise ValueError("choose one of no_input (no code) and writeup (answers' code only)")
    if to == "pdf":
        find_chromium()  # fail before rendering anything
    if to == "markdown":
        from nbconvert import MarkdownExporter

        exporter = MarkdownExporter()
    else:
        exporter = _offline_exporter(pdf=to == "pdf")
    hide_prompts = no_input or writeup
    exporter.exclude_input = no_input
    exporter.exclude_input_prompt = hide_prompts
    exporter.exclude_output_prompt = hide_prompts
    nb = nbformat.read(notebook, as_version=4)
    nb.cells = [c for c in nb.cells if "papermill-error-cell-tag" not in cell_tags(c)]
    if writeup:
        nb = writeup_cells(nb)
    if to != "markdown":
        _without_cdn_mathjax(nb)
    body, resources = exporter.from_notebook_node(nb, resources={"metadata": {"name": Path(notebook).stem, "path": str(Path(notebook).parent)}})
    out = Path(out) if out else build_dir() / "writeups" / (Path(notebook).stem + EXPORT_FORMATS[to])
    out.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(body, bytes):
        out.write_bytes(body)
    else:
        out.write_text(body, encoding="utf-8")
    for name, data in (resources.get("outputs") or {}).items():
        (out.parent / name).write_bytes(data)
    return out


# --- a lab's write-up notebook --------------------------------------------------------------------

#: (pattern in a lowercased column name, format) — the first match wins; see :func:`column_format`.
TABLE_FORMATS: tuple[tuple[str, str], ...] = (
    ("(ms)", "{:,.1f}"), ("_ms", "{:,.1f}"), ("ms)", "{:,.1f}"),
    ("%", "{:,.1f}"), ("pct", "{:,.1f}"), ("percent", "{:,.1f}"),
    ("(s)", "{:,.3f}"), ("_s", "{:,.3f}"), ("seconds", "{:,.3f}"),
    ("ratio", "{:,.2f}"), ("fraction", "{:,.2f}"), ("attainment", "{:,.2f}"), ("share", "{:,.2f}"),
    ("×", "{:,.2f}"), ("speedup", "{:,.2f}"), ("hit", "{:,.2f}"), ("rps", "{:,.2f}"),
    ("requests/s", "{:,.2f}"), ("/s", "{:,.2f}"), ("gb", "{:,.2f}"), ("gib", "{:,.2f}"),
)


def column_format(column: Any) -> str | None:
    """The format for a float column of a write-up table, from its name: milliseconds 1 decimal,
    seconds 3, percentages 1, ratios, fractions, rates and GB 2; None when nothing matches."""
    name = str(column).lower()
    for pattern, fmt in TABLE_FORMATS:
        if pattern in name:
            return fmt
    return None


def _format_float(x: Any, fmt: str | None) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if x != x:
        return "–"
    if fmt:
        return fmt.format(x)
    if x.is_integer():
        return f"{x:,.0f}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}" if abs(x) >= 1 else f"{x:.3g}"


def table_html(df) -> str:
    """``df`` as an HTML table with each float column at a sensible precision (:func:`column_format`)."""
    formatters = {}
    for col in df.columns:
        if df[col].dtype.kind == "f":
            fmt = column_format(col)
            formatters[col] = lambda x, fmt=fmt: _format_float(x, fmt)
    return df.to_html(formatters=formatters, index=not _default_index(df), border=0, na_rep="–")


def _default_index(df) -> bool:
    import pandas as pd

    return isinstance(df.index, pd.RangeIndex) and df.index.start == 0 and df.index.step == 1


def _output_cell(data: dict[str, Any]) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    return cell


def writeup_notebook(items: Sequence[Any], path: str | Path) -> Path:
    """Save a notebook from ``items``: strings (markdown), pandas DataFrames (HTML tables, floats at
    the precision of :func:`column_format`) and plotly figures (interactive HTML; plotly.js is
    embedded once, so the file works offline)."""
    cells = []
    first_fig = True
    for item in items:
        if isinstance(item, str):
            cells.append(nbformat.v4.new_markdown_cell(item))
        elif hasattr(item, "to_html") and hasattr(item, "to_plotly_json"):
            html = item.to_html(include_plotlyjs=True if first_fig else False, full_html=False)
            first_fig = False
            cells.append(_output_cell({"text/html": html, "text/plain": "<plotly figure>"}))
        elif hasattr(item, "to_html") and hasattr(item, "columns"):
            cells.append(_output_cell({"text/html": table_html(item), "text/plain": str(item)}))
        else:
            raise TypeError(f"cannot put a {type(item).__name__} in a write-up")
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def export_writeup(notebook: str | Path, out: str | Path | None = None, *, to: str = "html") -> Path:
    """Run ``pdlab course export NOTEBOOK --no-input --to TO --out OUT`` (default
    ``build/writeups/<stem>.<html|pdf|md>``)."""
    if to not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {to!r}; use {', '.join(EXPORT_FORMATS)}")
    notebook = Path(notebook)
    out = Path(out) if out else build_dir() / "writeups" / f"{notebook.stem}{EXPORT_FORMATS[to]}"
    cmd = [sys.executable, "-m", "pdlab.cli", "course", "export", str(notebook), "--no-input",
           "--to", to, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"export failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return out
