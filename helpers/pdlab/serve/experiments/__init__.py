"""Live experiments on a P/D deployment (labs 06 and 07).

- :mod:`~pdlab.serve.experiments.faults` — a fault injected into one role, and what the client sees;
- :mod:`~pdlab.serve.experiments.overload` — overload with and without early rejection at the proxy.

Their names are re-exported here; nothing starts at import time.
"""

from pdlab.serve.experiments import faults, overload
from pdlab.serve.experiments.faults import *  # noqa: F403 - the names listed in faults.__all__
from pdlab.serve.experiments.overload import *  # noqa: F403 - the names listed in overload.__all__

__all__ = [*faults.__all__, *overload.__all__]
