"""The notebook pipeline: student copies from solutions, papermill runs, write-up export.

Layout: ``solutions/notebooks/*.ipynb`` → ``notebooks/``; ``solutions/labs/*.ipynb`` → ``labs/``.
In a solution, answer code sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``; the
student copy replaces it with ``raise NotImplementedError("Exercise N: ...")`` (N and the title
come from the cell's ``# Exercise N: title`` comment) and tags the cell ``raises-exception``.
Cells tagged ``solution`` are dropped from the copy.
"""

from __future__ import annotations

import copy
import fnmatch
import html
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from pdlab.paths import build_dir, repo_root

__all__ = [
    "KERNEL_NAME",
    "SECTIONS",
    "student_copy",
    "build",
    "out_of_sync",
    "strip_outputs",
    "notebooks_with_outputs",
    "solution_notebooks",
    "student_notebooks",
    "RunResult",
    "run_notebook",
    "run_course",
    "export",
    "ensure_kernel",
    "COURSE_MAP",
    "course_map",
    "normalize_solution",
    "format_table",
    "write_index",
]

KERNEL_NAME = "pdlab"
SECTIONS = ("notebooks", "labs")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_EXERCISE_RE = re.compile(r"#\s*Exercise\s+([\w.]+)\s*[:.-]?\s*(.*)")
_HEADER = ("> **Generated file — do not edit.** This student copy is generated from "
           "`{src}` by `make notebooks` (`pdlab course build`). Edit the solution, then regenerate.")


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _stub_source(source: str, nb_name: str) -> str:
    """Replace each BEGIN/END SOLUTION block with a raise, keeping indentation."""
    lines = source.splitlines()
    title = "complete this exercise"
    number = "?"
    for line in lines:
        m = _EXERCISE_RE.search(line)
        if m:
            number, title = m.group(1), (m.group(2).strip() or title)
            break
    out: list[str] = []
    inside = False
    for line in lines:
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{nb_name}: nested {BEGIN}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            msg = json.dumps(f"Exercise {number}: {title}", ensure_ascii=False)
            out.append(f"{indent}raise NotImplementedError({msg})")
            continue
        if stripped == END:
            if not inside:
                raise ValueError(f"{nb_name}: {END} without {BEGIN}")
            inside = False
            continue
        if not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{nb_name}: {BEGIN} without {END}")
    return "\n".join(out)


def _clean_cell(cell) -> None:
    tags = _tags(cell)
    cell["metadata"] = {"tags": tags} if tags else {}
    if cell["cell_type"] == "code":
        cell["outputs"] = []
        cell["execution_count"] = None


def student_copy(nb, source_rel: str):
    """Return the student copy of a solution notebook (a new NotebookNode)."""
    out = copy.deepcopy(nb)
    cells = []
    header = nbformat.v4.new_markdown_cell(_HEADER.format(src=source_rel))
    header["id"] = "generated-header"
    cells.append(header)
    for cell in out.cells:
        if "solution" in _tags(cell):
            continue
        if cell["cell_type"] == "code" and BEGIN in cell["source"]:
            cell["source"] = _stub_source(cell["source"], source_rel)
            tags = _tags(cell)
            if "raises-exception" not in tags:
                tags.append("raises-exception")
            cell.setdefault("metadata", {})["tags"] = tags
        _clean_cell(cell)
        cells.append(cell)
    out.cells = cells
    out.metadata = {k: v for k, v in nb.metadata.items() if k in ("kernelspec", "language_info")}
    return out


def _dumps(nb) -> str:
    return nbformat.writes(nb, version=4) + ("" if nbformat.writes(nb).endswith("\n") else "\n")


def solution_notebooks(root: Path | None = None) -> list[Path]:
    """All solution notebooks, sorted (notebooks first, then labs)."""
    root = root or repo_root()
    return [p for s in SECTIONS for p in sorted((root / "solutions" / s).glob("*.ipynb"))]


def _student_path(solution: Path, root: Path) -> Path:
    rel = solution.relative_to(root / "solutions")
    return root / rel


def student_notebooks(root: Path | None = None) -> list[Path]:
    """The student copy of every solution notebook (paths; they may not exist yet)."""
    root = root or repo_root()
    return [_student_path(p, root) for p in solution_notebooks(root)]


def _generated(root: Path) -> dict[Path, str]:
    result = {}
    for src in solution_notebooks(root):
        nb = nbformat.read(src, as_version=4)
        rel = src.relative_to(root).as_posix()
        result[_student_path(src, root)] = _dumps(student_copy(nb, rel))
    return result


KERNELSPEC = {"name": KERNEL_NAME, "display_name": "Python (pdlab course)", "language": "python"}


def normalize_solution(path: Path) -> bool:
    """Strip outputs and editor metadata from a solution, set the course kernel; True if changed."""
    nb = nbformat.read(path, as_version=4)
    before = _dumps(nb)
    for cell in nb.cells:
        _clean_cell(cell)
    nb.metadata = {"kernelspec": dict(KERNELSPEC),
                   "language_info": {"name": "python"}}
    after = _dumps(nb)
    if after != before:
        path.write_text(after)
        return True
    return False


def build(root: Path | None = None) -> list[Path]:
    """Normalise the solutions, then write every student copy; return changed paths. Deterministic."""
    root = root or repo_root()
    changed = [p for p in solution_notebooks(root) if normalize_solution(p)]
    for path, text in _generated(root).items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    return changed


def out_of_sync(root: Path | None = None) -> list[Path]:
    """Student copies that differ from what :func:`build` would write (or are missing/stale)."""
    root = root or repo_root()
    expected = _generated(root)
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    for section in SECTIONS:
        for p in sorted((root / section).glob("*.ipynb")):
            if p not in expected:
                stale.append(p)
    return stale


def strip_outputs(paths: Iterable[Path]) -> list[Path]:
    """Remove outputs, execution counts and widget state in place; return changed files."""
    changed = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        before = _dumps(nb)
        for cell in nb.cells:
            _clean_cell(cell)
        nb.metadata.pop("widgets", None)
        after = _dumps(nb)
        if after != before:
            Path(path).write_text(after)
            changed.append(Path(path))
    return changed


def notebooks_with_outputs(paths: Iterable[Path]) -> list[str]:
    """Describe committed notebooks that carry outputs, execution counts or widget state."""
    problems = []
    for path in paths:
        nb = json.loads(Path(path).read_text())
        if "widgets" in nb.get("metadata", {}):
            problems.append(f"{path}: widget state in metadata")
        for i, cell in enumerate(nb.get("cells", [])):
            if cell.get("outputs") or cell.get("execution_count") is not None:
                problems.append(f"{path}: cell {i} has outputs or an execution count")
    return problems


def ensure_kernel() -> str:
    """Register the ``pdlab`` kernel in this environment if it is missing; return its name."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        from ipykernel.kernelspec import install

        install(kernel_name=KERNEL_NAME, display_name="Python (pdlab course)", prefix=os.sys.prefix)
    return KERNEL_NAME


@dataclass
class RunResult:
    """One executed notebook: ``status`` is ``ok`` or ``failed``."""

    notebook: str
    status: str
    seconds: float
    output: Path
    error: str = ""
    expected_errors: int = 0
    html: Path | None = None
    extra: dict = field(default_factory=dict)


def _expected_failures_only(nb) -> tuple[bool, int, str]:
    """For student copies: did only ``raises-exception`` cells fail, and did every cell run?"""
    count, unexpected = 0, ""
    code_cells = [c for c in nb.cells if c.cell_type == "code"
                  and "papermill-error-cell-tag" not in _tags(c)]
    for cell in code_cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            if "raises-exception" in _tags(cell) and errors[0].get("ename") == "NotImplementedError":
                count += 1
            elif not unexpected:
                unexpected = f"{errors[0].get('ename')}: {errors[0].get('evalue')}"
    not_run = [c for c in code_cells if c.get("execution_count") is None and c.source.strip()]
    if not_run and not unexpected:
        unexpected = f"{len(not_run)} code cells did not run"
    return not unexpected, count, unexpected


def run_notebook(path: Path, output: Path, *, profile: str = "ci", student: bool = False,
                 timeout_s: int = 1800, parameters: dict | None = None) -> RunResult:
    """Execute one notebook with papermill (kernel ``pdlab``, per-cell timeout, injected PROFILE).

    Solutions run with ``PDLAB_STRICT_CHECKS=1`` (a failing check fails the run). Student copies
    must fail only in their ``raises-exception`` exercise cells, each with NotImplementedError.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    ensure_kernel()
    output.parent.mkdir(parents=True, exist_ok=True)
    params = {"PROFILE": profile, **(parameters or {})}
    env_before = {k: os.environ.get(k) for k in ("PDLAB_STRICT_CHECKS", "PDLAB_HEADLESS")}
    os.environ["PDLAB_STRICT_CHECKS"] = "0" if student else "1"
    os.environ["PDLAB_HEADLESS"] = "1"
    start = time.perf_counter()
    status, error, expected = "ok", "", 0
    try:
        pm.execute_notebook(str(path), str(output), parameters=params, kernel_name=KERNEL_NAME, language="python",
                            execution_timeout=timeout_s, cwd=str(path.parent), progress_bar=False,
                            log_output=False, report_mode=False)
        if student:
            ok, expected, error = _expected_failures_only(nbformat.read(output, as_version=4))
            status = "ok" if ok else "failed"
    except PapermillExecutionError as exc:
        if student and output.exists():
            ok, expected, error = _expected_failures_only(nbformat.read(output, as_version=4))
            status = "ok" if ok else "failed"
        else:
            status, error = "failed", f"{exc.ename}: {exc.evalue}"
    except Exception as exc:  # kernel died, timeout, bad parameters ...
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return RunResult(path.stem, status, time.perf_counter() - start, output, error, expected)


def run_course(*, profile: str = "ci", only: str | None = None, student: bool = False,
               timeout_s: int = 1800, html_export: bool = True, out_dir: Path | None = None,
               root: Path | None = None) -> list[RunResult]:
    """Run every (matching) notebook with a progress bar; write executed copies and HTML."""
    from tqdm.auto import tqdm

    root = root or repo_root()
    out_dir = out_dir or build_dir()
    paths = student_notebooks(root) if student else solution_notebooks(root)
    if only:
        paths = [p for p in paths if fnmatch.fnmatch(p.name, only) or fnmatch.fnmatch(p.stem, only)]
    results = []
    kind = "student" if student else "executed"
    bar = tqdm(paths, desc="course", unit="nb")
    for path in bar:
        bar.set_postfix_str(path.stem)
        res = run_notebook(path, out_dir / kind / path.parent.name / path.name, profile=profile,
                           student=student, timeout_s=timeout_s)
        if html_export and res.output.exists():
            try:
                res.html = export(res.output, to="html", out=out_dir / "html" / f"{path.stem}.html")
            except Exception as exc:  # an export problem must not hide the run's own status
                res.error = res.error or f"HTML export failed: {exc}"
        results.append(res)
    if html_export:
        write_index(results, out_dir / "html" / "index.html")
    return results


def write_index(results: list[RunResult], path: Path) -> Path:
    """An ``index.html`` linking every exported notebook with its status and run time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = "\n".join(
        f"<tr><td><a href='{html.escape(r.html.name) if r.html else '#'}'>{html.escape(r.notebook)}</a></td>"
        f"<td class='{r.status}'>{r.status}</td><td>{r.seconds:.1f}</td><td>{html.escape(r.error)}</td></tr>"
        for r in results)
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>PD-disaggregation course — run</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 12px;text-align:left}"
        ".ok{color:#0a0}.failed{color:#c00}</style></head><body>"
        "<h1>Disaggregated prefill/decode serving — executed course</h1>"
        f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.</p>"
        "<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>error</th></tr>"
        f"{rows}</table></body></html>")
    return path


def format_table(results: list[RunResult]) -> str:
    """Plain-text summary table: notebook, status, seconds."""
    width = max([len(r.notebook) for r in results] + [8])
    lines = [f"{'notebook':<{width}}  {'status':<7}  {'seconds':>8}", "-" * (width + 19)]
    for r in results:
        note = f"  ({r.expected_errors} exercise stubs raised)" if r.expected_errors else ""
        err = f"  {r.error}" if r.status != "ok" else ""
        lines.append(f"{r.notebook:<{width}}  {r.status:<7}  {r.seconds:>8.1f}{note}{err}")
    return "\n".join(lines)


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
    nb.cells = [c for c in nb.cells if "papermill-error-cell-tag" not in _tags(c)]
    body, resources = exporter.from_notebook_node(nb)
    out = out or build_dir() / "writeups" / (Path(notebook).stem + suffix)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    for name, data in (resources.get("outputs") or {}).items():
        (out.parent / name).write_bytes(data)
    return out


# The course map: (id, file stem, what it teaches and measures). README and notebook 00 show it.
COURSE_MAP: list[tuple[str, str, str]] = [
    ("00", "00_orientation", "Course map, reading list, device detection, profiles, running with papermill"),
    ("01", "01_roofline_prefill_vs_decode", "Roofline: prefill is compute-bound, decode memory-bound; analytic per GPU and measured on your device"),
    ("02", "02_kv_cache_napkin_math", "KV bytes per token (MHA/GQA/MLA, bf16/fp8), transfer time per link, DistServe's condition"),
    ("03", "03_measured_kv_transfer", "Measured KV transfer between processes: shm, TCP, gloo, Mooncake TE, NIXL; layer-wise overlap; emulated links"),
    ("04", "04_goodput_and_slos", "TTFT, TPOT, ITL, percentiles, SLO attainment and goodput from per-request records"),
    ("05", "05_distserve_placement", "DistServe: M/D/1 prefill queueing, latency model fitting, placement search"),
    ("06", "06_interference_and_chunked_prefill", "Interference: colocated vs chunked prefill (Sarathi-Serve) vs disaggregated"),
    ("07", "07_mooncake_kvcache_scheduling", "Mooncake: prefix caches, the Conductor, overload and early rejection on the real trace"),
    ("08", "08_splitwise_heterogeneous_pools", "Splitwise: heterogeneous prompt/token pools, cost and power"),
    ("09", "09_when_to_disaggregate", "When disaggregation pays: the decision matrix, intra-GPU (Nexus), the orchestration layer"),
    ("lab01", "lab01_vllm_colocated_vs_disaggregated", "Live vLLM: colocated vs 1P1D with NIXL, TTFT/ITL/goodput against rate"),
    ("lab02", "lab02_sglang_pd_disaggregation", "SGLang PD mode behind sglang-router (GPU), the router on the wire (CPU)"),
    ("lab03", "lab03_router", "A router choosing colocated or disaggregated serving per request, live and simulated"),
    ("lab04", "lab04_agentic_benchmark", "Agentic multi-turn tool-calling benchmark, colocated vs disaggregated"),
    ("lab05", "lab05_sim_to_real", "Calibrate the simulator on the live engine and measure its error"),
]


def course_map(root: Path | None = None) -> list[dict]:
    """The course map with the path of each solution and whether it exists yet."""
    root = root or repo_root()
    rows = []
    for ident, stem, about in COURSE_MAP:
        section = "labs" if ident.startswith("lab") else "notebooks"
        path = root / "solutions" / section / f"{stem}.ipynb"
        rows.append({"id": ident, "notebook": f"{section}/{stem}.ipynb", "teaches and measures": about,
                     "present": path.exists()})
    return rows
