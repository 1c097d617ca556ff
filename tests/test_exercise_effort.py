"""No exercise is answered by one call to a helper the student copy already imports or names.

An exercise whose answer is ``f(...)`` for an ``f`` on the page teaches nothing: the student copies
the call. For every exercise of every solution notebook (the ``### BEGIN SOLUTION`` blocks), two
static checks:

- the reference answer in the solution block is not the return value of a single call (possibly
  followed by ``.attr`` / ``[key]``, possibly through one intermediate variable) to a function
  that the student copy imports or names;
- the check function the next cell calls does not compute its expected value as such a call
  either (the student could make the same call).

An exercise may be exempt with a written reason: a module-level dict ``ONE_CALL_OK = {"Exercise N":
"reason"}`` in its exercise module (``pdlab.exercises.nbNN`` / ``labNN``).

``PENDING`` lists notebooks whose owners have not committed their rework of one-call exercises
yet (issue 23): they are skipped with that reason, and each entry must go once its rework lands.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions" / "labs").glob("*.ipynb"))

# Notebooks whose exercises are being reworked by their owners (issue 23); remove an entry when
# its rework is committed. Each value says who owns it.
PENDING: dict[str, str] = {
}

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_EXERCISE_RE = re.compile(r"#\s*Exercise\s+(\w+)")
_WRAPPERS = {"float", "int", "round", "abs", "bool", "str", "list", "tuple", "sorted", "set"}
_BUILTINS = set(dir(builtins))
_IDENT = re.compile(r"[A-Za-z_]\w*")


# ------------------------------------------------------------------------------------ the detector


def _core_call(node: ast.AST, block_assigns: dict[str, ast.AST] | None = None, depth: int = 0) -> str | None:
    """The name of the function whose single call ``node`` returns (through ``.attr``, ``[key]``,
    a builtin conversion like ``float(...)``, or one variable assigned in the same block), or None
    when ``node`` computes something (arithmetic, a comprehension, a literal...)."""
    while True:
        if isinstance(node, ast.Attribute) or (isinstance(node, ast.Subscript)
                                                and isinstance(node.slice, ast.Constant)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _WRAPPERS \
                and len(node.args) == 1 and not node.keywords:
            node = node.args[0]
        else:
            break
    if isinstance(node, ast.Name) and block_assigns and node.id in block_assigns and depth < 3:
        return _core_call(block_assigns[node.id], block_assigns, depth + 1)
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None or name in _BUILTINS:
        return None
    return name


def one_call_answer(code: str, variables: list[str], page_names: set[str]) -> str | None:
    """The helper named on the page that answers ``variables`` in one call in ``code``, or None."""
    tree = ast.parse(textwrap.dedent(code))
    assigns: dict[str, ast.AST] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    assigns[target.id] = stmt.value
    for var in variables:
        if var in assigns:
            name = _core_call(assigns[var], assigns)
            if name is not None and name in page_names:
                return name
    return None


def expected_one_call(check_fn, page_names: set[str]) -> str | None:
    """The helper named on the page whose single call a check function returns as its expected value."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(check_fn)))
    fn = tree.body[0]
    assigns = {t.id: s.value for s in ast.walk(fn) if isinstance(s, ast.Assign)
               for t in s.targets if isinstance(t, ast.Name)}
    candidates = []
    if "expected" in assigns:
        candidates.append(assigns["expected"])
    for node in ast.walk(fn):  # check_close("Exercise N", value, <expected>, ...) without a variable
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check_close" \
                and len(node.args) >= 3:
            candidates.append(node.args[2])
    for node in candidates:
        name = _core_call(node, assigns)
        if name is not None and name in page_names:
            return name
    return None


# ------------------------------------------------------------------------------- reading notebooks


def page_names(student_nb) -> set[str]:
    """Every identifier the student copy's code cells use, and every one its markdown puts in backticks."""
    names: set[str] = set()
    for cell in student_nb.cells:
        if cell.cell_type == "code":
            names |= set(_IDENT.findall(cell.source))
        elif cell.cell_type == "markdown":
            for span in re.findall(r"`([^`]+)`", cell.source):
                names |= set(_IDENT.findall(span))
    return names


def exercises(solution_nb):
    """(exercise name, answer variables, solution code, check function name) for each solution block."""
    cells = solution_nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or BEGIN not in cell.source:
            continue
        head, rest = cell.source.split(BEGIN, 1)
        block = rest.split(END, 1)[0]
        m = _EXERCISE_RE.search(head) or _EXERCISE_RE.search(cell.source)
        name = f"Exercise {m.group(1)}" if m else f"cell {i}"
        variables = re.findall(r"^(\w+)\s*=\s*None\b", head, flags=re.M)
        check = None
        for later in cells[i + 1:i + 4]:
            found = re.search(r"\b(check_\w+)\(", later.source) if later.cell_type == "code" else None
            if found:
                check = found.group(1)
                break
        yield name, variables, block, check


def _check_function(solution_nb, check_name: str):
    text = "\n".join(c.source for c in solution_nb.cells if c.cell_type == "code")
    for mod in re.findall(r"from (pdlab\.exercises\.\w+) import", text):
        module = importlib.import_module(mod)
        if hasattr(module, check_name):
            return module, getattr(module, check_name)
    return None, None


def _student_copy(path: Path) -> Path:
    return ROOT / path.parent.name / path.name


# ------------------------------------------------------------------------------------------- tests


def test_detector_flags_one_call_answers_and_passes_reasoning():
    page = {"f", "slo_attainment", "est", "colocated", "analyze"}
    assert one_call_answer("x = f(a, b)", ["x"], page) == "f"
    assert one_call_answer("x = float(analyze(m).time_s)", ["x"], page) == "analyze"
    assert one_call_answer("r = est.colocated(q, l)\nx = r.tpot_s", ["x"], page) == "colocated"
    assert one_call_answer("x = slo_attainment(recs, slo)[0]", ["x"], page) == "slo_attainment"
    assert one_call_answer("x = f(a) / 2", ["x"], page) is None            # arithmetic on the result
    assert one_call_answer("x = g(a)", ["x"], page) is None                # g is not on the page
    assert one_call_answer("x = sum(1 for r in recs if r.ok) / len(recs)", ["x"], page) is None
    assert one_call_answer("x = 0\nfor r in recs:\n    x += f(r)", ["x"], page) is None
    assert one_call_answer("g = f(a)\nx = g[int(h(g))]", ["x"], page) is None  # a computed index: a search

    def check_bad(value, a):
        expected = f(a).time_s  # noqa: F821
        return expected

    def check_inline(value, a):
        return check_close("Exercise 1", value, analyze(a), rel_tol=0.1)  # noqa: F821

    def check_good(value, a):
        expected = 1 + f(a) / 2  # noqa: F821
        return expected

    assert expected_one_call(check_bad, page) == "f"
    assert expected_one_call(check_inline, page) == "analyze"
    assert expected_one_call(check_good, page) is None


def test_pending_entries_name_real_notebooks():
    names = {p.name for p in SOLUTIONS}
    assert set(PENDING) <= names, f"PENDING names notebooks that do not exist: {set(PENDING) - names}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_no_exercise_is_answered_by_one_call_on_the_page(path):
    if path.name in PENDING:
        pytest.skip(f"PENDING: {PENDING[path.name]}")
    solution = nbformat.read(path, as_version=4)
    student = _student_copy(path)
    assert student.exists(), f"{path.name}: no student copy at {student} (run pdlab course build)"
    names = page_names(nbformat.read(student, as_version=4))
    problems = []
    found = 0
    for name, variables, block, check in exercises(solution):
        found += 1
        module, check_fn = _check_function(solution, check) if check else (None, None)
        reasons = getattr(module, "ONE_CALL_OK", {}) if module else {}
        if name in reasons:
            assert isinstance(reasons[name], str) and len(reasons[name]) >= 20, \
                f"{path.name} {name}: ONE_CALL_OK needs a written reason"
            continue
        if not variables:
            problems.append(f"{name}: no answer variable set to None before {BEGIN}")
            continue
        helper = one_call_answer(block, variables, names)
        if helper:
            problems.append(f"{name}: the reference answer is one call to {helper}(), which the student copy names")
        if check_fn is not None:
            helper = expected_one_call(check_fn, names)
            if helper:
                problems.append(f"{name}: {check}() computes the answer as one call to {helper}(), which the "
                                "student copy names, so the student can make the same call")
    if found == 0:
        pytest.skip(f"{path.name} has no exercises")
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)
