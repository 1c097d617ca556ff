"""Student copies from solutions: the generator, the sync check, output stripping, the course map.

Layout: ``solutions/notebooks/*.ipynb`` → ``notebooks/``; ``solutions/labs/*.ipynb`` → ``labs/``.
In a solution, answer code sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``; the
student copy replaces it with ``raise NotImplementedError("Exercise N: ...")`` (N and the title
come from the cell's ``# Exercise N: title`` comment) and tags the cell ``raises-exception``.
Cells tagged ``solution`` are dropped from the copy.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

import nbformat

from pdlab.paths import repo_root

__all__ = [
    "KERNEL_NAME",
    "ci_minutes",
    "ci_seconds",
    "SECTIONS",
    "student_copy",
    "build",
    "out_of_sync",
    "strip_outputs",
    "notebooks_with_outputs",
    "solution_notebooks",
    "student_notebooks",
    "normalize_solution",
    "COURSE_MAP",
    "course_map",
    "cell_tags",
    "APPENDICES",
]

KERNEL_NAME = "pdlab"
SECTIONS = ("notebooks", "labs")
#: Optional appendices, by stem → the profile ``make test`` runs their solution at. No core unit needs
#: them: they are not in :data:`COURSE_MAP`, and ``make run`` (``pdlab course run`` without ``--only``)
#: leaves them out; ``--only`` that names one runs it.
APPENDICES: dict[str, str] = {"lab01_appendix_front_doors": "smoke",
                              "07_appendix_connectors_and_cacheblend": "smoke"}
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_EXERCISE_RE = re.compile(r"#\s*Exercise\s+([\w.]+)\s*[:.-]?\s*(.*)")
_HEADER = ("> **Generated file — do not edit.** This student copy is generated from "
           "`{src}` by `make notebooks` (`pdlab course build`). Edit the solution, then regenerate.")


def cell_tags(cell) -> list[str]:
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
    tags = cell_tags(cell)
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
        if "solution" in cell_tags(cell):
            continue
        if cell["cell_type"] == "code" and BEGIN in cell["source"]:
            cell["source"] = _stub_source(cell["source"], source_rel)
            tags = cell_tags(cell)
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
    raw_cells = json.loads(path.read_text()).get("cells", [])
    for i, cell in enumerate(nb.cells):
        _clean_cell(cell)
        if i < len(raw_cells) and "id" not in raw_cells[i]:   # nbformat filled in a random id: make it stable
            cell["id"] = hashlib.sha1(f"{i}:{cell.source}".encode()).hexdigest()[:8]
            before = ""
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
    ("lab02", "lab02_sglang_pd_disaggregation", "SGLang PD mode behind smg (GPU), the gateway on the wire (CPU)"),
    ("lab03", "lab03_router", "A router choosing colocated or disaggregated serving per request, live and simulated"),
    ("lab04", "lab04_agentic_benchmark", "Agentic multi-turn tool-calling benchmark, colocated vs disaggregated"),
    ("lab05", "lab05_sim_to_real", "Calibrate the simulator on the live engine and measure its error"),
    ("lab06", "lab06_faults", "Faults on a live 1P1D deployment under both KV-load policies; the silent fallback to decode-only"),
    ("lab07", "lab07_overload_and_admission", "Overload of a live 1P1D deployment with and without early rejection at the front door"),
    ("lab08", "lab08_dynamo", "NVIDIA Dynamo on this machine: frontend, KV router and mocker workers; agg vs 1P1D, KV vs round-robin routing"),
]


def ci_seconds(root: Path | None = None) -> dict[str, tuple[float, float]]:
    """unit → (fastest, slowest) seconds its solution took in profile ``ci`` on a 2-core CPU machine,
    from ``data/course/ci_times.csv``."""
    path = (root or repo_root()) / "data" / "course" / "ci_times.csv"
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    return {row["unit"]: (float(row["ci_seconds_low"]), float(row["ci_seconds_high"])) for row in rows}


def ci_minutes(root: Path | None = None) -> dict[str, str]:
    """unit → the minutes of :func:`ci_seconds` as the README and notebook 00 print them ("0.4", or
    "5.9–9.8" over several runs)."""
    out = {}
    for unit, (lo_s, hi_s) in ci_seconds(root).items():
        lo, hi = lo_s / 60, hi_s / 60
        out[unit] = f"{lo:.1f}" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}–{hi:.1f}"
    return out


def course_map(root: Path | None = None) -> list[dict]:
    """The course map: each unit's solution path, whether it exists yet, and its ``ci`` minutes
    (:func:`ci_minutes`; "not measured" for a unit without a row)."""
    root = root or repo_root()
    minutes = ci_minutes(root)
    rows = []
    for ident, stem, about in COURSE_MAP:
        section = "labs" if ident.startswith("lab") else "notebooks"
        path = root / "solutions" / section / f"{stem}.ipynb"
        rows.append({"id": ident, "notebook": f"{section}/{stem}.ipynb", "teaches and measures": about,
                     "present": path.exists(), "ci minutes": minutes.get(ident, "not measured")})
    return rows
