"""pdlab — helpers for the disaggregated prefill/decode serving course.

Import what you need from the submodules (``pdlab.models``, ``pdlab.hardware``, ...);
nothing runs at import time.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
