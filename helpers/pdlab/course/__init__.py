"""The notebook pipeline: student copies from solutions, papermill runs, write-ups.

- :mod:`pdlab.course.generate` — student copies (``make notebooks``), the sync check, output
  stripping, the course map.
- :mod:`pdlab.course.run` — papermill runs of one notebook or the whole course.
- :mod:`pdlab.course.export` — executed notebooks to HTML/Markdown; a lab's write-up notebook.
- :mod:`pdlab.course.effort` — a unit's size and its learner time, by one stated rule.

The names of the four other packages use are listed here.
"""

from pdlab.course.effort import (
    LearnerTime,
    UnitSize,
    learner_label,
    learner_minutes,
    learner_times,
    unit_size,
)
from pdlab.course.export import (
    ChromiumNotFoundError,
    export,
    export_writeup,
    find_chromium,
    table_html,
    writeup_cells,
    writeup_notebook,
)
from pdlab.course.generate import (
    build,
    ci_minutes,
    ci_seconds,
    course_map,
    normalize_solution,
    notebooks_with_outputs,
    out_of_sync,
    solution_notebooks,
    strip_outputs,
    student_copy,
    student_notebooks,
)
from pdlab.course.run import (
    INDEX_RESULTS,
    KERNEL_ENCRYPTION,
    RunResult,
    ensure_kernel,
    run_course,
    run_notebook,
    write_index,
)

__all__ = [
    # generate
    "ci_minutes", "ci_seconds", "student_copy", "build", "out_of_sync", "strip_outputs",
    "notebooks_with_outputs", "solution_notebooks", "student_notebooks", "normalize_solution", "course_map",
    # run
    "INDEX_RESULTS", "KERNEL_ENCRYPTION", "RunResult", "ensure_kernel", "run_notebook", "run_course",
    "write_index",
    # effort
    "LearnerTime", "UnitSize", "learner_label", "learner_minutes", "learner_times", "unit_size",
    # export
    "export", "writeup_notebook", "export_writeup", "writeup_cells", "table_html", "find_chromium",
    "ChromiumNotFoundError",
]
