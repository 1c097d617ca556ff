"""Execute every solution notebook and every student copy with papermill.

Solutions run in profile ``ci`` with strict checks (a failing exercise check fails the run); an optional
appendix (``pdlab.course.generate.APPENDICES``) runs at the profile given there.
Student copies run in profile ``smoke`` (the same code paths on the smallest sizes): only their
``raises-exception`` exercise cells may fail, each with NotImplementedError, and every check
after them must report "not attempted".
"""

from __future__ import annotations

import json

import nbformat
import pytest
from pdlab.course import run_notebook, solution_notebooks, student_notebooks
from pdlab.course.generate import APPENDICES
from pdlab.paths import build_dir, repo_root

ROOT = repo_root()
SOLUTIONS = solution_notebooks(ROOT)
STUDENTS = student_notebooks(ROOT)


def _ids(paths):
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") if isinstance(out.get("text", ""), str) else "")
            data = out.get("data", {})
            parts.append(data.get("text/plain", "") if isinstance(data.get("text/plain", ""), str) else "")
    return "\n".join(parts)


def _figure_problems(nb) -> list[str]:
    """pdlab.plots.figure_problems of every plotly figure the executed notebook shows."""
    from pdlab.plots import figure_problems

    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig:
                found += [f"cell {i}: {p}" for p in figure_problems(fig)]
    return found


def _exercise_cells(nb) -> int:
    return sum(1 for c in nb.cells if c.cell_type == "code" and "### BEGIN SOLUTION" in c.source)


@pytest.mark.notebook
@pytest.mark.parametrize("path", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_solution_notebook_runs(path):
    out = build_dir() / "test-executed" / "solutions" / path.parent.name / path.name
    res = run_notebook(path, out, profile=APPENDICES.get(path.stem, "ci"))
    assert res.status == "ok", f"{path.name} failed: {res.error} (see {out})"
    executed = nbformat.read(out, as_version=4)
    text = _outputs_text(executed)
    assert "FAILED" not in text and "NOT ATTEMPTED" not in text
    assert text.count("PASSED") >= _exercise_cells(nbformat.read(path, as_version=4)), \
        "every exercise in a solution must be followed by a passing check"
    problems = _figure_problems(executed)
    assert not problems, f"{path.name}: figures a reader cannot read: {problems}"


# Student copies of the live labs start vLLM servers again, in profile smoke (the smallest sizes);
# they run in `make test` (a student opens these copies) and alone with `pytest -m student_lab`.
STUDENT_PARAMS = [pytest.param(p, marks=[pytest.mark.student_lab] if p.parent.name == "labs" else [])
                  for p in STUDENTS]


@pytest.mark.notebook
@pytest.mark.parametrize("path", STUDENT_PARAMS, ids=_ids(STUDENTS))
def test_student_copy_runs_and_exercises_raise(path, tmp_path, monkeypatch):
    """Also: no exercise's expected value appears on the executed page (checks log what they
    expect to ``PDLAB_EXPECTED_LOG``; tests/test_exercise_battery.py has the matcher)."""
    from test_exercise_battery import expected_values_on_the_page

    assert path.exists(), f"missing student copy {path}: run `make notebooks`"
    if path.stem in APPENDICES:   # an optional appendix has no exercise: its solution test runs the same cells
        solution = ROOT / "solutions" / path.parent.name / path.name
        assert _exercise_cells(nbformat.read(solution, as_version=4)) == 0, f"{path.name}: an appendix with exercises"
        return
    log = tmp_path / "expected.jsonl"
    monkeypatch.setenv("PDLAB_EXPECTED_LOG", str(log))
    out = build_dir() / "test-executed" / "student" / path.parent.name / path.name
    res = run_notebook(path, out, profile="smoke", student=True)
    assert res.status == "ok", f"{path.name}: {res.error} (see {out})"
    solution = ROOT / "solutions" / path.parent.name / path.name
    n_ex = _exercise_cells(nbformat.read(solution, as_version=4))
    assert n_ex >= 1, f"{solution.name} has no exercises"
    assert res.expected_errors == n_ex, f"expected {n_ex} exercise stubs to raise, saw {res.expected_errors}"
    text = _outputs_text(nbformat.read(out, as_version=4))
    assert text.count("NOT ATTEMPTED") >= n_ex and "PASSED" not in text
    leaks = expected_values_on_the_page(out, log)
    assert not leaks, f"{path.name}: expected answers printed on the page: {leaks}"


def test_every_student_copy_gets_the_answer_leak_check():
    """The leak check lives in the student-copy test: that test must be parametrized over every
    student copy on disk, live labs included, and every solution must have one."""
    on_disk = sorted([*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "labs").glob("*.ipynb")])
    assert sorted(STUDENTS) == on_disk
    assert sorted(p.values[0] for p in STUDENT_PARAMS) == on_disk
    assert {p.name for p in STUDENTS} == {p.name for p in SOLUTIONS}
    live = {"lab01", "lab05", "lab06", "lab07", "lab08"}
    assert live <= {p.stem.split("_")[0] for p in STUDENTS}


def test_every_notebook_has_a_parameters_cell_with_profile():
    for path in SOLUTIONS:
        nb = json.loads(path.read_text())
        params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(params) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
        assert "PROFILE" in "".join(params[0]["source"]), f"{path.name}: parameters cell lacks PROFILE"


def test_papermill_reads_every_line_of_every_parameters_cell(caplog):
    """papermill infers each parameter from its line (name, default, the comment as help); a line it
    cannot parse (a comment with quotes in it, say) is logged and that parameter drops out of
    ``papermill --help-notebook`` and of JupyterLab's parameter tools."""
    import logging

    from papermill.translators import PythonTranslator

    for path in SOLUTIONS:
        nb = json.loads(path.read_text())
        cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="papermill"):
            params = PythonTranslator.inspect({"source": "".join(cell["source"])})
        assert not caplog.records, f"{path.name}: {[r.getMessage() for r in caplog.records]}"
        assigned = [ln.split("=")[0].split(":")[0].strip() for ln in "".join(cell["source"]).splitlines()
                    if "=" in ln and not ln.startswith((" ", "#"))]
        assert [p.name for p in params] == assigned, f"{path.name}: papermill reads {[p.name for p in params]}"
