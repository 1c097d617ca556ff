"""Moved to :mod:`pdlab.process` (the foundation layer). This alias goes once every caller imports
``pdlab.process``; new code must not import it."""

from pdlab.process import *  # noqa: F401,F403
from pdlab.process import __all__  # noqa: F401
