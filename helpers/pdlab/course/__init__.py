"""The notebook pipeline: student copies from solutions, papermill runs, write-ups.

- :mod:`pdlab.course.generate` — student copies (``make notebooks``), the sync check, output
  stripping, the course map.
- :mod:`pdlab.course.run` — papermill runs of one notebook or the whole course.
- :mod:`pdlab.course.export` — executed notebooks to HTML/Markdown; a lab's write-up notebook.

The public names of the three are re-exported here.
"""

from pdlab.course import export as _export_module
from pdlab.course import generate as _generate_module
from pdlab.course import run as _run_module
from pdlab.course.export import *  # noqa: F403 - the names listed in export.__all__
from pdlab.course.generate import *  # noqa: F403 - the names listed in generate.__all__
from pdlab.course.run import *  # noqa: F403 - the names listed in run.__all__

__all__ = [*_generate_module.__all__, *_run_module.__all__, *_export_module.__all__]
