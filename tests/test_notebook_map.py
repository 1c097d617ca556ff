"""docs/CONTRIBUTING.md's notebook → module map is in sync with the solution notebooks' imports.

The map is generated from the notebooks' ``import pdlab…`` / ``from pdlab… import`` lines (code
cells, indented ones included). After adding or removing such an import, regenerate it:
``.venv/bin/python tests/test_notebook_map.py --write``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "CONTRIBUTING.md"
START, END = "<!-- notebook-module-map:start -->", "<!-- notebook-module-map:end -->"
_IMPORT = re.compile(r"^\s*(?:from\s+(pdlab(?:\.\w+)*)\s+import\b|import\s+(pdlab(?:\.\w+)*))", re.M)


def solution_notebooks() -> list[Path]:
    """Every solution notebook in course order: notebooks 00–09, then labs."""
    return sorted((ROOT / "solutions" / "notebooks").glob("*.ipynb")) + \
        sorted((ROOT / "solutions" / "labs").glob("*.ipynb"))


def notebook_imports(path: Path) -> list[str]:
    """The pdlab modules a notebook's code cells import, sorted (``pdlab`` for the package itself)."""
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return sorted({m.group(1) or m.group(2) for m in _IMPORT.finditer(code)})


def _short(module: str) -> str:
    return "`" + (module.removeprefix("pdlab.") if module != "pdlab" else "pdlab") + "`"


def render_map() -> str:
    """The two Markdown tables between the markers: per notebook its modules, per module its home chapter."""
    rows = [(nb.stem, notebook_imports(nb)) for nb in solution_notebooks()]
    out = ["| solution notebook | pdlab modules it imports (`pdlab.` left off) |", "|---|---|"]
    out += [f"| `{stem}` | {', '.join(_short(m) for m in mods)} |" for stem, mods in rows]
    home: dict[str, list[str]] = {}
    for stem, mods in rows:
        for m in mods:   # a chapter and its appendix count once
            if stem.split("_")[0] not in home.setdefault(m, []):
                home[m].append(stem.split("_")[0])
    out += ["", "| module | home chapter (first to import it) | also imported by |", "|---|---|---|"]
    out += [f"| {_short(m)} | {users[0]} | {', '.join(users[1:]) or '—'} |"
            for m, users in sorted(home.items()) if not m.startswith("pdlab.exercises.")]
    return "\n".join(out)


def documented_map() -> str:
    text = DOC.read_text()
    assert START in text and END in text, f"{DOC} lost the markers {START} … {END}"
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def test_every_solution_notebook_is_in_the_map():
    doc = documented_map()
    missing = [nb.stem for nb in solution_notebooks() if f"| `{nb.stem}` |" not in doc]
    assert not missing, f"solution notebooks missing from the map in {DOC.name}: {missing}"


def test_the_map_lists_exactly_what_each_notebook_imports():
    doc_rows = {}
    for line in documented_map().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and "_" in cells[0]:
            doc_rows[cells[0].strip("`")] = {("pdlab" if m == "pdlab" else f"pdlab.{m}")
                                             for m in re.findall(r"`([\w.]+)`", cells[1])}
    for nb in solution_notebooks():
        imported = set(notebook_imports(nb))
        unlisted = imported - doc_rows.get(nb.stem, set())
        assert not unlisted, (f"{nb.stem} imports {sorted(unlisted)}, not in the map in {DOC.name}; "
                              "run `.venv/bin/python tests/test_notebook_map.py --write`")
        stale = doc_rows.get(nb.stem, set()) - imported
        assert not stale, f"the map lists {sorted(stale)} for {nb.stem}, which no longer imports them"


def test_the_map_is_exactly_what_the_generator_writes():
    assert documented_map() == render_map(), \
        "docs/CONTRIBUTING.md's notebook → module map is stale: `.venv/bin/python tests/test_notebook_map.py --write`"


def test_import_lines_are_found_in_every_form():
    code = "import pdlab\nfrom pdlab.sim import simulate\n    import pdlab.plots as pp\nfrom pdlab.serve.client.bench import (\n x)\n"
    assert sorted({m.group(1) or m.group(2) for m in _IMPORT.finditer(code)}) == \
        ["pdlab", "pdlab.plots", "pdlab.serve.client.bench", "pdlab.sim"]


if __name__ == "__main__":
    table = render_map()
    if "--write" in sys.argv[1:]:
        text = DOC.read_text()
        head, rest = text.split(START, 1)
        DOC.write_text(f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}")
    else:
        print(table)
