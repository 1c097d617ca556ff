"""The notebook pipeline: generated copies in sync, no outputs committed, stubs and export."""

from __future__ import annotations

import json
import subprocess

import nbformat
import pytest
from pdlab import course
from pdlab.paths import repo_root

ROOT = repo_root()


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i}"
    return nb


def test_committed_student_copies_match_the_generator():
    stale = course.out_of_sync(ROOT)
    assert not stale, f"student copies out of date, run `make notebooks`: {stale}"


def test_committed_notebooks_carry_no_outputs():
    tracked = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert tracked, "no notebooks are tracked"
    assert course.notebooks_with_outputs(ROOT / p for p in tracked) == []


def test_student_copy_replaces_solution_and_drops_solution_cells():
    code = nbformat.v4.new_code_cell(
        "# Exercise 3: compute the KV bytes\nanswer = None\nif True:\n    ### BEGIN SOLUTION\n    answer = 42\n"
        "    ### END SOLUTION\nprint(answer)")
    secret = nbformat.v4.new_markdown_cell("The answer is 42.")
    secret.metadata["tags"] = ["solution"]
    out = course.student_copy(_nb(code, secret), "solutions/notebooks/x.ipynb")
    assert "Generated file" in out.cells[0].source and "solutions/notebooks/x.ipynb" in out.cells[0].source
    assert len(out.cells) == 2
    src = out.cells[1].source
    assert 'raise NotImplementedError("Exercise 3: compute the KV bytes")' in src
    assert "    raise" in src and "42" not in src and "print(answer)" in src
    assert out.cells[1].metadata["tags"] == ["raises-exception"]


def test_unbalanced_markers_are_an_error():
    cell = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(ValueError, match="without"):
        course.student_copy(_nb(cell), "bad.ipynb")


def test_strip_outputs_and_detection(tmp_path):
    cell = nbformat.v4.new_code_cell("1+1")
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    cell.execution_count = 1
    path = tmp_path / "x.ipynb"
    nbformat.write(_nb(cell), path)
    assert course.notebooks_with_outputs([path])
    assert course.strip_outputs([path]) == [path]
    assert course.notebooks_with_outputs([path]) == []


def test_export_writes_html_and_markdown_without_input(tmp_path):
    code = nbformat.v4.new_code_cell("secret_code = 1")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="visible result\n")]
    md = nbformat.v4.new_markdown_cell("# Write-up\nSome prose.")
    path = tmp_path / "w.ipynb"
    nbformat.write(_nb(md, code), path)
    html = course.export(path, to="html", out=tmp_path / "w.html", no_input=True)
    text = html.read_text()
    assert "visible result" in text and "Some prose" in text and "secret_code" not in text
    mdout = course.export(path, to="markdown", out=tmp_path / "w.md")
    assert "secret_code" in mdout.read_text()


def test_run_reports_failure_for_a_broken_notebook(tmp_path):
    params = nbformat.v4.new_code_cell('PROFILE = "ci"')
    params.metadata["tags"] = ["parameters"]
    boom = nbformat.v4.new_code_cell("raise RuntimeError('broken on purpose')")
    path = tmp_path / "broken.ipynb"
    nbformat.write(_nb(params, boom), path)
    res = course.run_notebook(path, tmp_path / "out.ipynb", profile="ci")
    assert res.status == "failed" and "broken on purpose" in res.error


def test_a_solution_cell_without_an_id_gets_a_stable_one(tmp_path):
    """nbformat fills a missing cell id with a random one; the build writes a stable id instead, so
    two builds give the same student copy (a new cell pasted without an id made copies flap)."""
    import json

    nb = _nb(nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1"))
    raw = json.loads(nbformat.writes(nb))
    del raw["cells"][1]["id"]
    path = tmp_path / "s.ipynb"
    path.write_text(json.dumps(raw))
    assert course.normalize_solution(path)
    first = json.loads(path.read_text())["cells"][1]["id"]
    assert not course.normalize_solution(path) and json.loads(path.read_text())["cells"][1]["id"] == first
    assert json.loads(path.read_text())["cells"][0]["id"] == "c0"


def test_course_run_out_gives_each_run_its_own_folder(tmp_path, monkeypatch):
    """``pdlab course run --out DIR`` hands DIR to run_course, so a second run does not overwrite the first's notebooks."""
    from pdlab.cli import main

    seen = {}

    def fake_run_course(**kwargs):
        seen.update(kwargs)
        out = (kwargs["out_dir"] or tmp_path / "build") / "executed" / "labs" / "x.ipynb"
        return [course.RunResult("x", "ok", 0.1, out, "", 0)]

    monkeypatch.setattr(course, "run_course", fake_run_course)
    assert main(["course", "run", "--only", "x", "--no-html", "--out", str(tmp_path / "run1")]) == 0
    assert seen["out_dir"] == tmp_path / "run1" and seen["only"] == "x"
    assert main(["course", "run", "--only", "x", "--no-html"]) == 0
    assert seen["out_dir"] is None   # the default: build/


@pytest.mark.parametrize("policy", ["required", "disabled"])
def test_course_kernels_run_encrypted(tmp_path, capfd, monkeypatch, policy):
    """run_notebook starts its kernel with manager-provisioned CurveZMQ keys: the kernel's own connection
    info holds them and ipykernel does not warn about plain TCP. With the policy disabled (the control),
    the same run has no keys and does warn, so the check can fail."""
    from pdlab.course import run as run_module

    monkeypatch.setattr(run_module, "KERNEL_ENCRYPTION", policy)
    probe = nbformat.v4.new_code_cell(
        "from ipykernel.connect import get_connection_info\n"
        "print('curve keys:', 'curve_secretkey' in get_connection_info(unpack=True))")
    path = tmp_path / "probe.ipynb"
    nbformat.write(_nb(probe), path)
    res = course.run_notebook(path, tmp_path / "out.ipynb", profile="ci")
    assert res.status == "ok", res.error
    printed = "".join(o.get("text", "") for o in nbformat.read(res.output, as_version=4).cells[-1].outputs)
    warned = "without encryption" in capfd.readouterr().err
    encrypted = policy == "required"
    assert f"curve keys: {encrypted}" in printed and warned is not encrypted


def test_readme_course_map_gives_each_units_measured_ci_minutes():
    """The README's course map lists every unit of the map with the ``ci min`` that
    ``data/course/ci_times.csv`` gives (notebook 00 prints the same column from ``course_map``)."""
    minutes = {row["id"]: row["ci minutes"] for row in course.course_map()}
    assert "not measured" not in minutes.values(), f"units without a ci time: {minutes}"
    table = {unit: row["ci min"] for unit, row in _readme_map().items()}
    assert table == minutes, f"README's ci min column differs from ci_times.csv: {table} vs {minutes}"


def _readme_map() -> dict[str, dict[str, str]]:
    """unit → {track, learner min, ci min} from the README's course map."""
    readme = (repo_root() / "README.md").read_text(encoding="utf-8")
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[2] in ("core", "optional"):
            rows[cells[0]] = {"track": cells[2], "learner min": cells[3], "ci min": cells[4]}
    return rows


def test_readme_gives_each_units_learner_time_and_the_core_paths():
    """The README's *learner min* column is :func:`pdlab.course.learner_minutes` of each unit (the rule:
    prose at 130 words/min, code at 10 lines/min, the slowest ci run, 8 min per exercise), and its
    core-path sentence gives the sum over the core rows with their ci run time beside it."""
    import re

    learner = course.learner_times()
    rows = _readme_map()
    assert set(rows) == {row["id"] for row in course.course_map()}
    expected = {u: course.learner_label(learner[u].total_min) if u in learner else "not measured" for u in rows}
    stale = {u: (r["learner min"], expected[u]) for u, r in rows.items() if r["learner min"] != expected[u]}
    assert not stale, ("README's learner min column is stale (unit: README, computed); a unit's prose, code, "
                       f"exercises or ci time changed: {stale}. Refresh it with .venv/bin/python -c 'from "
                       "pdlab.course.effort import refresh_readme_learner_times as r; print(r())'")
    core = [u for u, r in rows.items() if r["track"] == "core"]
    assert core and all(u in learner for u in core), f"core units without a learner time: {core}"
    total = course.learner_label(sum(learner[u].total_min for u in core))
    run_min = f"{sum(course.ci_seconds()[u][1] for u in core) / 60:.0f}"
    readme = " ".join((repo_root() / "README.md").read_text(encoding="utf-8").split())
    found = re.search(r"core path takes about \*\*(\d+) min\*\* of learner time, of which at most \*\*(\d+) min\*\*",
                      readme)
    assert found, "README gives no core-path learner time"
    assert found.groups() == (total, run_min), (f"README's core path: {found.groups()}, computed: {(total, run_min)}; "
                                                "refresh it with pdlab.course.effort.refresh_readme_learner_times()")


def test_refresh_readme_learner_times_rewrites_the_column_and_the_total(tmp_path, monkeypatch):
    from pdlab.course import effort

    (tmp_path / "README.md").write_text(
        "The core path takes about **1 min** of learner time, of which at most **2 min** is the runs.\n\n"
        "| # | unit | track | learner min | ci min | teaches |\n|---|---|---|---|---|---|\n"
        "| 00 | `notebooks/00_orientation` | core | 1 | 0.2 | the map |\n"
        "| lab02 | `labs/lab02` | optional | 1 | 0.4 | SGLang |\n")
    times = {"00": effort.LearnerTime(10.0, 10.0, 0.5, 16), "lab02": effort.LearnerTime(1.0, 1.0, 1.0, 8)}
    monkeypatch.setattr(effort, "learner_times", lambda root=None: times)
    monkeypatch.setattr("pdlab.course.generate.ci_seconds", lambda root=None: {"00": (20.0, 30.0), "lab02": (1, 60)})
    assert effort.refresh_readme_learner_times(tmp_path) == ["00", "lab02"]
    text = (tmp_path / "README.md").read_text()
    assert "| 00 | `notebooks/00_orientation` | core | 35 | 0.2 | the map |" in text
    assert "| lab02 | `labs/lab02` | optional | 10 | 0.4 | SGLang |" in text
    assert "about **35 min** of learner time, of which at most **0 min**" in text  # 30 s of ci
    assert effort.refresh_readme_learner_times(tmp_path) == []


def test_learner_minutes_follow_the_stated_rule(tmp_path):
    """130 words a minute, 10 code lines a minute, the run, 8 minutes an exercise; bad input is named."""
    from pdlab.course import effort

    prose = nbformat.v4.new_markdown_cell(" ".join(["word"] * 260))
    exercise = nbformat.v4.new_code_cell("# Exercise 1: x\nx = None\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"
                                         "print(x)")
    path = tmp_path / "unit.ipynb"
    nbformat.write(_nb(prose, exercise), path)
    t = course.learner_minutes(path, run_seconds=90)
    header_words = len(course.student_copy(nbformat.read(path, as_version=4), str(path)).cells[0].source.split())
    assert t.reading_min == (260 + header_words) / effort.READING_WORDS_PER_MIN
    assert t.code_min == 4 / effort.CODE_LINES_PER_MIN   # comment, stub, raise, print: the student copy's lines
    assert (t.run_min, t.exercises_min) == (1.5, effort.MINUTES_PER_EXERCISE)
    assert t.total_min == t.reading_min + t.code_min + t.run_min + t.exercises_min
    assert (course.learner_label(62.4), course.learner_label(63.0), course.learner_label(0.0)) == ("60", "65", "0")
    with pytest.raises(ValueError, match="not a unit of the course map"):
        course.learner_minutes(path)
    with pytest.raises(FileNotFoundError, match="no notebook"):
        course.learner_minutes(tmp_path / "missing.ipynb", run_seconds=1)


def test_ci_minutes_formats_one_run_and_a_range(tmp_path):
    (tmp_path / "data" / "course").mkdir(parents=True)
    (tmp_path / "data" / "course" / "ci_times.csv").write_text(
        "# comment\nunit,ci_seconds_low,ci_seconds_high,runs\n00,12,12,1\nlab01,355.1,586,2\n")
    assert course.ci_minutes(tmp_path) == {"00": "0.2", "lab01": "5.9–9.8"}


def test_index_keeps_every_units_last_result(tmp_path):
    """Rerunning one unit into a folder updates that unit's row of ``index.html`` and keeps every other
    unit's last result with the time of its run (the rows live in ``index_results.json`` beside it)."""
    index = tmp_path / "html" / "index.html"

    def result(stem, status, seconds, finished, error=""):
        res = course.RunResult(stem, status, seconds, tmp_path / f"{stem}.ipynb", error, 0,
                               html=tmp_path / "html" / f"{stem}.html")
        res.extra.update(finished=finished, profile="ci", kind="solution")
        return res

    full_run = [result("00_orientation", "ok", 12.0, "2030-01-01 10:00:00"),
                result("02_kv_cache_napkin_math", "failed", 9.0, "2030-01-01 10:01:00", "AssertionError: x"),
                result("lab03_router", "ok", 120.0, "2030-01-01 10:05:00")]
    course.write_index(full_run, index)
    course.write_index([result("02_kv_cache_napkin_math", "ok", 8.5, "2030-01-02 09:00:00")], index)
    rows = {r["notebook"]: r for r in json.loads((index.parent / course.INDEX_RESULTS).read_text())["rows"]}
    assert list(rows) == ["00_orientation", "02_kv_cache_napkin_math", "lab03_router"]  # course order
    assert rows["02_kv_cache_napkin_math"] == {
        "notebook": "02_kv_cache_napkin_math", "status": "ok", "seconds": 8.5, "error": "",
        "html": "02_kv_cache_napkin_math.html", "finished": "2030-01-02 09:00:00", "profile": "ci", "kind": "solution"}
    assert rows["00_orientation"]["finished"] == "2030-01-01 10:00:00" and rows["lab03_router"]["seconds"] == 120.0
    page = index.read_text()
    assert page.count("<tr><td>") == 3 and "AssertionError" not in page
    assert "2030-01-01 10:05:00" in page and "2030-01-02 09:00:00" in page and "lab03_router.html" in page


def test_index_store_that_is_not_ours_is_a_clear_error(tmp_path):
    (tmp_path / course.INDEX_RESULTS).write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a course index store"):
        course.write_index([], tmp_path / "index.html")


def test_a_run_of_the_whole_course_starts_a_fresh_index(tmp_path):
    """A run of the whole course (``fresh``) starts from no rows: a renamed unit leaves no stale row."""
    index = tmp_path / "index.html"
    course.write_index([course.RunResult("lab06_faults_and_overload", "ok", 1.0, tmp_path / "a.ipynb")], index)
    course.write_index([course.RunResult("lab06_faults", "ok", 2.0, tmp_path / "b.ipynb")], index, fresh=True)
    rows = json.loads((tmp_path / course.INDEX_RESULTS).read_text())["rows"]
    assert [r["notebook"] for r in rows] == ["lab06_faults"]
