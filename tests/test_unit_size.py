"""Every solution unit is one a learner finishes in about an hour: at most ``MAX_CELLS`` cells and
``MAX_MARKDOWN_WORDS`` markdown words, and no markdown cell over ``MAX_CELL_WORDS`` words
(:mod:`pdlab.course.effort`). A notebook outside the course map (an optional appendix) counts as no
unit: it keeps only the per-cell limit."""

from __future__ import annotations

import nbformat
import pytest
from pdlab.course.effort import MAX_CELL_WORDS, MAX_CELLS, MAX_MARKDOWN_WORDS, unit_size
from pdlab.course.generate import COURSE_MAP, solution_notebooks

SOLUTIONS = solution_notebooks()
UNITS = {stem for _, stem, _ in COURSE_MAP}


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_size_counts_cells_words_code_lines_and_exercises():
    words = " ".join(["word"] * (MAX_CELL_WORDS + 1))
    nb = _nb(nbformat.v4.new_markdown_cell("# Title\n\nthree more words"),
             nbformat.v4.new_code_cell("x = None\n\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"),
             nbformat.v4.new_markdown_cell(words))
    size = unit_size(nb)
    assert (size.cells, size.markdown_words, size.largest_cell_words, size.largest_cell) == (3, 5 + MAX_CELL_WORDS + 1,
                                                                                            MAX_CELL_WORDS + 1, 2)
    assert (size.code_lines, size.exercises) == (4, 1)
    assert size.problems() == [f"markdown cell [2] has {MAX_CELL_WORDS + 1} words (at most {MAX_CELL_WORDS})"]
    many = unit_size(_nb(*[nbformat.v4.new_markdown_cell(" ".join(["w"] * 50)) for _ in range(MAX_CELLS + 1)]))
    assert len(many.problems()) == 2 and many.markdown_words == 50 * (MAX_CELLS + 1) > MAX_MARKDOWN_WORDS
    assert many.problems(core=False) == []   # an appendix: only the per-cell limit


def test_every_course_unit_has_a_solution():
    assert UNITS <= {p.stem for p in SOLUTIONS}, f"course map units without a solution: {UNITS - {p.stem for p in SOLUTIONS}}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_unit_fits_an_hour(path):
    problems = unit_size(path).problems(core=path.stem in UNITS)
    assert not problems, f"{path.parent.name}/{path.name}: " + "; ".join(problems)
