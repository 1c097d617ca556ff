"""No exercise is answered by one call to a helper the student copy already imports or names.

An exercise whose answer is ``f(...)`` for an ``f`` on the page teaches nothing: the student copies
the call. For every exercise of every solution notebook (the ``### BEGIN SOLUTION`` blocks), two
static checks:

- the reference answer in the solution block is not the return value of a single call (possibly
  followed by ``.attr`` / ``[key]``, possibly through one intermediate variable) to a function
  that the student copy imports or names;
- the check function the next cell calls does not compute its expected value as such a call
  either (the student could make the same call);
- the reference answer is not one attribute, property or constant-key lookup of an object the
  notebook built (``ev.transferred_fraction``, ``float(res.summary["goodput"])``, possibly through one
  intermediate variable): a name the student copy's code assigns already holds the answer, and the
  student reads it off.

An exercise may be exempt with a written reason: a module-level dict ``ONE_CALL_OK = {"Exercise N":
"reason"}`` in its exercise module (``pdlab.exercises.nbNN`` / ``labNN``).

A third check runs the checks themselves: for every exercise of the battery
(``tests/test_exercise_battery.py``, each check with the inputs a notebook gives it), no single
number or property of one of those inputs passes the check. An exemption, with its reason, is a
module-level ``ONE_ATTRIBUTE_OK = {"check_name": "reason"}`` in the exercise module.

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


def top_level_assigns(code: str) -> dict[str, ast.AST]:
    """Each name a top-level ``name = value`` of ``code`` assigns, mapped to its value (the last one)."""
    assigns: dict[str, ast.AST] = {}
    for stmt in ast.parse(textwrap.dedent(code)).body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    assigns[target.id] = stmt.value
    return assigns


def one_call_answer(code: str, variables: list[str], page_names: set[str]) -> str | None:
    """The helper named on the page that answers ``variables`` in one call in ``code``, or None."""
    assigns = top_level_assigns(code)
    for var in variables:
        if var in assigns:
            name = _core_call(assigns[var], assigns)
            if name is not None and name in page_names:
                return name
    return None


def _lookup_of(node: ast.AST, block_assigns: dict[str, ast.AST], depth: int = 0) -> tuple[str, str] | None:
    """(object name, the attribute path) when ``node`` is one attribute, property or constant-key lookup of
    a plain name (through a builtin conversion like ``float(...)`` or one variable of the same block), else
    None."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _WRAPPERS \
            and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    if isinstance(node, ast.Name) and node.id in block_assigns and depth < 3:
        return _lookup_of(block_assigns[node.id], block_assigns, depth + 1)
    path, steps = [], 0
    while True:
        if isinstance(node, ast.Attribute):
            path.append(f".{node.attr}")
            node = node.value
        elif isinstance(node, ast.Subscript) and (
                isinstance(node.slice, ast.Constant) or (isinstance(node.slice, ast.Tuple) and all(
                    isinstance(e, ast.Constant) for e in node.slice.elts))):
            path.append(f"[{ast.unparse(node.slice)}]")
            node = node.value
        else:
            break
        steps += 1
    if steps and isinstance(node, ast.Name):
        return node.id, "".join(reversed(path))
    return None


def one_attribute_answer(code: str, variables: list[str], built: set[str]) -> str | None:
    """``obj.attr`` when the answer to one of ``variables`` in ``code`` is one attribute, property or
    constant-key lookup of ``obj``, a name in ``built`` (assigned by the student copy's code), else None."""
    assigns = top_level_assigns(code)
    for var in variables:
        if var in assigns:
            found = _lookup_of(assigns[var], {k: v for k, v in assigns.items() if k != var})
            if found and found[0] in built and found[0] not in assigns:
                return found[0] + found[1]
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


def built_names(student_nb) -> set[str]:
    """Every name the student copy's code cells assign (the objects the notebook built)."""
    names: set[str] = set()
    for cell in student_nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.comprehension)) else []
            if isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets = [node.optional_vars]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
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

    built = {"ev_first", "res", "table"}
    assert one_attribute_answer("x = ev_first.transferred_fraction", ["x"], built) == "ev_first.transferred_fraction"
    assert one_attribute_answer("x = float(res.summary['goodput'])", ["x"], built) == "res.summary['goodput']"
    assert one_attribute_answer("s = table.loc['a', 'b']\nx = s", ["x"], built) == "table.loc[('a', 'b')]"
    assert one_attribute_answer("x = ev_first.a / ev_first.b", ["x"], built) is None   # arithmetic on two reads
    assert one_attribute_answer("x = other.attr", ["x"], built) is None                # not built by the notebook
    assert one_attribute_answer("res = run(a)\nx = res.attr", ["x"], built) is None    # rebuilt in the answer
    assert one_attribute_answer("x = res[k]", ["x"], built) is None                   # a computed key: a search
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
    student_nb = nbformat.read(student, as_version=4)
    names, built = page_names(student_nb), built_names(student_nb)
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
        lookup = one_attribute_answer(block, variables, built)
        if lookup:
            problems.append(f"{name}: the reference answer is {lookup}, one attribute of an object the notebook "
                            "built, which the student reads off")
        if check_fn is not None:
            helper = expected_one_call(check_fn, names)
            if helper:
                problems.append(f"{name}: {check}() computes the answer as one call to {helper}(), which the "
                                "student copy names, so the student can make the same call")
    if found == 0:
        pytest.skip(f"{path.name} has no exercises")
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


# ------------------------------------------------------- answers read off the objects a check is given

_PLAIN = (str, bytes, int, float, bool, list, tuple, dict, set, frozenset, type(None))


def numeric_attributes(obj) -> dict[str, object]:
    """Every public attribute or property of ``obj`` that holds a number or a bool (not a method): what a
    student can read off an object the notebook built and hand in as the answer."""
    import numbers

    if isinstance(obj, _PLAIN) or callable(obj):
        return {}
    out = {}
    for name in dir(obj):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # a property that needs state the object lacks
            continue
        if isinstance(value, (bool, numbers.Number)) and not callable(value):
            out[name] = value
    return out


def test_numeric_attributes_reads_fields_and_properties():
    from dataclasses import dataclass

    @dataclass
    class Evidence:
        external: int
        prompt: int
        label: str = "x"

        @property
        def fraction(self) -> float:
            return self.external / self.prompt

        def share(self) -> float:
            return self.fraction

    assert numeric_attributes(Evidence(3, 4)) == {"external": 3, "prompt": 4, "fraction": 0.75}
    assert numeric_attributes([1, 2]) == {} and numeric_attributes(3.0) == {}


def test_no_check_passes_one_attribute_of_the_objects_it_is_given(monkeypatch):
    """For every exercise of the battery (``tests/test_exercise_battery.py``, each check with the inputs a
    notebook gives it), no single number or property of one of those inputs passes the check: an answer that
    is one attribute of an object the notebook built teaches nothing (``ev_first.transferred_fraction``)."""
    from pdlab.exercises import PASSED
    from test_exercise_battery import CASES

    monkeypatch.setenv("PDLAB_STRICT_CHECKS", "0")
    monkeypatch.delenv("PDLAB_EXPECTED_LOG", raising=False)
    problems = []
    for case in CASES:
        if not case.call.__defaults__:  # a case built by hand, with no inputs to read attributes off
            continue
        fn, args, kw = case.call.__defaults__
        reasons = getattr(importlib.import_module(fn.__module__), "ONE_ATTRIBUTE_OK", {})
        if fn.__name__ in reasons:
            assert isinstance(reasons[fn.__name__], str) and len(reasons[fn.__name__]) >= 20, \
                f"{case.name}: ONE_ATTRIBUTE_OK needs a written reason"
            continue
        for where, obj in [*((f"argument {i}", a) for i, a in enumerate(args)), *kw.items()]:
            for name, value in numeric_attributes(obj).items():
                try:
                    passed = case.call(value).status == PASSED
                except Exception:  # the check refuses a value of that kind: not an answer
                    passed = False
                if passed:
                    problems.append(f"{case.name}: {type(obj).__name__}.{name} ({where}) passes the check")
    assert not problems, "exercises answered by one attribute of an object the notebook built:\n  " + \
        "\n  ".join(problems)
