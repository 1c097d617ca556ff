"""How big a unit is and how long a learner takes over it: one stated rule for every unit.

Size (the limits every solution unit keeps, so that a learner finishes it in about an hour):
``MAX_CELLS`` cells, ``MAX_MARKDOWN_WORDS`` words of markdown, no markdown cell over
``MAX_CELL_WORDS`` words. Words are whitespace-separated tokens of a markdown cell's source.

Learner time (:func:`learner_minutes`), read off the unit's **student copy** (what the learner
reads and runs; the answers are not in it):

- reading: its markdown words at ``READING_WORDS_PER_MIN`` (130) words per minute;
- code: its non-blank code lines at ``CODE_LINES_PER_MIN`` (10) lines per minute;
- running: the slowest ``ci`` run of the unit recorded in ``data/course/ci_times.csv`` (seconds, see
  :func:`pdlab.course.generate.ci_seconds`); a unit without a recorded run has no learner time;
- exercises: ``MINUTES_PER_EXERCISE`` (8) minutes per exercise (a ``### BEGIN SOLUTION`` block of
  the solution).

Prose that a run computes (markdown printed by code) is not counted: the rule reads the notebook
files, not their outputs. Notebook 00 and the README print the total rounded to
``LEARNER_ROUND_MIN`` (5) minutes (:func:`learner_label`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from pdlab.paths import repo_root

__all__ = ["CODE_LINES_PER_MIN", "LEARNER_ROUND_MIN", "MAX_CELLS", "MAX_CELL_WORDS", "MAX_MARKDOWN_WORDS",
           "MINUTES_PER_EXERCISE", "READING_WORDS_PER_MIN", "LearnerTime", "UnitSize", "learner_label",
           "learner_minutes", "learner_times", "readme_with_learner_times", "refresh_readme_learner_times",
           "unit_size"]

MAX_CELLS = 45
MAX_MARKDOWN_WORDS = 2200
MAX_CELL_WORDS = 300
READING_WORDS_PER_MIN = 130
CODE_LINES_PER_MIN = 10
MINUTES_PER_EXERCISE = 8
LEARNER_ROUND_MIN = 5

_BEGIN = "### BEGIN SOLUTION"


@dataclass(frozen=True)
class UnitSize:
    """A notebook's size: cells, markdown words (whitespace-separated), the largest markdown cell (words,
    and its index), non-blank code lines, and exercises (``### BEGIN SOLUTION`` blocks)."""

    cells: int
    markdown_words: int
    largest_cell_words: int
    largest_cell: int | None
    code_lines: int
    exercises: int

    def problems(self, *, core: bool = True) -> list[str]:
        """What breaks the size limits (empty: none); ``core=False`` (an optional appendix that counts as
        no unit) checks only the per-cell limit."""
        out = []
        if core and self.cells > MAX_CELLS:
            out.append(f"{self.cells} cells (at most {MAX_CELLS})")
        if core and self.markdown_words > MAX_MARKDOWN_WORDS:
            out.append(f"{self.markdown_words} markdown words (at most {MAX_MARKDOWN_WORDS})")
        if self.largest_cell_words > MAX_CELL_WORDS:
            out.append(f"markdown cell [{self.largest_cell}] has {self.largest_cell_words} words (at most "
                       f"{MAX_CELL_WORDS})")
        return out


def _read(notebook) -> nbformat.NotebookNode:
    if isinstance(notebook, (str, Path)):
        path = Path(notebook)
        if not path.is_file():
            raise FileNotFoundError(f"no notebook at {path}")
        return nbformat.read(path, as_version=4)
    return notebook


def unit_size(notebook) -> UnitSize:
    """The :class:`UnitSize` of a notebook (a path or a NotebookNode)."""
    nb = _read(notebook)
    words = [(len(c.source.split()), i) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]
    largest = max(words, default=(0, None))
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    return UnitSize(cells=len(nb.cells), markdown_words=sum(w for w, _ in words), largest_cell_words=largest[0],
                    largest_cell=largest[1], code_lines=sum(1 for s in code for line in s.splitlines() if line.strip()),
                    exercises=sum(s.count(_BEGIN) for s in code))


@dataclass(frozen=True)
class LearnerTime:
    """Minutes a learner spends on a unit by the module's rule, in its four parts, and their total."""

    reading_min: float
    code_min: float
    run_min: float
    exercises_min: float

    @property
    def total_min(self) -> float:
        return self.reading_min + self.code_min + self.run_min + self.exercises_min


def learner_minutes(solution: str | Path, *, run_seconds: float | None = None, root: Path | None = None) -> LearnerTime:
    """The learner time of the unit whose solution notebook is ``solution`` (path), by the rule of this
    module: its student copy's markdown words at 130 words/min and non-blank code lines at 10 lines/min
    (the copy is generated in memory, as ``pdlab course build`` writes it), its slowest recorded ``ci`` run
    (``run_seconds``, or the unit's row of ``data/course/ci_times.csv``), and 8 minutes per exercise."""
    from pdlab.course.generate import COURSE_MAP, ci_seconds, student_copy

    root = root or repo_root()
    path = Path(solution)
    solution_nb = _read(path)
    if run_seconds is None:
        units = {stem: ident for ident, stem, _ in COURSE_MAP}
        if path.stem not in units:
            raise ValueError(f"{path.name} is not a unit of the course map (pdlab.course.generate.COURSE_MAP); "
                             "pass run_seconds for a notebook outside it")
        times = ci_seconds(root)
        if units[path.stem] not in times:
            raise ValueError(f"unit {units[path.stem]} ({path.name}) has no ci run in data/course/ci_times.csv: "
                             "run it (pdlab course run --profile ci) and record the time")
        run_seconds = times[units[path.stem]][1]
    if run_seconds < 0:
        raise ValueError(f"run_seconds must be ≥ 0, got {run_seconds}")
    copy = student_copy(solution_nb, str(path))
    size, exercises = unit_size(copy), unit_size(solution_nb).exercises
    return LearnerTime(reading_min=size.markdown_words / READING_WORDS_PER_MIN,
                       code_min=size.code_lines / CODE_LINES_PER_MIN, run_min=run_seconds / 60,
                       exercises_min=exercises * MINUTES_PER_EXERCISE)


def learner_label(minutes: float) -> str:
    """Minutes as notebook 00 and the README print a learner time: rounded to ``LEARNER_ROUND_MIN``
    minutes ("65")."""
    if not minutes >= 0:
        raise ValueError(f"a learner time must be a number of minutes ≥ 0, got {minutes}")
    return f"{LEARNER_ROUND_MIN * round(minutes / LEARNER_ROUND_MIN):.0f}"


def learner_times(root: Path | None = None) -> dict[str, LearnerTime]:
    """unit id → :class:`LearnerTime` for every unit of the course map whose solution exists and whose ci run
    is recorded."""
    from pdlab.course.generate import COURSE_MAP, ci_seconds

    root = root or repo_root()
    times = ci_seconds(root)
    out = {}
    for ident, stem, _ in COURSE_MAP:
        path = root / "solutions" / ("labs" if ident.startswith("lab") else "notebooks") / f"{stem}.ipynb"
        if path.exists() and ident in times:
            out[ident] = learner_minutes(path, run_seconds=times[ident][1], root=root)
    return out


_CORE_PATH = re.compile(r"(core\s+path\s+takes\s+about\s+\*\*)\d+(\s+min\*\*\s+of\s+learner\s+time,\s+of\s+which\s+at\s+most"
                        r"\s+\*\*)\d+(\s+min\*\*)")


def refresh_readme_learner_times(root: Path | None = None) -> list[str]:
    """Rewrite the README course map's *learner min* column (``| id | unit | track | learner min | ci min |
    … |`` rows) and its core-path sentence from :func:`learner_times` and the ci times; return the units
    whose value changed. Run it after a unit's prose, code, exercises or ci time changed."""
    root = root or repo_root()
    path = root / "README.md"
    text, changed = readme_with_learner_times(path.read_text(encoding="utf-8"), root)
    path.write_text(text, encoding="utf-8")
    return changed


def readme_with_learner_times(text: str, root: Path | None = None) -> tuple[str, list[str]]:
    """``text`` (the README) with its learner min column and core-path sentence computed, and the units whose
    value changed (see :func:`refresh_readme_learner_times`)."""
    from pdlab.course.generate import ci_seconds

    root = root or repo_root()
    learner, times = learner_times(root), ci_seconds(root)
    changed, core, lines = [], [], []
    for line in text.splitlines(keepends=True):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 6 and cells[2] in ("core", "optional"):
            unit = cells[0]
            value = learner_label(learner[unit].total_min) if unit in learner else "not measured"
            core += [unit] if cells[2] == "core" else []
            if value != cells[3]:
                changed.append(unit)
                line = "| " + " | ".join([*cells[:3], value, *cells[4:]]) + " |\n"
        lines.append(line)
    text = "".join(lines)
    missing = [u for u in core if u not in learner]
    if missing:
        raise ValueError(f"core units without a learner time (no ci run recorded?): {missing}")
    total = learner_label(sum(learner[u].total_min for u in core))
    run_min = f"{sum(times[u][1] for u in core) / 60:.0f}"
    text, found = _CORE_PATH.subn(lambda m: f"{m.group(1)}{total}{m.group(2)}{run_min}{m.group(3)}", text)
    if found != 1:
        raise ValueError(f"README: expected one core-path sentence ('core path takes about **N min** of learner "
                         f"time, of which at most **M min** ...'), found {found}")
    return text, changed
