"""Measuring a live deployment beside its benchmark.

- :mod:`~pdlab.serve.measure.cpucost` — CPU of process trees, idle and under load;
- :mod:`~pdlab.serve.measure.hostcheck` — does the bare host run a fixed kernel at one speed?
- :mod:`~pdlab.serve.measure.ttft` — TTFT anatomy from the engines' and the proxy's clocks;
- :mod:`~pdlab.serve.measure.evidence` — ``/metrics`` scrapes: KV tokens transferred vs recomputed, prefix hits.

Their names are re-exported here; nothing starts at import time.
"""

from pdlab.serve.measure import cpucost, evidence, hostcheck, ttft
from pdlab.serve.measure.cpucost import *  # noqa: F403 - the names listed in cpucost.__all__
from pdlab.serve.measure.evidence import *  # noqa: F403 - the names listed in evidence.__all__
from pdlab.serve.measure.hostcheck import *  # noqa: F403 - the names listed in hostcheck.__all__
from pdlab.serve.measure.ttft import *  # noqa: F403 - the names listed in ttft.__all__

__all__ = [*cpucost.__all__, *hostcheck.__all__, *ttft.__all__, *evidence.__all__]
