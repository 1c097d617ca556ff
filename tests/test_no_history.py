"""What a course user reads carries no history of how the project was built.

Scanned: every notebook in ``solutions/``, ``notebooks/`` and ``labs/`` (markdown and code cells),
``README.md``, ``docs/*.md`` and ``benchmarks/`` (its README and scripts). A file fails on

- a **run id** of the project's own runs: ``s`` or ``l``, two digits, a letter a–e, standing alone
  (``s51a``, ``build/lab05_s41a``, ``l01a``);
- a **reference to one of the project's issues**: ``issue 13``, ``Issue #22``, ``issues 45``,
  ``course issue``, ``the issue's``;
- a **date** ``20YY-MM-DD``: a dated run or history note.

The allow-list is narrow on purpose, and each entry is a citation of someone else's work:

- an issue of another project, named right before it (``vLLM issue #49250``): ``EXTERNAL_PROJECTS``;
- a date on a line that cites an external source: the line holds a URL, an arXiv id, or the word
  release/released/changelog (``EXTERNAL_CITATION``), as a paper's or a package's date does.

History belongs in ``notes/`` or the commit message; ``notes/`` is not scanned.

Lab and notebook prose (every cell of the solution notebooks; the student copies are generated from
them) also has no **changelog voice**: it says what is, not what changed. ``CHANGELOG`` flags "today's
policy", "the new one" / "the old one", "the new rule", "first numbers", "no longer", "anymore",
"previously", "formerly". ``PLAIN_USES`` allows a phrase in a context where it tells no history of the
project, each entry with its reason (for example "no longer" describing a mechanism: "decode no longer
waits for prefills").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pdlab.paths import repo_root

ROOT = repo_root()

RUN_ID = re.compile(r"(?<![A-Za-z0-9])[sl]\d{2}[a-e](?![A-Za-z0-9])")
ISSUE_REF = re.compile(r"\bissues?\s*#?\s*\d+|\bcourse\s+issues?\b|\bthe\s+issue(?:'s|’s)", re.IGNORECASE)
DATE = re.compile(r"(?<!\d)20\d{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)")

EXTERNAL_PROJECTS = ("vLLM", "SGLang", "NIXL", "Dynamo", "Mooncake", "LMCache", "PyTorch", "torch", "UCX",
                     "jupyter_client", "JupyterLab", "papermill", "Playwright", "plotly")
_EXTERNAL_ISSUE = re.compile("(?:" + "|".join(map(re.escape, EXTERNAL_PROJECTS)) + r")\s+$")
EXTERNAL_CITATION = re.compile(r"https?://|\barXiv\b|\breleased?\b|\bchangelog\b", re.IGNORECASE)


def history_notes(line: str) -> list[str]:
    """The history notes in one line of text, each as the matched text (empty: the line is clean)."""
    found = [m.group(0) for m in RUN_ID.finditer(line)]
    found += [m.group(0) for m in ISSUE_REF.finditer(line)
              if not _EXTERNAL_ISSUE.search(line[max(0, m.start() - 30):m.start()])]
    if not EXTERNAL_CITATION.search(line):
        found += [m.group(0) for m in DATE.finditer(line)]
    return found


def scanned_files() -> list[Path]:
    """Every file a course user reads as the course: notebooks, README, docs, the benchmarks."""
    files = [*ROOT.glob("solutions/**/*.ipynb"), *ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("labs/*.ipynb"),
             ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.md"), *ROOT.glob("benchmarks/*.py")]
    return sorted(p for p in files if p.is_file() and ".ipynb_checkpoints" not in p.parts)


def lines_of(path: Path) -> list[tuple[str, str]]:
    """(where, line) for every line of a file; a notebook's lines are its cells' sources."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [(f"cell {i} line {j + 1}", line) for i, cell in enumerate(cells)
                for j, line in enumerate("".join(cell["source"]).splitlines())]
    return [(f"line {j + 1}", line) for j, line in enumerate(path.read_text(encoding="utf-8").splitlines())]


@pytest.mark.parametrize("text", [
    "saved runs (`build/s51a`…`s53c`)", "see build/lab05_s41a", "lab 01 in the same session (l01a)",
    "Issue 26 asks lab 05's held-out fit", "issue #22", "course issue 13", "the issue's bar: ≥ 80%",
    "Before any fix (2026-11-30, quiet machine)",
])
def test_history_is_found(text):
    assert history_notes(text), f"not flagged: {text!r}"


@pytest.mark.parametrize("text", [
    "(vLLM issue #49250), and a default policy", "the s3 bucket and 512 tokens", "Llama-3.1-8B, TP 2",
    "arXiv 2407.00079v3 (2024-07-01)", "nixl 1.5.2, released 2026-01-15", "https://example.org/2026-01-15/notes",
    "an issue with the proxy", "sha 1ef4f33 of the scripts",
])
def test_citations_and_plain_words_pass(text):
    assert history_notes(text) == [], f"flagged: {text!r}"


def test_the_scan_covers_the_course():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert "README.md" in names and "docs/CONTRIBUTING.md" in names
    assert sum(n.startswith("solutions/") for n in names) >= 17, "the solution notebooks were not found"
    assert any(n.startswith("labs/") for n in names) and any(n.startswith("notebooks/") for n in names)


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_history_in(path):
    hits = [f"{where}: {', '.join(notes)} in {line.strip()[:120]!r}"
            for where, line in lines_of(path) if (notes := history_notes(line))]
    assert not hits, f"{path.relative_to(ROOT)} carries project history:\n" + "\n".join(hits)


CHANGELOG = re.compile(
    r"\btoday['’]s\b|\bthe (?:new|old) one\b(?!-)|\bthe (?:new|old) (?:policy|rule|version|default|check|code|path)\b"
    r"|\bfirst (?:\w+ )?numbers\b|\bno longer\b|\banymore\b|\bpreviously\b|\bformerly\b", re.IGNORECASE)

#: (context pattern, reason): a changelog phrase inside a match of the pattern is a plain use.
PLAIN_USES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"\bno longer (?:waits?|stalled|shares?)\b", re.IGNORECASE),
     "a mechanism: what disaggregation takes away from a step (decode no longer waits for prefills)"),
    (re.compile(r"\(\s*[^()]*\bformerly [\w.-]+\)", re.IGNORECASE),
     "another project's rename, cited beside its name (smg, formerly sglang-router)"),
]


def changelog_notes(line: str) -> list[str]:
    """The changelog phrases in one line of prose that no :data:`PLAIN_USES` context covers."""
    plain = [m.span() for pattern, _ in PLAIN_USES for m in pattern.finditer(line)]
    return [m.group(0) for m in CHANGELOG.finditer(line)
            if not any(a <= m.start() and m.end() <= b for a, b in plain)]


@pytest.mark.parametrize("text", [
    "2. **The queue, two ways.** Today's policy (`bookkeeping`) knows only the prompts",
    "sent and not yet seen come back. The new one (`engine state`) also reads", "the new rule admits more",
    "turned this lab's first disaggregated numbers into measurements", "lab 05 no longer uses it",
    "the proxy does not retry anymore", "previously the lab used one core", "the old one refused them",
])
def test_changelog_voice_is_found(text):
    assert changelog_notes(text), f"not flagged: {text!r}"


@pytest.mark.parametrize("text", [
    "decode no longer waits for prefills", "decode steps are no longer stalled by other requests' prefills",
    "a prefill no longer waits behind decode batches", "decode steps no longer share iterations with long prefills",
    "- smg (Shepherd Model Gateway, formerly sglang-router): https://github.com/smg-project/smg",
    "the first token's latency", "a new one-engine deployment", "the new one-engine lab", "today the cluster is idle",
])
def test_plain_uses_of_changelog_words_pass(text):
    assert changelog_notes(text) == [], f"flagged: {text!r}"


def solution_notebooks() -> list[Path]:
    """Every solution notebook: the lab and notebook prose the student copies are generated from."""
    return sorted(p for p in ROOT.glob("solutions/**/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("path", solution_notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_changelog_voice_in(path):
    hits = [f"{where}: {', '.join(notes)} in {line.strip()[:120]!r}"
            for where, line in lines_of(path) if (notes := changelog_notes(line))]
    assert not hits, (f"{path.relative_to(ROOT)} tells what changed, not what is (say what is, or add a plain use "
                      "to PLAIN_USES with its reason):\n" + "\n".join(hits))


BY_PATH = re.compile(r"sys\.path\.(?:insert|append)|spec_from_file_location|runpy\.run_path|SourceFileLoader")


def _code_files() -> list[tuple[Path, str]]:
    """(file, its code) for the package, the tests (this one left out) and the solution notebooks."""
    files = [(p, p.read_text(encoding="utf-8")) for d in ("helpers", "tests") for p in (ROOT / d).rglob("*.py")
             if p.resolve() != Path(__file__).resolve()]
    for nb in ROOT.glob("solutions/**/*.ipynb"):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        files.append((nb, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")))
    return files


def test_nothing_imports_a_script_by_path():
    """The package, the tests and the notebooks import no script of benchmarks/ or notes/: logic they
    need lives in pdlab, and no file puts a folder on sys.path or loads a module from a file."""
    scripts = sorted({p.stem for d in ("benchmarks", "notes") for p in (ROOT / d).rglob("*.py")})
    assert "bench_sim" in scripts
    imports = re.compile(r"^\s*(?:from|import)\s+(?:" + "|".join(map(re.escape, scripts)) + r")\b", re.MULTILINE)
    bad = [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for path, code in _code_files()
           for m in (*BY_PATH.finditer(code), *imports.finditer(code))]
    assert not bad, "scripts imported by path:\n" + "\n".join(bad)
