"""Running the course with papermill: one notebook, the whole course, its index and table.

Solutions run strictly (an error fails the run); student copies run in the ``smoke`` profile and
pass when the only errors are the exercise cells' ``NotImplementedError``.
"""

from __future__ import annotations

import fnmatch
import html
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from pdlab.course.export import export
from pdlab.course.generate import APPENDICES, KERNEL_NAME, cell_tags, solution_notebooks, student_notebooks
from pdlab.paths import build_dir, repo_root

__all__ = ["INDEX_RESULTS", "KERNEL_ENCRYPTION", "RunResult", "ensure_kernel", "kernel_config", "run_notebook",
           "run_course", "write_index", "index_rows", "format_table"]

#: the file beside ``index.html`` that keeps every unit's last result, so that a run of one unit
#: updates that unit's row and keeps the others'.
INDEX_RESULTS = "index_results.json"

#: jupyter_client's transport-encryption policy for the kernels the course starts: the kernel manager
#: provisions CurveZMQ keys, so code and outputs between papermill (or JupyterLab) and the kernel are
#: encrypted, and ipykernel does not warn "Kernel is running over TCP without encryption". ``required``
#: fails the start instead of falling back to plain TCP.
KERNEL_ENCRYPTION = "required"


def ensure_kernel() -> str:
    """Register the ``pdlab`` kernel in this environment if it is missing, or if its kernel spec does not
    declare CurveZMQ support (``metadata.supported_encryption``, which ipykernel 7.4 writes); return its
    name."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
        current = "curve" in (spec.metadata or {}).get("supported_encryption", [])
    except NoSuchKernel:
        current = False
    if not current:
        from ipykernel.kernelspec import install

        install(kernel_name=KERNEL_NAME, display_name="Python (pdlab course)", prefix=os.sys.prefix)
    return KERNEL_NAME


def kernel_config():
    """The traitlets config that makes a kernel manager start its kernels with CurveZMQ encryption
    (:data:`KERNEL_ENCRYPTION`), given to papermill's client. ``make lab`` sets the same policy on
    JupyterLab's kernels (``--MappingKernelManager.transport_encryption``)."""
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": KERNEL_ENCRYPTION}})


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
                  and "papermill-error-cell-tag" not in cell_tags(c)]
    for cell in code_cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            if "raises-exception" in cell_tags(cell) and errors[0].get("ename") == "NotImplementedError":
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
                            log_output=False, report_mode=False, config=kernel_config())
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
    else:   # the optional appendices run only when asked for by name
        paths = [p for p in paths if p.stem not in APPENDICES]
    results = []
    kind = "student" if student else "executed"
    bar = tqdm(paths, desc="course", unit="nb")
    for path in bar:
        bar.set_postfix_str(path.stem)
        res = run_notebook(path, out_dir / kind / path.parent.name / path.name, profile=profile,
                           student=student, timeout_s=timeout_s)
        res.extra.update(finished=time.strftime("%Y-%m-%d %H:%M:%S"), profile=profile,
                         kind="student" if student else "solution")
        if html_export and res.output.exists():
            try:
                res.html = export(res.output, to="html", out=out_dir / "html" / f"{path.stem}.html")
            except Exception as exc:  # an export problem must not hide the run's own status
                res.error = res.error or f"HTML export failed: {exc}"
        results.append(res)
    if html_export:
        write_index(results, out_dir / "html" / "index.html", fresh=only is None)
    return results


def index_rows(results: list[RunResult], store: Path, *, fresh: bool = False) -> list[dict]:
    """Merge this run's ``results`` into the rows kept in ``store`` (JSON, :data:`INDEX_RESULTS`) and
    write them back: a unit run now replaces its row, every other unit keeps its last result (``fresh``:
    start from no rows, as a run of the whole course does, so a renamed unit leaves no stale row). Each row:
    notebook, status, seconds, error, html (file name or ""), finished (local time of that unit's run),
    profile and kind (solution or student). Rows come in course order (:data:`COURSE_MAP`), then by name."""
    from pdlab.course.generate import COURSE_MAP

    rows: dict[str, dict] = {}
    if store.exists() and not fresh:
        try:
            kept = json.loads(store.read_text(encoding="utf-8"))
            rows = {row["notebook"]: row for row in kept["rows"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{store}: not a course index store (expected {{'rows': [{{'notebook': ...}}]}}); "
                             f"delete it to start a fresh index ({exc})") from exc
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    for r in results:
        rows[r.notebook] = {"notebook": r.notebook, "status": r.status, "seconds": round(float(r.seconds), 1),
                            "error": r.error, "html": r.html.name if r.html else "",
                            "finished": r.extra.get("finished", now), "profile": r.extra.get("profile", ""),
                            "kind": r.extra.get("kind", "")}
    order = {stem: i for i, (_, stem, _) in enumerate(COURSE_MAP)}
    merged = sorted(rows.values(), key=lambda row: (order.get(row["notebook"], len(order)), row["notebook"]))
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps({"rows": merged}, indent=1, ensure_ascii=False), encoding="utf-8")
    return merged


def write_index(results: list[RunResult], path: Path, *, fresh: bool = False) -> Path:
    """An ``index.html`` linking every exported notebook with its status, run time and when it ran.
    The rows are this run's results merged into every earlier run's into the same folder
    (:func:`index_rows`, kept in :data:`INDEX_RESULTS` beside the index): rerunning one unit updates
    its row and keeps the rest of the course; ``fresh`` (a run of the whole course) starts from no rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = index_rows(results, path.parent / INDEX_RESULTS, fresh=fresh)
    rows = "\n".join(
        f"<tr><td><a href='{html.escape(r['html']) if r['html'] else '#'}'>{html.escape(r['notebook'])}</a></td>"
        f"<td class='{html.escape(r['status'])}'>{html.escape(r['status'])}</td><td>{r['seconds']:.1f}</td>"
        f"<td>{html.escape(r['finished'])}</td><td>{html.escape(r['profile'])}</td><td>{html.escape(r['kind'])}</td>"
        f"<td>{html.escape(r['error'])}</td></tr>"
        for r in merged)
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>PD-disaggregation course — run</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 12px;text-align:left}"
        ".ok{color:#0a0}.failed{color:#c00}</style></head><body>"
        "<h1>Disaggregated prefill/decode serving — executed course</h1>"
        f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S')}: each unit's last run into this folder, "
        f"{len(merged)} units.</p>"
        "<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>finished</th><th>profile</th><th>kind</th>"
        f"<th>error</th></tr>{rows}</table></body></html>", encoding="utf-8")
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
